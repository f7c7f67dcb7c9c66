"""A draft another model made for a request an engine is generating (the device's model drafting
for the cloud's, issue 56): what the caller sends and the verifying engine takes
(cloud_engine.spec_decode.outside_drafts verifies it; tandem.v1's GenerateWithDrafts carries it),
and the bounds both sides agree on: a server refuses a draft past them (sdk.serving.grpc.service),
and the device's drafter (sdk.cascade.device_drafts) stays within their defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass

PROBABILITY_SLACK = 1e-3  # a support's probabilities may sum this far past 1 (float rounding on the device)
# Tokens of one draft an engine verifies: the device drafts at most this many a round (its acceptance rarely
# pays past it), and an engine's own proposer at most this many (SpeculativeConfig.num_speculative_tokens).
MAX_DRAFT_TOKENS = 16
MAX_SUPPORT_TOKENS = 64  # token ids per draft token's support: the device samples from its own top-64
DRAFTS_PER_SECOND = 100.0  # draft messages one request may send a second (a burst of as many)
# Draft messages of one request the engine has not taken yet. It keeps only the latest (memory: one draft a
# request), so this bounds how far a caller runs ahead of a stalled engine: at the device's 50 a second, 5 s.
MAX_DRAFTS_OUTSTANDING = 256


def most_verified_draft_tokens(max_tokens: int, max_draft_tokens: int) -> int:
    """The most draft tokens an engine verifies for a request of `max_tokens`: each step that verifies a draft
    emits at least one token and verifies at most min(max_draft_tokens, the tokens left - 1), so at worst
    sum(min(max_draft_tokens, j) for j in range(max_tokens)) (what a budget reserves for a drafted request)."""
    n, cap = max(0, max_tokens), max(0, max_draft_tokens)
    if n - 1 <= cap:
        return n * (n - 1) // 2 if n else 0
    return cap * (cap + 1) // 2 + (n - 1 - cap) * cap


@dataclass(frozen=True)
class DraftLimits:
    """What a server takes of one request's drafts at its door, beside the engine's own `max_draft_tokens`;
    each is a [cloud_server] setting of `tandem cloud serve` (sdk.settings.server_sections)."""

    max_support: int = MAX_SUPPORT_TOKENS  # token ids in one draft token's support
    per_second: float = DRAFTS_PER_SECOND  # draft messages a second per request (bursts of as many)
    max_outstanding: int = MAX_DRAFTS_OUTSTANDING  # draft messages the engine has not taken yet, per request

    def __post_init__(self) -> None:
        if self.max_support < 1:
            raise ValueError(f"draft_max_support must be >= 1, got {self.max_support}")
        if not (math.isfinite(self.per_second) and self.per_second >= 1):
            raise ValueError(f"drafts_per_second must be >= 1, got {self.per_second}")
        if self.max_outstanding < 1:
            raise ValueError(f"drafts_max_outstanding must be >= 1, got {self.max_outstanding}")

    def max_message_bytes(self, max_tokens: int) -> int:
        """The most bytes a draft message within these bounds and `max_tokens` takes on the wire, so a longer
        one is refused before it is parsed. Protobuf, written either way a writer may: each id a tag and a
        varint of at most 5 bytes, each probability a tag and 4 bytes, each support's tags and lengths 8 bytes,
        64 for the start and the envelopes."""
        return 64 + max_tokens * (6 + 8 + self.max_support * (6 + 5))


@dataclass(frozen=True)
class OutsideDraft:
    request_id: str
    start: int  # the request's output tokens this draft follows
    token_ids: tuple[int, ...]
    # Per draft token: (token ids, probabilities) of the distribution it was drawn from; None: one-hot.
    support: tuple[tuple[tuple[int, ...], tuple[float, ...]], ...] | None = None

    def check(self, vocab_size: int, max_tokens: int | None = None, max_support: int | None = None) -> None:
        """ValueError naming what is wrong with a draft that can never be verified, or one past the bounds
        given (`max_tokens` tokens, `max_support` ids in a token's support)."""
        if self.start < 0:
            raise ValueError(f"a draft's start must be >= 0, got {self.start}")
        if not self.token_ids:
            raise ValueError("a draft needs at least one token")
        if max_tokens is not None and len(self.token_ids) > max_tokens:
            raise ValueError(f"a draft of {len(self.token_ids)} tokens is longer than the {max_tokens} verified")
        for token in self.token_ids:
            if not 0 <= token < vocab_size:
                raise ValueError(f"draft token {token} is outside the vocabulary (0..{vocab_size - 1})")
        if self.support is None:
            return
        if len(self.support) != len(self.token_ids):
            raise ValueError(f"a draft of {len(self.token_ids)} tokens needs as many supports, got {len(self.support)}")
        for index, (token, (ids, probs)) in enumerate(zip(self.token_ids, self.support)):
            if max_support is not None and len(ids) > max_support:
                raise ValueError(f"support[{index}] has {len(ids)} token ids, more than the {max_support} taken")
            if len(ids) != len(probs) or not ids:
                raise ValueError(f"support[{index}] needs as many probabilities as token ids, and at least one")
            if any(not 0 <= i < vocab_size for i in ids) or len(set(ids)) != len(ids):
                raise ValueError(f"support[{index}] has a token id outside the vocabulary, or one twice")
            if any(not (math.isfinite(p) and 0.0 <= p <= 1.0) for p in probs):
                raise ValueError(f"support[{index}] has a probability outside [0, 1]")
            if sum(probs) > 1.0 + PROBABILITY_SLACK:
                raise ValueError(f"support[{index}]'s probabilities sum to {sum(probs):.6f} > 1")
            if token not in ids or probs[ids.index(token)] <= 0.0:
                raise ValueError(f"draft token {index} ({token}) has no probability in its own support")
