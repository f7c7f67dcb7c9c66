"""HoldBackBuffer: restart mode never shows the client a token it may contradict;
continue mode hands the cloud exactly the prefix the client has."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.decision import HandoffMode
from router.hold_back import HoldBackBuffer
from router.streaming_policy import StreamingPolicy
from sdk.protocol.engine import TokenEvent


def make_events(num_tokens: int, prob: float = 0.9) -> list[TokenEvent]:
    return [
        TokenEvent(request_id="r", token_id=100 + i, text=f"t{i} ", logprob=math.log(prob), entropy=0.5, margin=0.1)
        for i in range(num_tokens)
    ]


@given(st.integers(0, 40), st.booleans())
def test_restart_without_window_releases_nothing_before_the_decision(num_tokens, escalate):
    buffer = HoldBackBuffer(HandoffMode.RESTART)
    events = make_events(num_tokens)
    assert all(buffer.push(event) == [] for event in events)
    assert buffer.released_events == () and buffer.num_held == num_tokens and buffer.can_escalate
    if escalate:
        plan = buffer.escalate()
        assert (plan.mode, plan.prefix_token_ids, plan.num_released_tokens) == (HandoffMode.RESTART, None, 0)
        assert plan.num_discarded_tokens == num_tokens and buffer.released_events == ()
    else:
        assert buffer.commit_local() == events  # everything, in order
        assert list(buffer.released_events) == events and buffer.num_held == 0


@given(st.integers(0, 12), st.integers(0, 30), st.one_of(st.none(), st.integers(0, 30)))
def test_restart_window_holds_then_commits_local(hold_tokens, num_tokens, escalate_before):
    """Push tokens (escalating before token `escalate_before` if set): nothing is released
    before `hold_tokens` tokens passed, then all at once, then each as it comes; a restart
    is possible exactly while nothing was released."""
    buffer = HoldBackBuffer("restart", hold_tokens)
    events = make_events(num_tokens)
    released = []
    for index, event in enumerate(events):
        if escalate_before == index:
            break
        released_now = buffer.push(event)
        num_pushed = index + 1
        if num_pushed < hold_tokens:
            assert released_now == []
        elif num_pushed == max(hold_tokens, 1):
            assert released_now == events[:num_pushed]
        else:
            assert released_now == [event]
        released += released_now
        assert buffer.can_escalate is (num_pushed < hold_tokens)
    assert list(buffer.released_events) == released
    num_pushed = len(events) if escalate_before is None else min(escalate_before, len(events))
    if escalate_before is not None and buffer.can_escalate:
        plan = buffer.escalate()
        assert plan.num_discarded_tokens == num_pushed and plan.num_released_tokens == 0
    elif escalate_before is not None:
        with pytest.raises(RuntimeError, match="would contradict"):
            buffer.escalate()
    else:
        assert released + buffer.commit_local() == events


@given(st.integers(0, 30), st.booleans())
def test_continue_releases_as_tokens_come_and_hands_off_that_prefix(num_tokens, escalate):
    buffer = HoldBackBuffer(HandoffMode.CONTINUE)
    events = make_events(num_tokens)
    for event in events:
        assert buffer.push(event) == [event]
        assert buffer.can_escalate
    if escalate:
        plan = buffer.escalate()
        assert plan.mode is HandoffMode.CONTINUE
        assert plan.prefix_token_ids == tuple(100 + i for i in range(num_tokens))
        assert plan.prefix_text == "".join(f"t{i} " for i in range(num_tokens))
        assert (plan.num_released_tokens, plan.num_discarded_tokens) == (num_tokens, 0)
    else:
        assert buffer.commit_local() == []


def test_settled_requests_take_no_more_tokens():
    escalated = HoldBackBuffer("restart")
    escalated.escalate()
    with pytest.raises(RuntimeError, match="settled by escalate"):
        escalated.push(make_events(1)[0])
    with pytest.raises(RuntimeError, match="already escalated"):
        escalated.commit_local()
    committed = HoldBackBuffer("continue")
    committed.commit_local()
    assert not committed.can_escalate
    with pytest.raises(RuntimeError, match="settled by commit_local"):
        committed.escalate()


@pytest.mark.parametrize(
    "mode, hold_tokens, message_part",
    [
        ("continue", 4, "restart mode only"),
        ("restart", -1, "hold_tokens"),
        ("restart", 2.5, "hold_tokens"),
        ("later", None, "mode"),
    ],
)
def test_bad_configuration_is_refused(mode, hold_tokens, message_part):
    with pytest.raises(ValueError, match=message_part):
        HoldBackBuffer(mode, hold_tokens)


@pytest.mark.parametrize("prob, expect_escalation", [(0.2, True), (0.9, False)])
def test_with_a_first_k_policy_and_a_k_token_window_the_client_sees_only_accepted_tokens(prob, expect_escalation):
    """The intended wiring: observe first, push only what did not escalate."""
    k = 5
    policy = StreamingPolicy(0.5, k, decide_at="first_k")
    buffer = HoldBackBuffer("restart", hold_tokens=k)
    shown, escalation = [], None
    for event in make_events(12, prob):
        escalation = policy.observe(event)
        if escalation is not None:
            break
        shown += buffer.push(event)
    if expect_escalation:
        plan = buffer.escalate()
        assert shown == [] and escalation.decided_at_token == k and plan.num_discarded_tokens == k - 1
        assert escalation.with_handoff(plan.mode).handoff is HandoffMode.RESTART
    else:
        assert len(shown) == 12 and not policy.finish().escalated and buffer.commit_local() == []
