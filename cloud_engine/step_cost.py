"""What a step costs, measured as the engine runs: the model that prefill pacing plans with.

A step's time is close to linear in four things, and a least-squares fit over recent steps
learns the four costs online:

    seconds ~ fixed + decodes x per_decode + prefill_tokens x per_token
              + prefill_context x per_context

`prefill_context` is the attention work of the step's prompt chunks: each new token attends
to every token before it, so a chunk of n tokens starting at position c adds n*c + n(n+1)/2.
That term is why a chunk deep in a 2,000-token prompt costs about three times as much per
token as the same chunk at its start on a CPU (measured: 0.7 ms against 2.4 ms a token), and
why a single per-token figure, fitted on one and used for the other, sized chunks badly.

Older steps fade (each new one weighs 1/FORGET_STEPS of the fit), so the costs follow the
machine when a neighbour starts or stops using it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FORGET_STEPS = 64  # about how many recent steps the fit remembers
MIN_PREFILL_STEPS = 3  # measured steps with prefill before the fit is trusted for chunk sizes
CONTEXT_SCALE = 1024.0  # keeps the context feature's magnitude near the others' (conditioning)


@dataclass(frozen=True)
class StepShape:
    """What a scheduled step holds, read before it runs."""

    num_decodes: int  # requests computing one token (plus a draft when speculating)
    num_prefill_tokens: int = 0  # prompt (or recompute) tokens
    prefill_context: int = 0  # sum over those tokens of the positions they attend to

    @staticmethod
    def chunk_context(num_computed: int, num_tokens: int) -> int:
        """Attention work of `num_tokens` prompt tokens that start after `num_computed` others."""
        return num_tokens * num_computed + num_tokens * (num_tokens + 1) // 2


class StepCostModel:
    """Measured step times -> the predicted cost of a step's decodes and of a prompt chunk."""

    def __init__(self, forget_steps: int = FORGET_STEPS):
        self._decay = 1.0 - 1.0 / forget_steps
        self._gram = np.zeros((4, 4))  # decayed sum of x x^T, x = features / seconds (relative error)
        self._moment = np.zeros(4)  # decayed sum of x (each row's target is 1 after that scaling)
        self._weights = np.zeros(4)  # fixed, per decode, per prefill token, per context token (scaled)
        self.num_prefill_steps = 0

    @property
    def ready(self) -> bool:
        """True once enough prefill steps were measured to size chunks from the fit."""
        return self.num_prefill_steps >= MIN_PREFILL_STEPS

    def record(self, shape: StepShape, seconds: float) -> None:
        """One finished step and how long it took."""
        if not (math.isfinite(seconds) and seconds >= 0):
            return
        # Weighted by 1/seconds^2, the fit minimizes relative error: a 1 s step would otherwise
        # outweigh a hundred 80 ms ones, and the small steps are the ones the target is about.
        x = _features(shape) / max(seconds, 1e-3)
        self._gram = self._decay * self._gram + np.outer(x, x)
        self._moment = self._decay * self._moment + x
        if shape.num_prefill_tokens:
            self.num_prefill_steps += 1
        # A small ridge keeps the solve defined while a feature has not varied yet (every step
        # so far with 16 decodes cannot tell the fixed cost from the per-decode one; the sum is
        # what predictions at 16 decodes need, and that the ridge keeps right).
        ridge = 1e-6 * (np.trace(self._gram) / 4 + 1e-12)
        weights = np.linalg.solve(self._gram + ridge * np.eye(4), self._moment)
        self._weights = np.maximum(weights, 0.0)  # a cost is never negative; noise can make a fit say so

    def decode_seconds(self, num_decodes: int) -> float:
        """Predicted time of a step with these decodes and no prefill."""
        fixed, per_decode = self._weights[0], self._weights[1]
        return float(fixed + per_decode * num_decodes)

    def chunk_seconds(self, num_computed: int, num_tokens: int) -> float:
        """Predicted extra time of `num_tokens` prompt tokens after `num_computed` in a step."""
        per_token, per_context = self._weights[2], self._weights[3] / CONTEXT_SCALE
        return float(per_token * num_tokens + per_context * StepShape.chunk_context(num_computed, num_tokens))

    def chunk_tokens(self, num_computed: int, seconds: float) -> int:
        """The most prompt tokens after `num_computed` that fit in `seconds` (the inverse of chunk_seconds)."""
        if seconds <= 0:
            return 0
        per_token, per_context = self._weights[2], self._weights[3] / CONTEXT_SCALE
        linear = per_token + per_context * (num_computed + 0.5)
        if per_context <= 0:
            return int(seconds / linear) if linear > 0 else 1 << 30
        # per_context/2 n^2 + linear n = seconds
        return int((-linear + math.sqrt(linear * linear + 2 * per_context * seconds)) / per_context)


def _features(shape: StepShape) -> np.ndarray:
    return np.array([1.0, shape.num_decodes, shape.num_prefill_tokens, shape.prefill_context / CONTEXT_SCALE])
