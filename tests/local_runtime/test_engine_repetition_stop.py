"""The local engine stops an answer caught in a loop exactly where the rule fires (real model),
and leaves it alone under ignore_eos, a request's opt-out, or an engine configured off."""

from __future__ import annotations

import pytest

from sdk.engine_common.repetition import STOP_LOOP, find_loop
from tests.local_runtime.conftest import assert_no_blocks_held, greedy, make_engine, run_to_completion

pytestmark = pytest.mark.slow

# Greedy SmolLM2 loops on the first of these (a refrain of ~35 tokens, stopped near token 133
# on the machine this was written on); the others are there in case another CPU's kernels
# take the first one elsewhere: the test needs one looping answer, whichever it is.
LOOPING_PROMPTS = (
    "Write a poem about the sea.",
    "Tell me about the island of the moon.",
    "Describe your favourite city.",
)
MAX_TOKENS = 400
# Answers are compared run against run: batch-invariant mode, so the default engine's prompt
# cache cannot move a later run's cells (and kernels) away from the first's.
ENGINE_OVERRIDES = dict(batch_invariant=True)


@pytest.fixture(scope="module")
def looping(engine):
    """(prompt ids, the whole greedy answer with the stop off, where STOP_LOOP fires in it)."""
    for text in LOOPING_PROMPTS:
        prompt = engine.apply_chat_template([{"role": "user", "content": text}])
        events = run_to_completion(engine, [greedy("off", prompt, MAX_TOKENS, repetition_stop=False)])["off"]
        tokens = [event.token_id for event in events]
        found = find_loop(tokens, STOP_LOOP)
        if found is not None:
            return prompt, tokens, found[0]
    pytest.fail(f"none of {LOOPING_PROMPTS} loops greedily within {MAX_TOKENS} tokens here")


def test_loop_stops_where_the_rule_fires(engine, looping):
    prompt, tokens, stop_at = looping
    events = run_to_completion(engine, [greedy("on", prompt, MAX_TOKENS)])["on"]  # unset: the engine's default (on)
    assert [event.token_id for event in events] == tokens[:stop_at]
    last = events[-1]
    assert (last.finish_reason, last.stop_reason) == ("length", "repetition")
    assert all(event.stop_reason is None for event in events[:-1])
    assert_no_blocks_held(engine)  # the stopped request's blocks are back


def test_ignore_eos_and_a_request_opt_out_keep_the_loop(engine, looping):
    prompt, tokens, _ = looping
    # One at a time: a lone decode may take another kernel than a batched one (batch_invariant
    # covers prefill), and the opt-out answer is compared token for token with the fixture's.
    runs = {
        request.request_id: run_to_completion(engine, [request])[request.request_id]
        for request in (
            greedy("eos", prompt, MAX_TOKENS, ignore_eos=True, repetition_stop=True),
            greedy("opt-out", prompt, MAX_TOKENS, repetition_stop=False),
        )
    }
    for events in runs.values():
        assert len(events) >= len(tokens) and events[-1].stop_reason is None
    assert [event.token_id for event in runs["opt-out"]] == tokens


def test_an_engine_configured_off_stops_only_requests_that_ask(looping):
    prompt, tokens, stop_at = looping
    engine = make_engine(repetition_stop=False, batch_invariant=True)
    try:
        runs = {
            request.request_id: run_to_completion(engine, [request])[request.request_id]
            for request in (
                greedy("default", prompt, MAX_TOKENS),
                greedy("asks", prompt, MAX_TOKENS, repetition_stop=True),
            )
        }
        assert [event.token_id for event in runs["default"]] == tokens
        assert len(runs["asks"]) == stop_at and runs["asks"][-1].stop_reason == "repetition"
    finally:
        engine.close()
