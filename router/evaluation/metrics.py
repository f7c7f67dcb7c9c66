"""RouteLLM's routing metrics: the quality-vs-cloud-share curve, AUC, APGR and CPT.

Conventions (one for the whole package):
- A router gives each prompt a strong-need score s: higher = send it to the cloud. Routing
  the top fraction c of prompts by s to the strong tier gives quality(c) = mean over prompts
  of (strong_correct if routed else weak_correct).
- Tied scores are routed together: the exact curve has a point at each tie-group boundary
  and is linear inside a group, which is the expected quality when ties are broken at
  random. So the result does not depend on the order of the table.
- The reported curve samples that exact curve at cloud shares 0, 10%, ..., 100% (the score
  deciles); AUC is the trapezoid over those 11 points on [0, 1] (span = 1), and
  APGR = (AUC - weak_acc) / (strong_acc - weak_acc).
- CPT(x) is exact: the smallest share where the exact curve first reaches
  weak_acc + x * (strong_acc - weak_acc), interpolated linearly inside a tie group.
- The oracle scores s = strong_correct - weak_correct: prompts only the strong tier gets
  right first, prompts only the weak tier gets right last (its APGR can exceed 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DECILE_SHARES = np.linspace(0.0, 1.0, 11)
CPT_LEVELS = (0.2, 0.5, 0.8)
_EPS = 1e-12  # qualities are sums of 1/n steps: compare with a rounding tolerance


@dataclass(frozen=True)
class Outcomes:
    """Per prompt, whether each tier answered right."""

    weak: np.ndarray  # bool, the local tier
    strong: np.ndarray  # bool, the cloud tier

    @classmethod
    def of(cls, examples: Sequence) -> Outcomes:
        """From router.eval_tables.RoutingExample rows."""
        if not examples:
            raise ValueError("no prompts to evaluate: the table is empty (or every prompt was dropped)")
        return cls(
            np.array([e.weak_correct for e in examples], bool), np.array([e.strong_correct for e in examples], bool)
        )

    @property
    def weak_acc(self) -> float:
        return float(self.weak.mean())

    @property
    def strong_acc(self) -> float:
        return float(self.strong.mean())


@dataclass(frozen=True)
class Curve:
    """Quality against cloud share, at every point where the router can switch."""

    shares: np.ndarray  # increasing, from 0 to 1
    quality: np.ndarray  # accuracy at each share


@dataclass(frozen=True)
class RouterMetrics:
    """One router's figures (module docstring)."""

    shares: list[float]  # the decile grid
    quality: list[float]  # the curve at the decile grid
    auc: float
    apgr: float  # NaN when both tiers are equally accurate (no gap to recover)
    cpt: dict[str, float]  # "20%" -> smallest cloud share recovering 20% of the gap

    def as_dict(self) -> dict:
        return {"shares": self.shares, "quality": self.quality, "auc": self.auc, "apgr": self.apgr, "cpt": self.cpt}


def exact_curve(scores, outcomes: Outcomes) -> Curve:
    """The curve of a strong-need score: highest scores go to the cloud first, ties together."""
    s = np.asarray(scores, dtype=float)
    if s.shape != outcomes.weak.shape:
        raise ValueError(f"{s.size} scores for {outcomes.weak.size} prompts")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN; map a missing confidence to +inf (escalate) first")
    order = np.argsort(-s, kind="stable")
    sorted_scores = s[order]
    gains = outcomes.strong.astype(int)[order] - outcomes.weak.astype(int)[order]
    group_ends = np.flatnonzero(np.r_[sorted_scores[1:] != sorted_scores[:-1], True])
    num = s.size
    shares = np.r_[0.0, (group_ends + 1) / num]
    quality = outcomes.weak_acc + np.r_[0, np.cumsum(gains)[group_ends]] / num
    return Curve(shares, quality)


def random_curve(outcomes: Outcomes, num_seeds: int = 100, seed: int = 0) -> Curve:
    """The random router's curve averaged over seeds (each seed: a random order of the prompts)."""
    if num_seeds < 1:
        raise ValueError(f"the random router needs at least one seed, got {num_seeds}")
    gains = outcomes.strong.astype(int) - outcomes.weak.astype(int)
    rng = np.random.default_rng(seed)
    total = np.zeros(gains.size + 1)
    for _ in range(num_seeds):
        total[1:] += np.cumsum(rng.permutation(gains))
    shares = np.arange(gains.size + 1) / gains.size
    return Curve(shares, outcomes.weak_acc + total / num_seeds / gains.size)


def oracle_scores(outcomes: Outcomes) -> np.ndarray:
    """The oracle's strong-need score (module docstring)."""
    return outcomes.strong.astype(float) - outcomes.weak.astype(float)


def share_to_reach(curve: Curve, target: float) -> float:
    """The smallest cloud share at which the curve reaches `target` quality; NaN if never."""
    reached = np.flatnonzero(curve.quality >= target - _EPS)
    if reached.size == 0:
        return float("nan")
    i = int(reached[0])
    if i == 0:
        return 0.0
    (s0, s1), (q0, q1) = curve.shares[i - 1 : i + 1], curve.quality[i - 1 : i + 1]
    return float(s0 + (s1 - s0) * (target - q0) / (q1 - q0))


def summarize(curve: Curve, outcomes: Outcomes) -> RouterMetrics:
    """AUC, APGR and CPT of a curve, against the two tiers of `outcomes`."""
    weak, strong = outcomes.weak_acc, outcomes.strong_acc
    quality = np.interp(DECILE_SHARES, curve.shares, curve.quality)
    auc = float(np.trapezoid(quality, DECILE_SHARES))
    gap = strong - weak
    apgr = (auc - weak) / gap if abs(gap) > _EPS else float("nan")
    # No gap (or a weaker strong tier): the weak tier's own quality already "recovers" it at share 0.
    cpt = {f"{round(x * 100)}%": share_to_reach(curve, weak + x * max(gap, 0.0)) for x in CPT_LEVELS}
    return RouterMetrics(DECILE_SHARES.tolist(), quality.tolist(), auc, float(apgr), cpt)


def evaluate_scores(scores, outcomes: Outcomes) -> RouterMetrics:
    """The metrics of one strong-need score per prompt."""
    return summarize(exact_curve(scores, outcomes), outcomes)
