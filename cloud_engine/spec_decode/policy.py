"""The adaptive speculation policy: how many draft tokens each decoding request gets this step.

Verification is nearly free only while a step is bound by reading the weights, i.e. at small
batch; at large batch every drafted token competes for compute with other requests' real
tokens, so drafting stops above `max_batch_for_speculation`. At batch 1 here a 9-token
step costs 1.4-1.6x a 1-token step, so a request keeps the full k while its drafts pay:
shrinking k to the last accepted length + 1 after each rejection measured slower on
copy-heavy prompts (runs resume after a one-token edit). A request whose drafts keep fewer
accepted tokens (smoothed) than `min_accepted_tokens` stops drafting and re-probes with one
token every PROBE_INTERVAL steps, so a poor draft costs little and a request whose text turns
predictable again is noticed. (A floor on the acceptance *rate* instead paused good copy
runs at k = 8: 2 of 8 accepted is a low rate but still a gain.) k never exceeds what the
request may still emit (max_tokens) or hold (max_model_len). With adaptive off every decoding
request drafts the full k."""

from __future__ import annotations

from dataclasses import dataclass

from cloud_engine.request import Request
from cloud_engine.spec_decode.config import SpeculativeConfig

_SMOOTHING = 0.5  # weight of the latest verification in a request's accepted-token average
PROBE_INTERVAL = 8  # steps between one-token probes of a request below the acceptance floor


@dataclass
class _RequestState:
    accepted: float | None = None  # smoothed accepted tokens per draft; None before the first verification
    idle_steps: int = 0  # steps without drafting while below the acceptance floor


class SpeculationPolicy:
    def __init__(self, config: SpeculativeConfig, max_model_len: int):
        self.config = config
        self.max_model_len = max_model_len
        self._state: dict[str, _RequestState] = {}

    def num_draft_tokens(self, decoding: list[Request]) -> dict[str, int]:
        """k per request id (requests that should not draft this step are left out)."""
        config = self.config
        if config.adaptive and len(decoding) > config.max_batch_for_speculation:
            return {}
        plan = {}
        for request in decoding:
            if request.params.uses_token_history or request.params.logit_bias:
                continue  # penalties and bias would make the draft distribution inexact: no drafts
            # A grammar mask does not: drafts are cut to the prefix the grammar accepts, and each
            # verified row is masked by the grammar's state after the draft tokens before it.
            room = request.tokens_left(self.max_model_len) - 1
            k = config.num_speculative_tokens
            if config.adaptive:
                state = self._state.setdefault(request.request_id, _RequestState())
                if state.accepted is not None and state.accepted < config.min_accepted_tokens:
                    state.idle_steps += 1
                    if state.idle_steps < PROBE_INTERVAL:
                        continue
                    state.idle_steps, k = 0, 1
            k = min(k, room)
            if k > 0:
                plan[request.request_id] = k
        return plan

    def record(self, request_id: str, num_draft: int, num_accepted: int) -> None:
        state = self._state.setdefault(request_id, _RequestState())
        previous = state.accepted
        state.accepted = num_accepted if previous is None else (1 - _SMOOTHING) * previous + _SMOOTHING * num_accepted

    def free(self, request_id: str) -> None:
        self._state.pop(request_id, None)
