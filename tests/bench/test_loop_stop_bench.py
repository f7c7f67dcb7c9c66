"""bench.loop_stop's judgements, without a model: the strict checks of its task families, what
counts as a looping answer, the Wilson interval, and that the headline covers SmolLM2's own sets only."""

from __future__ import annotations

import re
import string

import pytest

from bench.loop_stop import Answer, headline, is_looping, loop_period, summarize, wilson
from bench.loop_stop_tasks import alphabet, spelling, word_problem_pairs, word_problems


def test_wilson_interval_matches_known_values():
    assert wilson(0, 0) == [0.0, 1.0]
    low, high = wilson(0, 200)
    assert low == 0.0 and high == pytest.approx(3.8415 / 203.8415, rel=1e-4)  # z^2 / (n + z^2)
    assert wilson(5, 10) == pytest.approx([0.2366, 0.7634], abs=1e-4)
    assert wilson(10, 10)[1] == 1.0


def test_looping_means_the_cap_was_hit_and_the_tail_repeats_verbatim():
    unit = list(range(100, 170))  # a 70-token unit: longer than the tracker's 64-token period
    assert is_looping(Answer(list(range(30)) + unit + unit, None, "length"))
    assert loop_period(Answer(list(range(30)) + unit + unit, None, "length")) == 70
    assert loop_period(Answer(list(range(30)) + unit[:5] * 30, None, "length")) == 5  # the nearest copy
    assert not is_looping(Answer(list(range(30)) + unit + unit, None, "stop"))  # it ended by itself
    assert not is_looping(Answer(list(range(300)), None, "length"))  # ran long without repeating
    almost = unit + unit[:-1] + [999]  # the last token differs from its earlier copy
    assert not is_looping(Answer(almost, None, "length"))


def test_word_problem_checks_are_the_final_number():
    task = word_problems(1)[0]
    question = task.messages[-1]["content"]
    a, b, c = (int(word) for word in question.replace(".", " ").split() if word.isdigit())
    assert task.check(f"... so she has {a * b} + {c} = {a * b + c} now.\nThe answer is {a * b + c}.")
    assert not task.check(f"The answer is {a * b + c}. Or maybe {a * b + c + 1}.")
    assert len({t.messages[-1]["content"] for t in word_problems(200)}) == 200  # distinct prompts


def test_word_problem_pairs_need_both_answers_in_order():
    task = word_problem_pairs(1)[0]
    problems = re.findall(r"has (\d+) \w+ with (\d+) .*? gets (\d+) more", task.messages[-1]["content"])
    first, second = (int(a) * int(b) + int(c) for a, b, c in problems)
    assert task.check(f"Problem 1: ...\nThe answer is {first}.\n\nProblem 2: ...\nThe answer is {second}.")
    assert first == second or not task.check(f"The answer is {second}.\nThe answer is {first}.")
    assert not task.check(f"The answer is {first}.")
    assert not task.check(f"The answer is {first}.\nThe answer is {second}.\nThe answer is {second}.")


def test_alphabet_check_wants_the_list_exactly_once():
    equals, colon = alphabet(2)
    right = "\n".join(f"{letter} = {n}" for n, letter in enumerate(string.ascii_uppercase, 1))
    assert equals.check(right) and equals.check(right + "\n\nThat is the alphabet with its positions.")
    assert colon.check(right.replace(" =", ":")) and not colon.check(right)
    assert not equals.check(right + "\n\n" + right)  # written twice: the loop it falls into
    assert not equals.check(right.replace("O = 15\n", ""))
    assert not equals.check(right.replace("Z = 26", "Z = 27"))


def test_spelling_check_is_exact():
    task = spelling(1)[0]
    words = task.messages[-1]["content"].removeprefix("Spell these words letter by letter: ").rstrip(".").split(", ")
    right = "\n".join(f"{word}: {'-'.join(word)}" for word in words)
    assert task.check(right)
    assert not task.check(right.replace(f"{words[0]}: ", f"{words[0]}: x-"))


def test_headline_leaves_the_replayed_reference_answers_out():
    unit = list(range(100, 110))
    right_long = Answer(list(range(80)), True, "stop")
    looping = Answer(list(range(20)) + unit * 20, False, "length")
    sets = {"own": summarize([right_long, looping]), "gsm8k_reference": summarize([right_long] * 5)}
    figures = headline(sets)
    assert figures["loop_stop_correct_long_answers"] == 1
    assert figures["loop_stop_looping_answers"] == 1 and figures["loop_stop_cut_looping"] == 1
    assert figures["loop_stop_cut_correct"] == 0
    assert sets["own"]["tokens_saved_looping"] == len(looping.token_ids) - (20 + 64)  # stopped once 64 tokens loop
    long_loop = Answer(list(range(30)) + list(range(100, 170)) * 2, None, "length")  # a 70-token unit: past MAX_PERIOD
    assert summarize([long_loop])["looping"] == 1 and summarize([long_loop])["looping_not_stopped_periods"] == [70]
