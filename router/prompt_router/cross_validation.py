"""How a router recipe is judged on topics it never saw: subject splits and grouped
cross-validation on routing tables, APGR as `tandem eval` computes it.

A random router scores APGR 0.5 in expectation; rows of a seen subject leak its difficulty
into the test, so every split here is by subject (MMLU's subjects; GSM8K, one subject,
always trains). Per-fold APGR swings widely (one fold's weak-strong gap may be small), so a
recipe's figure is the mean over (seed, fold) with its standard error, and two recipes are
compared pairwise on the same folds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import numpy as np

from router.eval_tables import RoutingExample
from router.evaluation.metrics import Outcomes, evaluate_scores, oracle_scores

ScoreHeldout = Callable[
    [np.ndarray, np.ndarray], np.ndarray
]  # (train rows, held rows) -> strong-need scores of the held rows


def tier_labels(examples: Sequence[RoutingExample]) -> np.ndarray:
    """[n, 2] float: whether the weak and the strong tier answered right."""
    return np.array([[e.weak_correct, e.strong_correct] for e in examples], dtype=np.float64).reshape(len(examples), 2)


def group_of(example: RoutingExample) -> str:
    return str(example.extra.get("subject") or example.source)


def evaluate(scores: np.ndarray, examples: Sequence[RoutingExample]) -> dict:
    """APGR / CPT(50%) as `tandem eval` computes them (router.evaluation.metrics: RouteLLM's
    decile grid), with the oracle for scale."""
    outcomes = Outcomes.of(examples)
    metrics = evaluate_scores(scores, outcomes)
    return {
        "apgr": metrics.apgr,
        "random_apgr": 0.5,
        "oracle_apgr": evaluate_scores(oracle_scores(outcomes), outcomes).apgr,
        "cpt50": metrics.cpt["50%"],
        "auc": metrics.auc,
        "weak_accuracy": outcomes.weak_acc,
        "strong_accuracy": outcomes.strong_acc,
        "num_examples": len(examples),
    }


def subject_split(
    examples: Sequence[RoutingExample], holdout_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(train rows, held-out rows, held-out groups). MMLU subjects are held out when the
    tables have them (GSM8K, one subject, always trains); otherwise any groups; a single
    group falls back to a row split (reported as such)."""
    groups = [group_of(e) for e in examples]
    names = sorted(set(groups))
    candidates = [g for g in names if g.startswith("mmlu_")] or names
    rng = random.Random(seed)
    if len(candidates) >= 2:
        held = sorted(rng.sample(candidates, max(1, round(holdout_fraction * len(candidates)))))
        is_held = np.array([g in set(held) for g in groups])
    else:
        rows = list(range(len(examples)))
        rng.shuffle(rows)
        is_held = np.zeros(len(examples), dtype=bool)
        is_held[rows[: max(1, round(holdout_fraction * len(rows)))]] = True
        held = ["(random rows)"]
    return np.flatnonzero(~is_held), np.flatnonzero(is_held), held


def subject_folds(examples: Sequence[RoutingExample], folds: int, seed: int) -> list[np.ndarray]:
    """Held-out rows per fold: MMLU subjects shuffled (seeded) and dealt into `folds` groups,
    so every subject is held out exactly once; GSM8K (one subject) always trains."""
    groups = [group_of(e) for e in examples]
    subjects = sorted({g for g in groups if g.startswith("mmlu_")})
    if len(subjects) < folds:
        raise ValueError(f"{len(subjects)} MMLU subjects cannot make {folds} folds")
    random.Random(seed).shuffle(subjects)
    return [np.flatnonzero([g in set(subjects[f::folds]) for g in groups]) for f in range(folds)]


def mean_and_se(values) -> tuple[float, float]:
    values = np.asarray(values, dtype=float)
    se = float(values.std(ddof=1) / math.sqrt(values.size)) if values.size > 1 else float("nan")
    return float(values.mean()), se


def grouped_cv(
    examples: Sequence[RoutingExample],
    recipes: dict[str, ScoreHeldout],
    folds: int = 4,
    seeds: Sequence[int] = (0, 1, 2),
    baseline: str | None = None,
) -> dict:
    """Every recipe on the same (seed, fold) splits: per recipe, APGR per fold, their mean and
    standard error, and (with `baseline`, one of the recipes) the paired difference to it."""
    per_fold: dict[str, list[float]] = {name: [] for name in recipes}
    splits = []
    for seed in seeds:
        for fold, held in enumerate(subject_folds(examples, folds, seed)):
            train = np.setdiff1d(np.arange(len(examples)), held)
            held_examples = [examples[i] for i in held]
            splits.append(
                {
                    "seed": seed,
                    "fold": fold,
                    "num_held": int(held.size),
                    "subjects": sorted({group_of(e) for e in held_examples}),
                }
            )
            for name, score_heldout in recipes.items():
                per_fold[name].append(evaluate(np.asarray(score_heldout(train, held), float), held_examples)["apgr"])
    report = {"folds": folds, "seeds": list(seeds), "splits": splits, "recipes": {}}
    for name, values in per_fold.items():
        mean, se = mean_and_se(values)
        entry = {"apgr": mean, "apgr_se": se, "apgr_by_fold": values}
        if baseline is not None and name != baseline:
            entry[f"minus_{baseline}"], entry[f"minus_{baseline}_se"] = mean_and_se(
                np.subtract(values, per_fold[baseline])
            )
        report["recipes"][name] = entry
    return report


def per_subject_apgr(scores: np.ndarray, examples: Sequence[RoutingExample]) -> dict:
    """APGR within each subject of `examples` (the locked-set report, issue 37): one subject's
    difficulty cannot carry another's, so the mean over subjects, its standard error and its
    range say how a router does on a topic it meets, where a pooled APGR mixes easy and hard
    subjects. A subject whose tiers are equally accurate has no gap to recover: left out, named."""
    scores = np.asarray(scores, dtype=float)
    groups = np.array([group_of(e) for e in examples])
    by_subject, no_gap = {}, []
    for subject in sorted(set(groups)):
        rows = np.flatnonzero(groups == subject)
        apgr = evaluate(scores[rows], [examples[i] for i in rows])["apgr"]
        if math.isnan(apgr):
            no_gap.append(subject)
        else:
            by_subject[subject] = apgr
    values = list(by_subject.values())
    mean, se = mean_and_se(values) if values else (float("nan"), float("nan"))
    return {
        "apgr_mean": mean,
        "apgr_se": se,
        "apgr_min": min(values, default=float("nan")),
        "apgr_max": max(values, default=float("nan")),
        "apgr_by_subject": by_subject,
        "num_subjects": len(values),
        "subjects_without_gap": no_gap,
    }


def _pooled_apgr_leave_one_out(scores: np.ndarray, examples: Sequence[RoutingExample]) -> tuple[float, np.ndarray]:
    """Pooled APGR over every row (as outside evaluations score a router), and again with each
    subject left out in turn (sorted by name)."""
    scores = np.asarray(scores, dtype=float)
    groups = np.array([group_of(e) for e in examples])

    def pooled(rows) -> float:
        return evaluate(scores[rows], [examples[i] for i in rows])["apgr"]

    return pooled(np.arange(len(examples))), np.array(
        [pooled(np.flatnonzero(groups != s)) for s in sorted(set(groups))]
    )


def _jackknife_se(leave_one_out: np.ndarray) -> float:
    """The jackknife standard error over subjects: the spread a figure on a dozen topics has."""
    n = leave_one_out.size
    return (
        float(math.sqrt((n - 1) / n * ((leave_one_out - leave_one_out.mean()) ** 2).sum())) if n >= 2 else float("nan")
    )


def locked_figures(scores: np.ndarray, length: np.ndarray, examples: Sequence[RoutingExample]) -> dict:
    """A router's figures on the locked subjects beside prompt length's on the same rows:
    pooled APGR with its jackknife SE over subjects, the paired difference to length with its
    SE (each subject left out of both alike), and the per-subject spread (per_subject_apgr)."""
    apgr, leave_one_out = _pooled_apgr_leave_one_out(scores, examples)
    length_apgr, length_leave_one_out = _pooled_apgr_leave_one_out(length, examples)
    minus, minus_se = apgr - length_apgr, _jackknife_se(leave_one_out - length_leave_one_out)
    return {
        "apgr": apgr,
        "apgr_se": _jackknife_se(leave_one_out),
        "minus_length": minus,
        "minus_length_se": minus_se,
        "beats_length": bool(minus > minus_se),
        "per_subject": per_subject_apgr(scores, examples),
        "num_examples": len(examples),
        "num_subjects": len({group_of(e) for e in examples}),
    }
