"""Text embeddings tandem serves beside chat (POST /v1/embeddings): all-MiniLM-L6-v2, the
model the prompt router already ships, as sentence-transformers computes it.

`sdk.embeddings.model.EmbeddingModel` runs it (onnxruntime); `sdk.embeddings.service.EmbeddingService`
loads it on first use for a server. Nothing heavy is imported here."""
