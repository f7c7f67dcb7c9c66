"""How many tokens the device drafts a round, and when drafting for the cloud stops paying
(sdk.cascade.device_drafts: DraftLength, DeviceDrafter._not_paying)."""

from __future__ import annotations

from types import SimpleNamespace

from sdk.cascade.device_drafts import (
    JUDGED_AFTER_TOKENS,
    MAX_DRAFT_TOKENS,
    DeviceDrafter,
    DraftLength,
    DraftRounds,
)


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
    drafter = DeviceDrafter(Local(waiting=0))
    few = DraftRounds(verified_tokens=JUDGED_AFTER_TOKENS, accepted_tokens=2)
    assert drafter._not_paying(few) == "low_acceptance"
    early = DraftRounds(verified_tokens=JUDGED_AFTER_TOKENS - 1, accepted_tokens=0)  # too soon to judge
    assert drafter._not_paying(early) is None
    assert drafter._not_paying(DraftRounds(verified_tokens=40, accepted_tokens=30)) is None
    assert DeviceDrafter(Local(waiting=1))._not_paying(DraftRounds()) == "device_busy"
    # Other answers' drafting requests waiting for a slot are not local answers: they do not stop this one.
    assert DeviceDrafter(Local(waiting=2, waiting_drafts=2))._not_paying(DraftRounds()) is None
