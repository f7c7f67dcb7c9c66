"""A drafting request on the local engine (the device drafting for the cloud, issue 56): held once it
has drafted, rewound to what the verifier kept plus the verifier's own tokens, and drafting on from
there exactly as a request that had always had that output: the same next tokens, its books and its
slot's cells matching, stale blocks never found by another request, nothing left after it ends."""

from __future__ import annotations

import json

import pytest

from sdk.protocol.engine import GenerationRequest, SamplingParams
from sdk.protocol.sampling_params import StructuredOutput
from tests.local_runtime.conftest import assert_no_blocks_held, greedy, run_to_completion

pytestmark = pytest.mark.slow
ENGINE_OVERRIDES = {"batch_invariant": True, "block_size": 4}
K = 5


def drive_until_held(engine, request_id: str) -> list[int]:
    """Step until the drafting request is held (or gone); its output so far."""
    request = engine.scheduler.requests[request_id]
    while engine.has_unfinished_requests():
        engine.step()
    return list(request.output_token_ids)


def check_books(engine, request_id: str) -> None:
    request = engine.scheduler.requests[request_id]
    engine.block_manager.check_invariants()
    if request.slot is not None:
        assert engine.slot_holds_its_cells(request.slot, request.num_computed_tokens)


def reference(engine, prompt: list[int], n: int, name: str) -> list[int]:
    events = run_to_completion(engine, [greedy(name, prompt, n, ignore_eos=True)])
    return [event.token_id for event in events[name]]


def test_a_rewound_draft_goes_on_as_if_its_output_had_always_been_that(engine, chat_prompts):
    prompt = chat_prompts[0]
    engine.add_request(greedy("drafter", prompt, 200, ignore_eos=True), hold_at=K)
    drafted = drive_until_held(engine, "drafter")
    assert len(drafted) == K and not engine.has_unfinished_requests()  # held: a step has nothing to do
    check_books(engine, "drafter")
    # The verifier kept 2 tokens and emitted its own (not the draft's third).
    theirs = (drafted[2] + 1) % engine.backend.n_vocab
    engine.rewind("drafter", 2, [theirs], hold_at=3 + K)
    check_books(engine, "drafter")
    redrafted = drive_until_held(engine, "drafter")
    assert redrafted[:3] == [*drafted[:2], theirs] and len(redrafted) == 3 + K
    check_books(engine, "drafter")
    expected = reference(engine, [*prompt, *drafted[:2], theirs], K, "reference-1")
    assert redrafted[3:] == expected
    # Everything accepted, and the verifier's bonus token: nothing dropped, one token appended.
    bonus = (redrafted[-1] + 7) % engine.backend.n_vocab
    engine.rewind("drafter", len(redrafted), [bonus], hold_at=len(redrafted) + 1 + K)
    again = drive_until_held(engine, "drafter")
    assert again[: len(redrafted) + 1] == [*redrafted, bonus]
    assert again[len(redrafted) + 1 :] == reference(engine, [*prompt, *redrafted, bonus], K, "reference-2")
    assert engine.abort_request("drafter")
    assert_no_blocks_held(engine)


def test_rewound_blocks_are_never_found_by_another_request(engine, chat_prompts):
    """Blocks that held rejected draft tokens are published while the draft runs; after the rewind no
    later request may share them (their cells are gone from the slot)."""
    prompt = chat_prompts[1]
    engine.add_request(greedy("drafter", prompt, 200, ignore_eos=True), hold_at=3 * K)
    drafted = drive_until_held(engine, "drafter")
    engine.rewind("drafter", 1, [(drafted[1] + 1) % engine.backend.n_vocab], hold_at=None)
    check_books(engine, "drafter")
    hit = engine.block_manager.find_prefix([*prompt, *drafted], len(prompt) + len(drafted))
    assert hit is None or hit.num_tokens <= len(prompt) + 1
    # A request whose prompt is the rejected draft computes it afresh, and answers as the reference does.
    rejected = reference(engine, [*prompt, *drafted], 4, "after-rejected")
    engine.abort_request("drafter")
    assert rejected == reference(engine, [*prompt, *drafted], 4, "after-rejected-again")
    assert_no_blocks_held(engine)


def test_a_held_draft_leaves_the_device_to_other_requests(engine, chat_prompts):
    engine.add_request(greedy("drafter", chat_prompts[2], 200, ignore_eos=True), hold_at=2)
    engine.add_request(greedy("waiting-answer", chat_prompts[1], 2))
    # Until a step admits them, both wait; the device counts which of them draft for the cloud (a drafter stops
    # when local answers wait: sdk.cascade.device_drafts).
    stats = engine.stats()
    assert (stats.num_waiting, stats.num_waiting_drafts) == (2, 1)
    run_to_completion(engine, [])
    alone = reference(engine, chat_prompts[3], 6, "local-answer")  # runs to the end beside the held draft
    assert len(alone) == 6
    assert len(engine.scheduler.requests["drafter"].output_token_ids) == 2
    engine.abort_request("drafter")
    assert_no_blocks_held(engine)


def test_a_raised_hold_lets_a_draft_go_on_and_is_never_lowered(engine, chat_prompts):
    engine.add_request(greedy("raised", chat_prompts[2], 200, ignore_eos=True), hold_at=2)
    assert len(drive_until_held(engine, "raised")) == 2
    assert engine.hold_further("raised", 5) and len(drive_until_held(engine, "raised")) == 5
    assert engine.hold_further("raised", 3) and len(drive_until_held(engine, "raised")) == 5  # never lowered
    assert not engine.hold_further("gone", 9)
    engine.abort_request("raised")
    assert_no_blocks_held(engine)


def test_a_structured_draft_rewinds_its_grammar(engine):
    """The grammar state follows the rewind: after it the draft goes on from the new output and, let run to
    its end, closes valid JSON."""
    prompt = engine.apply_chat_template([{"role": "user", "content": "Give me a JSON object with a name."}])
    params = SamplingParams(
        max_tokens=60, temperature=0.0, structured=StructuredOutput(kind="json_schema", schema='{"type": "object"}')
    )
    engine.add_request(GenerationRequest("json-drafter", prompt, params), hold_at=4)
    request = engine.scheduler.requests["json-drafter"]
    drafted = drive_until_held(engine, "json-drafter")
    engine.rewind("json-drafter", 1, [drafted[1]], hold_at=None)  # the verifier kept one, and chose the second
    while engine.has_unfinished_requests():
        engine.step()
    assert request.output_token_ids[:2] == drafted[:2] and request.is_finished
    assert isinstance(json.loads(engine.detokenize(request.output_token_ids)), dict)
    assert_no_blocks_held(engine)
