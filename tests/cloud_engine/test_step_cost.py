"""The step-cost model that sizes prefill chunks from a step-time target (cloud_engine.step_cost)."""

from __future__ import annotations

import pytest

from cloud_engine.step_cost import StepCostModel


def test_no_estimate_until_a_prefill_step_was_measured():
    model = StepCostModel(0.1)
    assert model.prefill_budget(8) is None
    model.record(num_decodes=8, num_prefill_tokens=0, seconds=0.04)  # 5 ms a decode
    assert model.prefill_budget(8) is None


def test_the_budget_fills_the_target_with_measured_costs():
    model = StepCostModel(0.1, min_chunk=4)
    model.record(num_decodes=10, num_prefill_tokens=0, seconds=0.05)  # 5 ms a decode
    model.record(num_decodes=10, num_prefill_tokens=100, seconds=0.25)  # (0.25 - 0.05) / 100 = 2 ms a token
    assert model.prefill_budget(10) == 25  # (0.1 - 0.05) / 0.002
    assert model.prefill_budget(0) == 50
    assert model.prefill_budget(30) == 4  # decodes alone overrun the target: the minimum chunk still runs


def test_costs_follow_the_machine_as_it_changes():
    model = StepCostModel(0.1)
    model.record(num_decodes=1, num_prefill_tokens=0, seconds=0.01)
    model.record(num_decodes=0, num_prefill_tokens=10, seconds=0.01)
    first = model.prefill_budget(0)
    for _ in range(30):  # the machine got 4x slower at prefill (a busy neighbour)
        model.record(num_decodes=0, num_prefill_tokens=10, seconds=0.04)
    assert model.prefill_budget(0) == pytest.approx(first / 4, rel=0.05)


@pytest.mark.parametrize("target, min_chunk", [(0.0, 16), (float("nan"), 16), (0.1, 0)])
def test_bad_settings_are_refused(target, min_chunk):
    with pytest.raises(ValueError):
        StepCostModel(target, min_chunk)
