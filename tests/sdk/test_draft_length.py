"""How many tokens the device drafts a round, and when drafting for the cloud stops paying
(sdk.cascade.device_drafts: DraftLength, not_paying)."""

from __future__ import annotations

from types import SimpleNamespace

from sdk.cascade.device_drafts import (
    JUDGED_AFTER_TOKENS,
    MAX_DRAFT_TOKENS,
    DraftLength,
    DraftRounds,
    drafter_params,
    not_paying,
)
from sdk.protocol.sampling_params import SamplingParams, StructuredOutput


def test_the_draft_grows_while_taken_whole_and_shrinks_when_cut():
    length = DraftLength(4)
    length.verified(4, 4, lag=0)
    assert length.next() == 6
    length.verified(6, 2, lag=0)
    assert length.next() == 5
    for _ in range(20):
        length.verified(16, 16, lag=0)
    assert length.next() == MAX_DRAFT_TOKENS
    for _ in range(20):
        length.verified(3, 0, lag=0)
    assert length.next() == 1


def test_the_draft_covers_what_the_cloud_emits_while_it_is_in_flight():
    """A round trip the cloud spends emitting two tokens on its own: the draft reaches past them."""
    length = DraftLength(2)
    for _ in range(10):
        length.verified(3, 1, lag=2)  # cut short each time: the accepted part shrinks to 1
    assert length.accept == 1 and length.next() == 3


class Local:
    def __init__(self, waiting: int, waiting_drafts: int = 0):
        self.waiting, self.waiting_drafts = waiting, waiting_drafts

    def stats(self):
        return SimpleNamespace(num_waiting=self.waiting, num_waiting_drafts=self.waiting_drafts)


def test_drafting_stops_when_too_little_is_accepted_or_local_requests_wait():
    idle = Local(waiting=0)
    few = DraftRounds(verified_tokens=JUDGED_AFTER_TOKENS, accepted_tokens=2)
    assert not_paying(few, idle) == "low_acceptance"
    early = DraftRounds(verified_tokens=JUDGED_AFTER_TOKENS - 1, accepted_tokens=0)  # too soon to judge
    assert not_paying(early, idle) is None
    assert not_paying(DraftRounds(verified_tokens=40, accepted_tokens=30), idle) is None
    assert not_paying(DraftRounds(), Local(waiting=1)) == "device_busy"
    # Other answers' drafting requests waiting for a slot are not local answers: they do not stop this one.
    assert not_paying(DraftRounds(), Local(waiting=2, waiting_drafts=2)) is None


def test_a_structured_drafter_keeps_its_grammar_and_ends():
    """A structured answer's drafter masks its tokens with the answer's grammar and ends where the JSON does
    (a grammar refuses ignore_eos); every other drafter runs on until the cloud ends the answer."""
    schema = '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}'
    structured = SamplingParams(max_tokens=40, structured=StructuredOutput(kind="json_schema", schema=schema))
    drafting = drafter_params(structured, room=100)
    assert drafting.structured == structured.structured and not drafting.ignore_eos
    assert drafter_params(SamplingParams(max_tokens=40), room=100).ignore_eos
