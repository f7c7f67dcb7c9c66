"""Prefill chunks sized from a step-time target (Sarathi-Serve's idea: the decode-latency budget
sets the chunk), with the step's cost measured as the engine runs.

A step that carries prefill tokens beside the running decodes delays every decode's next
token by the prefill's cost. A fixed token budget (256 tokens) made such steps 9x slower than a
decode-only step on a CPU (0.39 s against 0.045 s), so p90 ITL was 8x worse whenever long
prompts arrived. Here each step's prefill allowance is what fits the target:

    prefill_tokens = (step_target_s - decodes x decode_cost_per_seq) / prefill_cost_per_token

never fewer than `min_chunk` (a long prompt always progresses). Both costs are exponential
moving averages of measured steps: decode-only steps give the per-sequence decode cost;
steps with prefill give the per-token prefill cost once their decodes are subtracted. Until a
cost has been measured, the allowance is the scheduler's own token budget (None).
"""

from __future__ import annotations

import math

EMA_WEIGHT = 0.2  # of the newest measurement


class StepCostModel:
    """Measured step costs -> the prefill tokens the next step may carry."""

    def __init__(self, step_target_s: float, min_chunk: int = 16):
        if not (math.isfinite(step_target_s) and step_target_s > 0):
            raise ValueError(f"the step-time target must be > 0 seconds, got {step_target_s!r}")
        if min_chunk < 1:
            raise ValueError(f"min_chunk must be >= 1, got {min_chunk}")
        self.step_target_s = step_target_s
        self.min_chunk = min_chunk
        self.decode_cost_per_seq: float | None = None  # seconds a decoding sequence adds to a step
        self.prefill_cost_per_token: float | None = None  # seconds a prefill token adds to a step

    def prefill_budget(self, num_decodes: int) -> int | None:
        """Prefill tokens the next step may carry beside `num_decodes` decodes (None: no estimate yet)."""
        if self.prefill_cost_per_token is None:
            return None
        decode_s = num_decodes * (self.decode_cost_per_seq or 0.0)
        room = (self.step_target_s - decode_s) / self.prefill_cost_per_token
        return max(self.min_chunk, int(room))

    def record(self, num_decodes: int, num_prefill_tokens: int, seconds: float) -> None:
        """One finished step: how many decodes and prefill tokens it ran, and how long it took."""
        if num_prefill_tokens == 0:
            if num_decodes:
                self.decode_cost_per_seq = _ema(self.decode_cost_per_seq, seconds / num_decodes)
            return
        decode_s = num_decodes * (self.decode_cost_per_seq or 0.0)
        per_token = max(seconds - decode_s, 0.0) / num_prefill_tokens
        if per_token > 0:
            self.prefill_cost_per_token = _ema(self.prefill_cost_per_token, per_token)


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - EMA_WEIGHT) * old + EMA_WEIGHT * new
