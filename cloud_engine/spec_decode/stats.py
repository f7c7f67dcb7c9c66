"""Speculative decoding counters, with vLLM's meaning (spec_decode_num_drafts, ...)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    """Engine totals. acceptance rate = accepted / draft tokens; mean acceptance length =
    1 + accepted / drafts (tokens emitted per verified draft, the target's own included)."""

    num_drafts: int = 0  # verified drafts (one per request per step that carried one)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [i]: drafts whose token i was accepted

    def record(self, num_draft: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_position) < num_draft:
            self.accepted_per_position.extend([0] * (num_draft - len(self.accepted_per_position)))
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0
