"""tandem's cloud tier: a PyTorch serving engine with a paged KV cache, a token-budget
scheduler with chunked prefill, prefix caching and continuous batching.

Public entry points (imported lazily so `import cloud_engine` stays cheap):
`LLM` (offline batches), `AsyncCloudEngine` (the engine behind the gRPC service and
the hosted API), `CloudEngineConfig`.
"""

from __future__ import annotations

__all__ = ["LLM", "AsyncCloudEngine", "CloudEngine", "CloudEngineConfig"]


def __getattr__(name: str):
    if name == "LLM":
        from cloud_engine.llm import LLM

        return LLM
    if name == "AsyncCloudEngine":
        from cloud_engine.async_engine import AsyncCloudEngine

        return AsyncCloudEngine
    if name == "CloudEngine":
        from cloud_engine.engine import CloudEngine

        return CloudEngine
    if name == "CloudEngineConfig":
        from cloud_engine.config import CloudEngineConfig

        return CloudEngineConfig
    raise AttributeError(name)
