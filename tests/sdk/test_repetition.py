"""The loop detector both engines and the cascade read (sdk.engine_common.repetition), against
brute-force definitions of its two measures."""

from __future__ import annotations

import random

import pytest

from sdk.engine_common.repetition import (
    ESCALATE_LOOP,
    MAX_PERIOD,
    NGRAM,
    NGRAM_WINDOW,
    STOP_LOOP,
    Loop,
    LoopRule,
    RepetitionTracker,
    find_loop,
    repeated_ngram_fraction,
)


def brute_loop(tokens: list[int], rule: LoopRule) -> Loop | None:
    """The shortest period whose exact repetition covers enough of the tail, by definition."""
    for period in range(1, MAX_PERIOD + 1):
        span = period
        while span < len(tokens) and tokens[-span - 1] == tokens[-span - 1 + period]:
            span += 1
        if span >= 2 * period and span >= rule.required_span(period):
            return Loop(period, span)
    return None


def brute_fraction(tokens: list[int]) -> float:
    window = tokens[-NGRAM_WINDOW:]
    grams = [tuple(window[i : i + NGRAM]) for i in range(len(window) - NGRAM + 1)]
    duplicates = sum(1 for i, gram in enumerate(grams) if gram in grams[:i])
    return duplicates / len(grams) if grams else 0.0


def sequences(seed: int):
    """Token streams mixing free text, loops of every period and loops that break off."""
    rng = random.Random(seed)
    for _ in range(60):
        tokens: list[int] = []
        while len(tokens) < 300:
            kind = rng.random()
            if kind < 0.4:
                tokens += [rng.randrange(50) for _ in range(rng.randrange(1, 30))]
            else:
                unit = [rng.randrange(50) for _ in range(rng.randrange(1, MAX_PERIOD + 8))]
                tokens += (unit * rng.randrange(2, 6))[: rng.randrange(1, 200)]
        yield tokens


@pytest.mark.parametrize("seed", range(3))
def test_tracker_matches_the_definitions_at_every_token(seed):
    for tokens in sequences(seed):
        tracker = RepetitionTracker()
        for n, token in enumerate(tokens, start=1):
            tracker.push(token)
            for rule in (STOP_LOOP, ESCALATE_LOOP, LoopRule(2, 2)):
                assert tracker.loop(rule) == brute_loop(tokens[:n], rule), (n, rule)
            assert tracker.repeated_ngram_fraction == pytest.approx(brute_fraction(tokens[:n]), abs=1e-12)
            assert repeated_ngram_fraction(tokens[:n]) == pytest.approx(tracker.repeated_ngram_fraction, abs=1e-12)


def test_a_sentence_on_repeat_is_a_loop_and_a_counting_list_is_not():
    sentence = list(range(100, 119))  # 19 tokens, as "I've seen the island of the sea, and ..."
    looping = [7, 8, 9] + sentence * 5
    where = find_loop(looping, STOP_LOOP)
    # Three copies of 19 tokens span 57 < 64: the stop waits for 64 tokens of repetition.
    assert where == (3 + 64, Loop(19, 64))
    assert find_loop(looping, ESCALATE_LOOP) == (3 + 38, Loop(19, 38))  # two copies: escalate first
    counting = [token for i in range(60) for token in (500, 600 + i, 501)]  # "1. x\n2. x\n...": one token changes
    assert find_loop(counting, STOP_LOOP) is None and find_loop(counting, ESCALATE_LOOP) is None
    assert repeated_ngram_fraction(looping) > 0.6 > 0.0 == repeated_ngram_fraction(list(range(80)))


def test_a_unit_longer_than_max_period_is_not_seen():
    unit = list(range(MAX_PERIOD + 1))
    assert find_loop(unit * 6, STOP_LOOP) is None


def test_rules_need_two_copies():
    with pytest.raises(ValueError):
        LoopRule(min_span=64, min_repeats=1)
    assert STOP_LOOP.required_span(1) == 64 and STOP_LOOP.required_span(40) == 120
