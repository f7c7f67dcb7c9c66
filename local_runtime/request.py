"""A request's life inside the local engine: sdk.engine_common.engine_request's shared state plus
its llama.cpp sequence slot and its own RNG."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sdk.engine_common.engine_request import EngineRequest
from sdk.protocol.request_status import RequestStatus  # noqa: F401  (re-exported)


@dataclass
class Request(EngineRequest):
    """Everything the scheduler and the step loop track for one generation."""

    slot: int | None = None  # llama.cpp sequence id while running

    def __post_init__(self) -> None:
        super().__post_init__()
        self.rng = np.random.default_rng(self.params.seed)
