"""A request's life inside the cloud engine: its tokens, progress, blocks' hashes and status."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sdk.protocol.engine import SamplingParams
from sdk.protocol.request_status import FINISH_REASONS, RequestStatus
from sdk.protocol.text_stream import TextStream
from sdk.protocol.token_events import new_repetition_tracker

if TYPE_CHECKING:
    from cloud_engine.block_pool import BlockHash


@dataclass
class Request:
    """Everything the scheduler, the KV cache manager and the step loop track for one generation."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0  # lower value = more important; ties broken by arrival (FCFS)
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # catches up with num_tokens; the request samples when they are equal
    status: RequestStatus = RequestStatus.WAITING
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at the latest admission
    num_preemptions: int = 0
    # Prefix-cache keys of the request's full blocks, each chained over the one before (see
    # block_pool.hash_block); the KV cache manager extends it as blocks fill.
    block_hashes: list[BlockHash] = field(default_factory=list)
    # Speculative decoding: the proposer's draft for the next step (the scheduler moves it
    # into SchedulerOutput.scheduled_spec_token_ids), and this request's running totals.
    spec_token_ids: list[int] = field(default_factory=list)
    num_draft_tokens: int = 0  # drafted tokens the target verified
    num_accepted_tokens: int = 0  # of those, accepted
    matcher: object | None = None  # llguidance.LLMatcher of a structured request (sdk.protocol.grammar)
    forced: list[bool] = field(default_factory=list)  # per token emitted this step: the grammar allowed that one only

    def __post_init__(self) -> None:
        self.text_stream = TextStream(self.params.stop)
        self.repetition = new_repetition_tracker(self.params)  # check_stop's loop test; None when off
        self.stop_reason: str | None = None  # "repetition" once check_stop stopped a loop
        self._all_token_ids = list(self.prompt_token_ids)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)

    def truncate_output(self, num_output_tokens: int) -> None:
        """Drop output tokens past the first `num_output_tokens` (an accepted speculative run
        that went on past a stop string)."""
        extra = self.num_output_tokens - num_output_tokens
        if extra > 0:
            del self.output_token_ids[num_output_tokens:]
            del self._all_token_ids[-extra:]

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then output tokens (a live list: do not mutate)."""
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)
