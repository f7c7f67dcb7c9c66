"""The contracts every tandem engine implements or consumes; the bottom layer of the tree.

- `engine`: `EngineProtocol` (submit, stream token events, abort) and the types that cross it
  (`SamplingParams`, `GenerationRequest`, `TokenEvent`, `EngineStats`, the engine errors).
- `token_events`, `request_status`, `text_stream`: what both engines' step loops share when
  they turn sampled tokens into events, finish states and incremental text.
- `async_step_engine`: the thread-backed async driver around a synchronous step() engine.
- `openai_schema`: the one OpenAI request/response schema; `chat_template`: rendering chats.
- `api_keys`: key files, bearer tokens, fingerprints; `model_files`: where the embedded GGUF is.

Everything here imports only the standard library, third-party packages and this package,
so `local_runtime`, `cloud_engine`, `router` and `confidence` can depend on it and nothing
above. The engine protocol's names are re-exported here (`from sdk.protocol import SamplingParams`).
"""

from sdk.protocol.engine import (
    ContextLengthError,
    EngineError,
    EngineNotReadyError,
    EngineOverloadedError,
    EngineProtocol,
    EngineStats,
    GenerationRequest,
    InvalidRequestError,
    SamplingParams,
    TokenEvent,
    TopLogprob,
)

__all__ = [
    "ContextLengthError",
    "EngineError",
    "EngineNotReadyError",
    "EngineOverloadedError",
    "EngineProtocol",
    "EngineStats",
    "GenerationRequest",
    "InvalidRequestError",
    "SamplingParams",
    "TokenEvent",
    "TopLogprob",
]
