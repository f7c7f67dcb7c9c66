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
    # A drafting request (the device drafting for the cloud): not scheduled once its output reaches this
    # many tokens, until LocalEngine.rewind moves it on. None: an ordinary request.
    hold_at: int | None = None

    @property
    def is_held(self) -> bool:
        """Waiting for its drafts' verdict: all its tokens computed but the last sampled one."""
        return (
            self.hold_at is not None
            and self.num_output_tokens >= self.hold_at
            and self.num_computed_tokens == self.num_tokens - 1
        )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.rng = np.random.default_rng(self.params.seed)
