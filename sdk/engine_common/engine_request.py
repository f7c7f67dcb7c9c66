"""The request state both engines share: its tokens, with one mutator, and its stop trackers.

vLLM's v1 Request keeps the prompt + output ids in one list that only
`append_output_token` grows, so the step loop reads `all_token_ids` without building a
new list per access (that cost grew with every token, for every running request, every
step). Each engine's Request subclasses this with its own scheduling fields.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sdk.protocol.engine import SamplingParams
from sdk.protocol.request_status import FINISH_REASONS, RequestStatus
from sdk.engine_common.text_stream import TextStream
from sdk.engine_common.token_events import new_repetition_tracker


@dataclass
class EngineRequest:
    """Token lists, progress and status of one generation inside an engine."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)  # read it; grow it with append_output_token
    num_computed_tokens: int = 0  # catches up with num_tokens; the request samples when they are equal
    status: RequestStatus = RequestStatus.WAITING
    arrival_time: float = field(default_factory=time.monotonic)
    num_cached_tokens: int = 0  # prompt tokens taken from the prefix cache at the latest admission
    matcher: object | None = None  # llguidance.LLMatcher of a structured request (sdk.engine_common.grammar)
    # Speculative decoding's running totals (zero on an engine that does not speculate): every event carries them.
    num_draft_tokens: int = 0  # drafted tokens the target verified
    num_accepted_tokens: int = 0  # of those, accepted

    def __post_init__(self) -> None:
        self.text_stream = TextStream(self.params.stop)
        self.repetition = new_repetition_tracker(self.params)  # check_stop's loop test; None when off
        self.stop_reason: str | None = None  # "repetition" (a loop stopped) or "closed_within_max_tokens" (check_stop)
        self._all_token_ids = list(self.prompt_token_ids) + list(self.output_token_ids)

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

    def tokens_left(self, max_model_len: int) -> int:
        """Tokens the request may still generate, its end token included: max_tokens or the context."""
        return min(self.params.max_tokens - self.num_output_tokens, max_model_len - self.num_tokens)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)
