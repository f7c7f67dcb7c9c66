"""Confidence on a task with checkable answers (generated arithmetic): the task generator
and answer checking (fast), and a small run of bench.confidence_auroc's pipeline over the
embedded local model (slow): the probe, as exported to ONNX and run with onnxruntime,
must rank held-out answers at least as well as the best single signal."""

from __future__ import annotations

import pytest

from confidence.arithmetic_task import (
    FEW_SHOT,
    LEVELS,
    extract_answer,
    generate_items,
    is_correct,
    level_counts,
    reply_answer,
)


def test_generator_is_deterministic_per_seed():
    first, second = generate_items(120, seed=7), generate_items(120, seed=7)
    assert first == second
    other = generate_items(120, seed=8)
    assert [item.question for item in first] != [item.question for item in other]


def test_items_are_distinct_checkable_and_in_rising_levels():
    items = generate_items(200, seed=0)
    assert len(items) == 200 and len({item.question for item in items}) == 200
    assert [item.level for item in items] == sorted(item.level for item in items)
    assert {item.level for item in items} == set(range(len(LEVELS)))
    assert not {item.question for item in items} & {example for example, _ in FEW_SHOT}
    for item in items:
        expression = item.question.replace("×", "*")
        assert eval(expression) == item.answer >= 0  # precedence included: "a + b × c"
        assert item.messages[-1] == {"role": "user", "content": f"What is {item.question}?"}
        assert [m["role"] for m in item.messages] == ["user", "assistant"] * len(FEW_SHOT) + ["user"]


def test_difficulty_rises():
    """Later levels have bigger answers and more digits to get right."""
    items = generate_items(500, seed=3)
    mean_digits = [
        sum(len(str(item.answer)) for item in items if item.level == level) / 50 for level in range(len(LEVELS))
    ]
    assert mean_digits[0] < mean_digits[3] < mean_digits[6] < mean_digits[-1]
    assert max(item.answer for item in items if item.level == 0) <= 18
    assert min(item.answer for item in items if item.level == len(LEVELS) - 1) >= 100 * 100


def test_level_counts_follow_the_weights_and_sum_to_n():
    assert level_counts(23) == [3, 3, 3, 2, 2, 2, 2, 2, 2, 2]
    weights = [1, 0, 0, 0, 0, 0, 0, 0, 0, 3]
    assert level_counts(8, weights) == [2, 0, 0, 0, 0, 0, 0, 0, 0, 6]
    assert [item.level for item in generate_items(8, 0, weights)] == [0, 0] + [9] * 6
    with pytest.raises(ValueError):
        level_counts(5, [1, 2])
    with pytest.raises(ValueError):
        generate_items(200, 0, [1] + [0] * 9)  # only 81 distinct 1-digit sums


@pytest.mark.parametrize(
    "text, expected",
    [
        ("68", 68),
        (" 68\n\nThis is a classic", 68),
        ("The answer is 1,234.", 1234),
        ("The answer is: -5", -5),
        ("1,234,567 apples", 1234567),
        ("**42**", 42),
        ("68.0", 68),
        ("3.5", None),  # not an integer
        ("12, 345", 12),  # a list, not a thousands separator
        ("1,23", 1),
        ("no digits here", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_replies_that_restate_the_sum_are_judged_by_the_result():
    assert reply_answer("8 + 6 = 14") == 14
    assert is_correct("8 + 6 = 14", 14) and not is_correct("8 + 6 = 14", 8)
    assert is_correct("391 + 478 = 869\n\nThe answer is 869.", 869)
    assert is_correct("952 × 559 = 532,168", 532168)
    assert not is_correct("To solve this, we need to add 8 and 6.", 14)
    assert is_correct("The answer is 14.", 14)
    assert not is_correct("8 + 6 =", 14)


# --- the pipeline over the real local model -------------------------------------------

NUM_ITEMS = 240  # ~25 s of generation here (2 cores); held out: 96 answers, ~28 right
SEED = 1  # not the bench's seed 0: other questions, other split


@pytest.fixture(scope="module")
def small_run():
    from bench.confidence_auroc import collect_answers, evaluate

    answers = collect_answers(NUM_ITEMS, SEED)
    return answers, evaluate(answers, SEED)


@pytest.mark.slow
def test_some_answers_are_right_and_some_wrong(small_run):
    answers, result = small_run
    counts = result["counts"]
    assert counts["heldout_right"] >= 10 and counts["heldout_wrong"] >= 10
    assert counts["train"] + counts["heldout"] == NUM_ITEMS == len(answers.texts)
    assert 0.15 <= result["accuracy"] <= 0.6  # the task is neither trivial nor hopeless
    by_level = [row["accuracy"] for row in result["accuracy_by_level"]]
    assert by_level[0] > by_level[-1]


@pytest.mark.slow
def test_every_auroc_is_a_probability(small_run):
    _, result = small_run
    values = [result["probe"]["heldout_auroc"]]
    values += [row[key] for row in result["signals"].values() for key in ("train_auroc", "heldout_auroc")]
    assert all(0.0 <= value <= 1.0 for value in values)
    # Oriented on train: each signal's train AUROC is at least chance by construction.
    assert all(row["train_auroc"] >= 0.5 for row in result["signals"].values())


@pytest.mark.slow
def test_probe_is_not_worse_than_the_best_single_signal(small_run):
    _, result = small_run
    difference = result["probe_auroc_minus_best_signal"]
    # Tolerance: two standard errors of the paired AUROC difference (DeLong), computed on
    # these held-out answers; with ~96 of them one SE is ~0.02-0.03. The answers themselves
    # vary from run to run (the engine batches them as they come, and llama.cpp rounds by
    # batch shape): the same code gave -0.020 (SE 0.026) and +0.017 (SE 0.029) in two runs
    # here. The best signal is the one with the highest *held-out* AUROC out of 14, which
    # biases the baseline upward (winner's curse), so a probe truly as good as the best
    # signal loses by a little on most splits: a one-SE bound fails it on more than one run
    # in six (it did in a CI run: -0.027, SE 0.025). Beyond two SEs is evidence it is worse
    # (the retrain guard's margin too, router.evaluation.paired_auc).
    # Measured: here probe 0.929 vs min_margin 0.908, +0.020 (SE 0.021); at the bench's
    # scale (600 answers, 240 held out) +0.057 (SE 0.022) over quantile_0.05.
    tolerance = 2 * result["probe_auroc_minus_best_signal_se"]
    assert 0.0 < tolerance < 0.2
    assert difference >= -tolerance, (
        f"probe {result['probe']['heldout_auroc']:.3f} vs {result['best_signal']} "
        f"{result['best_signal_heldout_auroc']:.3f} (SE of the difference {tolerance / 2:.3f})"
    )
