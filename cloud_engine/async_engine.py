"""The asyncio face of the cloud engine: `CloudEngine` driven by the shared step-engine thread.

This is what the gRPC server and the hosted OpenAI API use: submit, an async iterator
of token events, cancel (which frees the request's blocks at once).
"""

from __future__ import annotations

from cloud_engine.config import CloudEngineConfig
from cloud_engine.engine import CloudEngine
from sdk.engine_common.async_step_engine import AsyncStepEngine


class AsyncCloudEngine(AsyncStepEngine):
    """Implements sdk.protocol.engine.EngineProtocol over CloudEngine."""

    def __init__(self, config: CloudEngineConfig):
        self.config = config
        super().__init__(
            load=lambda: CloudEngine(config),
            model_name=config.model_name or "tandem-cloud",
            max_in_flight=config.max_waiting + config.max_num_seqs,
            max_model_len=config.max_model_len or 0,
            thread_name="tandem-cloud-engine",
        )
