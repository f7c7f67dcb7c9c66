"""The adaptive speculation policy: how many draft tokens each decoding request gets this step.

Verification is nearly free only while a step is bound by reading the weights, i.e. at small
batch; at large batch every drafted token competes for compute with other requests' real
tokens, so drafting stops above `max_batch_for_speculation`. A request whose drafts keep
being rejected (its acceptance rate, smoothed, below `min_acceptance_rate`) drafts one token
only: cheap, and it notices when its text turns predictable again. k never exceeds what the
request may still emit (max_tokens) or hold (max_model_len)."""

from __future__ import annotations

from cloud_engine.request import Request
from cloud_engine.spec_decode.config import SpeculativeConfig

_SMOOTHING = 0.5  # weight of the latest step in a request's acceptance rate


class SpeculationPolicy:
    def __init__(self, config: SpeculativeConfig, max_model_len: int):
        self.config = config
        self.max_model_len = max_model_len
        self._rate: dict[str, float] = {}

    def num_draft_tokens(self, decoding: list[Request]) -> dict[str, int]:
        """k per request id (requests that should not draft are left out)."""
        config = self.config
        if config.adaptive and len(decoding) > config.max_batch_for_speculation:
            return {}
        plan = {}
        for request in decoding:
            room = min(request.params.max_tokens - request.num_output_tokens - 1, self.max_model_len - request.num_tokens - 1)
            k = config.num_speculative_tokens
            if config.adaptive and self._rate.get(request.request_id, 1.0) < config.min_acceptance_rate:
                k = 1
            k = min(k, room)
            if k > 0:
                plan[request.request_id] = k
        return plan

    def record(self, request_id: str, num_draft: int, num_accepted: int) -> None:
        rate = num_accepted / num_draft
        previous = self._rate.get(request_id)
        self._rate[request_id] = rate if previous is None else (1 - _SMOOTHING) * previous + _SMOOTHING * rate

    def free(self, request_id: str) -> None:
        self._rate.pop(request_id, None)
