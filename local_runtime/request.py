"""A request's life inside the local engine: its tokens, progress and status."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from sdk.protocol.engine import SamplingParams
from sdk.protocol.request_status import FINISH_REASONS, RequestStatus  # noqa: F401  (re-exported)
from sdk.protocol.text_stream import TextStream
from sdk.protocol.token_events import new_repetition_tracker


@dataclass
class Request:
    """Everything the scheduler and the step loop track for one generation."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # catches up with num_tokens; sample when equal
    status: RequestStatus = RequestStatus.WAITING
    slot: int | None = None  # llama.cpp sequence id while running
    arrival_time: float = field(default_factory=time.monotonic)
    num_cached_tokens: int = 0  # prompt tokens taken from the prefix cache at admission

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.params.seed)
        self.text_stream = TextStream(self.params.stop)
        self.repetition = new_repetition_tracker(self.params)  # check_stop's loop test; None when off
        self.stop_reason: str | None = None  # "repetition" once check_stop stopped a loop
        self.matcher = None  # llguidance.LLMatcher of a structured request (local_runtime.grammar); None otherwise

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)
