"""The asyncio face of the local engine: `LocalEngine` driven by the shared step-engine thread."""

from __future__ import annotations

from local_runtime.config import LocalEngineConfig
from local_runtime.engine import LocalEngine
from sdk.engine_common.model_files import model_name_for, resolve_model_path
from sdk.engine_common.async_step_engine import AsyncStepEngine


class AsyncLocalEngine(AsyncStepEngine):
    """Implements sdk.protocol.engine.EngineProtocol over LocalEngine."""

    def __init__(self, config: LocalEngineConfig):
        self.config = config
        super().__init__(
            load=lambda: LocalEngine(config),
            model_name=config.model_name or model_name_for(config.model_path),
            max_in_flight=config.max_waiting + config.max_num_seqs,
            max_model_len=config.max_model_len or 0,
            thread_name="tandem-local-engine",
        )

    @property
    def model_path(self) -> str:
        """The GGUF it runs: the configured file or the embedded default."""
        return resolve_model_path(self.config.model_path)
