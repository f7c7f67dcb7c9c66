"""Which prompt-shape features and ridge penalty the cold router uses, chosen by grouped
cross-validation on the design subjects only (locked_split), with prompt length as the
fallback it has to beat.

    recipe, report = select_cold_recipe(design_examples(load_routellm()))

The procedure, every step inside the rows it is given:
1. Sign stability: the head on every shape feature (ridge SIGN_ALPHA) is fitted on the
   training part of each (seed, fold) split; a feature whose weight on the gain (strong minus
   weak) changes sign between splits does not ship (it says something about the topics in
   the fold, not about difficulty). log_chars, prompt length, is always kept.
2. Candidates: prompt length alone, and the stable features at each of ALPHAS, each scored
   by pooled APGR on the held-out subjects of the same splits, paired with length.
3. The best candidate ships when its mean paired gain over length exceeds one standard error
   of that gain; otherwise length does (a head on log_chars alone ranks prompts as length).

Decided before the locked subjects were scored (issue 37): the default router uses SELECTED
when, on the locked subjects, its pooled APGR beats prompt length's by more than the jackknife
standard error (over subjects) of the paired difference; otherwise it uses LENGTH, and
docs/benchmarks.md says so. Each was scored on the locked subjects once: SELECTED did not (DEFAULT below).

Nested inside an outer split (bench.router_learning), this is the recipe's honest estimate:
on the design subjects it gained +0.019 +- 0.010 pooled APGR over length, with within-subject
ranking no better than length's (commit notes of issue 37).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from router.eval_tables import RoutingExample
from router.prompt_router.cross_validation import evaluate, mean_and_se, subject_folds
from router.prompt_router.linear_head import HeadStatistics, LinearHead
from router.prompt_router.prompt_shape import SHAPE_FEATURES

ALPHAS = (1.0, 100.0, 10_000.0)
SIGN_ALPHA = 100.0
SEEDS, FOLDS = (100, 101, 102), 4  # inner splits: seeds apart from the outer ones bench.router_learning uses


@dataclass(frozen=True)
class ColdRecipe:
    """The head's features (names from prompt_shape.SHAPE_FEATURES) and its ridge penalty."""

    features: tuple[str, ...]
    alpha: float

    def __post_init__(self):
        unknown = [name for name in self.features if name not in SHAPE_FEATURES]
        if unknown or not self.features:
            raise ValueError(f"a recipe needs known shape features, got {list(self.features)} (unknown: {unknown})")

    @property
    def indices(self) -> list[int]:
        return [SHAPE_FEATURES.index(name) for name in self.features]

    @property
    def is_length(self) -> bool:
        return self.features == ("log_chars",)

    def solve(self, statistics: HeadStatistics) -> LinearHead:
        return statistics.solve(self.alpha, self.indices)

    def as_json(self) -> dict:
        return {"features": list(self.features), "alpha": self.alpha}

    @classmethod
    def from_json(cls, document: dict | None) -> ColdRecipe:
        """A router file's recipe; files written before recipes existed used every feature at alpha 1."""
        if not document:
            return cls(tuple(SHAPE_FEATURES), 1.0)
        try:
            return cls(tuple(document["features"]), float(document["alpha"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"router recipe is malformed: {exc}") from exc


LENGTH = ColdRecipe(("log_chars",), 1.0)


def _gain(head: LinearHead, shape: np.ndarray) -> np.ndarray:
    tiers = head.predict(shape)
    return tiers[:, 1] - tiers[:, 0]


def select_cold_recipe(
    examples: Sequence[RoutingExample], shape: np.ndarray, labels: np.ndarray, seeds=SEEDS, folds: int = FOLDS
) -> tuple[ColdRecipe, dict]:
    """(the recipe that ships, the report of how it was chosen) from `examples` with their
    shape features and [n, 2] tier labels; see the module docstring."""
    splits = []
    for seed in seeds:
        for held in subject_folds(examples, folds, seed):
            train = np.setdiff1d(np.arange(len(examples)), held)
            splits.append((HeadStatistics.of(shape[train], labels[train]), held, [examples[i] for i in held]))
    all_features = list(range(len(SHAPE_FEATURES)))
    signs = np.array([np.sign(_gain_weights(stats.solve(SIGN_ALPHA, all_features))) for stats, _, _ in splits])
    stable = [j for j in all_features if j in LENGTH.indices or abs(signs[:, j].sum()) == len(splits)]
    candidates = {"length": LENGTH}
    if len(stable) > 1:
        for alpha in ALPHAS:
            candidates[f"stable_alpha_{alpha:g}"] = ColdRecipe(tuple(SHAPE_FEATURES[j] for j in stable), alpha)
    apgr = {name: [] for name in candidates}
    for stats, held, held_examples in splits:
        for name, recipe in candidates.items():
            apgr[name].append(evaluate(_gain(recipe.solve(stats), shape[held]), held_examples)["apgr"])
    table = {}
    for name, values in apgr.items():
        mean, se = mean_and_se(values)
        gain, gain_se = mean_and_se(np.subtract(values, apgr["length"]))
        table[name] = {
            "apgr": mean,
            "apgr_se": se,
            "minus_length": gain,
            "minus_length_se": gain_se,
            "recipe": candidates[name].as_json(),
        }
    best = max(
        (name for name in candidates if name != "length"),
        key=lambda name: table[name]["minus_length"],
        default="length",
    )
    chosen = best if best != "length" and table[best]["minus_length"] > table[best]["minus_length_se"] else "length"
    report = {
        "seeds": list(seeds),
        "folds": folds,
        "stable_features": [SHAPE_FEATURES[j] for j in stable],
        "unstable_features": [SHAPE_FEATURES[j] for j in all_features if j not in stable],
        "candidates": table,
        "best": best,
        "chosen": chosen,
    }
    return candidates[chosen], report


def _gain_weights(head: LinearHead) -> np.ndarray:
    return head.weights[:, 1] - head.weights[:, 0]


# What select_cold_recipe chose on the design subjects (tests/router/test_cold_recipe.py reruns
# the selection and checks this is its answer: a constant so that training needs no selection run).
SELECTED = ColdRecipe(
    (
        "log_chars",
        "digit_share",
        "notation_share",
        "log_notation",
        "word_chars_mean",
        "log_words",
        "capitalized_share",
        "log_periods",
    ),
    1.0,
)

# The recipe the product uses (the default router, `tandem router train`, retrains of files
# without a recipe of their own): SELECTED scored 0.555 +- 0.032 pooled APGR on the locked
# subjects, prompt length 0.591 +- 0.075, paired -0.036 +- 0.102 (bench.router_learning at
# 8163d15+), so by the rule above the cold router ranks by prompt length, and what labels teach
# comes from the topic correction on top of it.
DEFAULT = LENGTH
