"""Prefill paced by step time: most steps under the target, a bounded share up to the maximum
(cloud_engine.prefill_pacing)."""

from __future__ import annotations

import pytest

from cloud_engine.prefill_pacing import PrefillPacer, TimedAllowance, step_shape
from cloud_engine.scheduler import SchedulerOutput, TokenAllowance
from cloud_engine.step_cost import StepShape
from tests.cloud_engine.test_step_cost import true_seconds, varied_steps

TARGET, MAX = 0.080, 1.0


def trained_pacer(slow_share: float = 0.1, min_chunk: int = 4) -> PrefillPacer:
    pacer = PrefillPacer(TARGET, MAX, slow_share, min_chunk)
    for shape in varied_steps():
        pacer.cost.record(shape, true_seconds(shape))
    return pacer


def run_step(pacer: PrefillPacer, num_decodes: int, num_computed: int, wanted: int) -> tuple[int, float]:
    """One step of a prompt at `num_computed` beside `num_decodes` decodes: tokens granted, its time."""
    allowance = pacer.allowance(num_decodes)
    granted = allowance.grant(num_computed, wanted) if allowance is not None else wanted
    shape = StepShape(num_decodes, granted, StepShape.chunk_context(num_computed, granted))
    seconds = true_seconds(shape)
    pacer.record(shape, seconds, allowance)
    return granted, seconds


def test_with_no_decodes_running_a_step_takes_the_whole_token_budget():
    assert trained_pacer().allowance(0) is None


def test_small_chunks_until_the_costs_are_measured():
    allowance = PrefillPacer(TARGET, MAX, min_chunk=8).allowance(16)
    assert isinstance(allowance, TokenAllowance)
    assert allowance.grant(0, 500) == 8


def test_a_step_under_the_target_fills_it():
    pacer = trained_pacer(slow_share=0.0)  # no long steps at all
    for depth in (0, 1500):
        allowance = pacer.allowance(16)
        granted = allowance.grant(depth, 5000)
        assert true_seconds(StepShape(16, granted, StepShape.chunk_context(depth, granted))) == pytest.approx(
            TARGET, rel=0.05
        )
        assert not allowance.past_target


def test_a_long_step_fits_the_maximum_and_is_counted():
    pacer = trained_pacer()
    granted, seconds = run_step(pacer, 16, 200, 5000)
    assert seconds == pytest.approx(MAX, rel=0.05)
    assert pacer.num_slow_steps_total == 1


def test_long_steps_never_run_back_to_back():
    pacer = trained_pacer(slow_share=1.0)  # credits are never short here
    times = [run_step(pacer, 16, 0, 5000)[1] for _ in range(6)]
    assert [t > 2 * TARGET for t in times] == [True, False, True, False, True, False]


@pytest.mark.parametrize("slow_share", [0.0, 0.05, 0.1, 0.25])
def test_over_n_steps_at_most_two_plus_share_times_n_run_past_the_target(slow_share):
    pacer = trained_pacer(slow_share)
    num_steps = 200
    times = [run_step(pacer, 16, 100, 5000)[1] for _ in range(num_steps)]  # a prompt always waiting
    num_slow = sum(t > TARGET * 1.05 for t in times)
    assert num_slow == pacer.num_slow_steps_total
    assert num_slow <= 2 + slow_share * num_steps
    assert num_slow >= slow_share * num_steps - 1  # and the share is used when a prompt waits


def test_a_prompt_that_fits_under_the_target_spends_no_credit():
    pacer = trained_pacer()
    credits = pacer.credits
    granted, _ = run_step(pacer, 16, 0, 10)
    assert granted == 10 and pacer.num_slow_steps_total == 0 and pacer.credits >= credits


def test_the_minimum_chunk_runs_when_the_decodes_alone_fill_the_target():
    pacer = trained_pacer(slow_share=0.0, min_chunk=4)
    allowance = pacer.allowance(64)  # 20 ms + 64 x 1.5 ms: over the 80 ms target before any prompt
    assert isinstance(allowance, TimedAllowance)
    assert allowance.grant(0, 500) == 4
    assert allowance.grant(4, 500) == 0  # the floor is for the step's first chunk, not each


def test_step_shape_reads_decodes_drafts_and_chunk_depths():
    class Req:
        def __init__(self, num_computed):
            self.num_computed_tokens = num_computed

    out = SchedulerOutput(num_scheduled_tokens={"d": 1, "s": 4, "p": 10}, scheduled_spec_token_ids={"s": [7, 8, 9]})
    shape = step_shape(out, {"d": Req(50), "s": Req(60), "p": Req(100)})
    assert shape == StepShape(2, 10, StepShape.chunk_context(100, 10))


@pytest.mark.parametrize(
    "args",
    [(0.0, 1.0, 0.05, 4), (float("nan"), 1.0, 0.05, 4), (0.1, 0.05, 0.05, 4), (0.1, 1.0, 1.5, 4), (0.1, 1.0, 0.05, 0)],
)
def test_bad_settings_are_refused(args):
    with pytest.raises(ValueError):
        PrefillPacer(*args)
