"""Model code for the cloud engine: configs, the Llama family, rotary embeddings, the architecture registry."""
