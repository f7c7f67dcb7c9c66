"""How much prompt a step may prefill beside running decodes: chunks paced by a step-time target.

A step that carries prompt tokens delays every running decode's next token by what the prompt
costs. Sarathi-Serve sizes chunks from that decode-latency budget; here it is two budgets,
shaped like the ITL percentiles an operator states:

- most steps stay under `target_s` (`step_time_target_ms`): the chunk is what fits beside
  the step's decodes by the measured costs (cloud_engine.step_cost);
- a share of steps (`slow_share`) may run up to `max_s` (`step_time_max_ms`), so a long
  prompt gets a large chunk now and then. Chunks that fit under the target alone give a
  prompt about half the machine when decodes use the other half, which on this CPU doubled
  a long prompt's time to first token; a few long steps win that back while leaving the
  typical inter-token latency at the target.

The share is kept with credits, as a token bucket: every step with decodes earns
`slow_share`, a step granted past the target spends 1, and the bucket holds at most
SLOW_STEP_BURST credits, so over any N steps with decodes at most 2 + slow_share * N run past
the target: a prompt that needs two long steps gets them one fast step apart, not one long
step now and the next after 1 / slow_share steps. Two long steps never run back to back, so
a stream waits at most `max_s` between two tokens.
With no decodes running nobody waits for a token, and the step takes the scheduler's whole
token budget. Every step with decodes still prefills at least `min_chunk` tokens, so a
prompt always progresses when the decodes alone fill the target.
"""

from __future__ import annotations

import math

from cloud_engine.request import Request
from cloud_engine.scheduler import PrefillAllowance, SchedulerOutput, TokenAllowance
from cloud_engine.step_cost import StepCostModel, StepShape

SLOW_STEP_BURST = 2.0  # credits the bucket holds: long steps that may run back to back


class TimedAllowance:
    """Prefill seconds for one step, spent in tokens as the scheduler hands out chunks."""

    def __init__(self, cost: StepCostModel, target_s: float, max_s: float, min_chunk: int):
        self.cost = cost
        self.target_left = target_s  # seconds of prefill under the target
        self.seconds_left = max(target_s, max_s)  # seconds of prefill this step may carry at most
        self.min_chunk = min_chunk
        self.num_granted = 0
        self.past_target = False  # True once a grant needed more than the target left room for

    def grant(self, num_computed: int, wanted: int) -> int:
        if wanted <= 0 or (self.seconds_left <= 0 and self.num_granted > 0):
            return 0
        under_target = self.cost.chunk_tokens(num_computed, self.target_left)
        num = min(wanted, self.cost.chunk_tokens(num_computed, self.seconds_left))
        if self.num_granted == 0:
            floor = min(wanted, self.min_chunk)  # progress even when the decodes fill the target
            under_target, num = max(under_target, floor), max(num, floor)
        if num > under_target:
            self.past_target = True
        seconds = self.cost.chunk_seconds(num_computed, num)
        self.target_left -= seconds
        self.seconds_left -= seconds
        self.num_granted += num
        return num


class PrefillPacer:
    """Measures steps and hands the scheduler each step's prefill allowance."""

    def __init__(self, target_s: float, max_s: float | None = None, slow_share: float = 0.05, min_chunk: int = 4):
        max_s = target_s if max_s is None else max_s
        checks = [
            (math.isfinite(target_s) and target_s > 0, f"the step-time target must be > 0 seconds, got {target_s!r}"),
            (
                math.isfinite(max_s) and max_s >= target_s,
                f"the step-time maximum ({max_s!r} s) must be >= the target ({target_s!r} s)",
            ),
            (0.0 <= slow_share <= 1.0, f"the share of steps past the target must be in [0, 1], got {slow_share!r}"),
            (min_chunk >= 1, f"min_chunk must be >= 1, got {min_chunk}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        self.target_s, self.max_s, self.slow_share, self.min_chunk = target_s, max_s, slow_share, min_chunk
        self.cost = StepCostModel()
        # A long prompt that arrives first may take its long steps at once (share 0: never any).
        self.credits = SLOW_STEP_BURST if slow_share > 0 else 0.0
        self.num_slow_steps_total = 0  # steps granted past the target
        self._last_was_slow = False

    def allowance(self, num_decodes: int) -> PrefillAllowance | None:
        """The next step's prefill allowance beside `num_decodes` decodes (None: the token budget)."""
        if num_decodes == 0:
            return None
        if not self.cost.ready:
            return TokenAllowance(self.min_chunk)  # small steps until their costs are measured
        decode_s = self.cost.decode_seconds(num_decodes)
        # Never two long steps in a row: a stream waits at most one of them between two tokens.
        max_s = self.max_s if self.credits >= 1.0 and not self._last_was_slow else self.target_s
        return TimedAllowance(self.cost, self.target_s - decode_s, max_s - decode_s, self.min_chunk)

    def record(self, shape: StepShape, seconds: float, allowance: PrefillAllowance | None) -> None:
        """One finished step: its shape, its time and the allowance it was given."""
        self.cost.record(shape, seconds)
        if shape.num_decodes == 0:
            return
        self.credits = min(SLOW_STEP_BURST, self.credits + self.slow_share)
        self._last_was_slow = isinstance(allowance, TimedAllowance) and allowance.past_target
        if self._last_was_slow:
            self.credits -= 1.0
            self.num_slow_steps_total += 1


def step_shape(out: SchedulerOutput, requests: dict[str, Request]) -> StepShape:
    """A scheduled step's decodes and prompt work, read before it runs (computed counts not yet advanced).
    A request with one new token, plus its draft when speculating, decodes; the others prefill."""
    decodes = prefill = context = 0
    for rid, num in out.num_scheduled_tokens.items():
        if num - len(out.scheduled_spec_token_ids.get(rid, ())) <= 1:
            decodes += 1
        else:
            prefill += num
            context += StepShape.chunk_context(requests[rid].num_computed_tokens, num)
    return StepShape(decodes, prefill, context)
