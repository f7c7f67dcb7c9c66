"""The step-cost model that prefill pacing plans with (cloud_engine.step_cost)."""

from __future__ import annotations

import pytest

from cloud_engine.step_cost import StepCostModel, StepShape

# A machine whose steps cost: 20 ms fixed, 1.5 ms a decode, 0.7 ms a prompt token, and
# 0.9 us a token of attention context (the CPU figures the fit found in bench.chunked_prefill).
FIXED, PER_DECODE, PER_TOKEN, PER_CONTEXT = 0.020, 0.0015, 0.0007, 0.0000009


def true_seconds(shape: StepShape) -> float:
    return (
        FIXED
        + PER_DECODE * shape.num_decodes
        + PER_TOKEN * shape.num_prefill_tokens
        + PER_CONTEXT * shape.prefill_context
    )


def chunk(num_decodes: int, num_computed: int, num_tokens: int) -> StepShape:
    return StepShape(num_decodes, num_tokens, StepShape.chunk_context(num_computed, num_tokens))


def fitted(shapes: list[StepShape]) -> StepCostModel:
    model = StepCostModel()
    for shape in shapes:
        model.record(shape, true_seconds(shape))
    return model


def varied_steps() -> list[StepShape]:
    steps = []
    for i in range(40):
        steps.append(StepShape(8 + i % 9))  # decode-only steps at several batch sizes
        steps.append(chunk(4 + i % 13, (i * 97) % 1800, 16 + (i * 37) % 600))  # chunks at several depths
    return steps


def test_chunk_context_counts_what_each_new_token_attends_to():
    assert StepShape.chunk_context(0, 1) == 1
    assert StepShape.chunk_context(0, 3) == 1 + 2 + 3
    assert StepShape.chunk_context(100, 3) == 101 + 102 + 103


def test_the_fit_recovers_the_machines_costs():
    model = fitted(varied_steps())
    assert model.ready
    assert model.decode_seconds(16) == pytest.approx(FIXED + 16 * PER_DECODE, rel=0.02)
    # A chunk deep in a long prompt costs more per token than the same chunk at its start.
    shallow, deep = model.chunk_seconds(0, 32), model.chunk_seconds(1500, 32)
    assert shallow == pytest.approx(32 * PER_TOKEN + PER_CONTEXT * StepShape.chunk_context(0, 32), rel=0.02)
    assert deep == pytest.approx(32 * PER_TOKEN + PER_CONTEXT * StepShape.chunk_context(1500, 32), rel=0.02)
    assert deep > 2.5 * shallow


@pytest.mark.parametrize("num_computed", [0, 700, 1900])
def test_chunk_tokens_is_the_inverse_of_chunk_seconds(num_computed):
    model = fitted(varied_steps())
    for seconds in (0.01, 0.05, 0.4, 1.0):
        tokens = model.chunk_tokens(num_computed, seconds)
        assert model.chunk_seconds(num_computed, tokens) <= seconds < model.chunk_seconds(num_computed, tokens + 1)
    assert model.chunk_tokens(num_computed, 0.0) == 0


def test_not_ready_until_prefill_steps_were_measured():
    model = fitted([StepShape(16)] * 20)
    assert not model.ready  # decode-only steps say nothing about what a prompt token costs
    for shape in [chunk(16, 0, 64), chunk(16, 64, 64)]:
        model.record(shape, true_seconds(shape))
    assert not model.ready
    model.record(chunk(16, 128, 64), true_seconds(chunk(16, 128, 64)))
    assert model.ready


def test_costs_follow_the_machine_as_it_changes():
    steps = varied_steps()
    model = fitted(steps)
    before = model.chunk_seconds(500, 100)
    for shape in steps * 3:  # a busy neighbour: every step now takes 3x as long
        model.record(shape, 3 * true_seconds(shape))
    assert model.chunk_seconds(500, 100) == pytest.approx(3 * before, rel=0.1)


def test_nonsense_times_are_ignored():
    model = fitted(varied_steps())
    before = model.chunk_seconds(500, 100)
    for bad in (float("nan"), float("inf"), -1.0):
        model.record(chunk(16, 0, 64), bad)
    assert model.chunk_seconds(500, 100) == before
