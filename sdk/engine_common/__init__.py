"""The machinery both engines share, above the contracts (sdk.protocol) and below everything else.

- `async_step_engine`: the asyncio driver of an engine's step loop on its own thread;
  `engine_request`, `token_events`, `text_stream`, `detokenize`: a request's state as it decodes
  (stop strings, the text released so far, loops stopped by `repetition`);
- `grammar`, `grammar_closing`, `json_scan`: constrained decoding (llguidance masks, the closing
  path within max_tokens, a JSON object's keys);
- `chat_template`: chat messages rendered to a prompt; `model_files`: finding a model file;
  `gguf_header`: a GGUF file's metadata; `sampling_defaults`: the defaults a model file names.

The engines (local_runtime, cloud_engine) and the routing packages (router, confidence) may import
it; it imports only sdk.protocol (tests/test_layering.py).
"""
