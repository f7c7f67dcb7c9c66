"""Pick the cascade threshold from data for a target: quality, cloud share, or cost.

The threshold means what it means at run time (router.decision.should_escalate): a request
escalates iff its confidence c < t, t = 0 never and t = 1 always escalates. Confidence is
the router's signal in the local direction (router.evaluation.inputs: c = 1 - s for a
strong-need score s). Only shares at a tie-group boundary are reachable, so candidates are
0, 1 and the midpoints between consecutive distinct confidences (a midpoint keeps a margin
on both sides for new data); each is measured with the run-time rule itself.

Costs: a request kept local is billed at the local tier's prices for the local tier's mean
tokens, an escalated one at the cloud's prices for the cloud's mean tokens (the local tokens
of an escalation mid-generation are left out: the local tier is free unless priced).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from router.costs import TOKENS_PER_PRICE_UNIT, CostTable
from router.evaluation.metrics import Outcomes

TARGET_KINDS = ("quality", "cloud_share", "budget")
TOKEN_COLUMNS = ("prompt_tokens", "completion_tokens")  # per tier in live tables: local_prompt_tokens, ...
_EPS = 1e-9


class CalibrationError(ValueError):
    """No threshold meets the target, or the scores cannot be thresholded; the message says why."""


@dataclass(frozen=True)
class Target:
    """What to calibrate for."""

    kind: str  # "quality": fraction of the strong tier's accuracy; "cloud_share"; "budget": USD per 1k requests
    value: float

    def __post_init__(self):
        if self.kind not in TARGET_KINDS:
            raise ValueError(f"unknown target {self.kind!r}; use one of {', '.join(TARGET_KINDS)}")
        if self.kind == "cloud_share" and not 0.0 <= self.value <= 1.0:
            raise ValueError(f"a cloud share is a fraction in [0, 1], got {self.value}")
        if self.value < 0:
            raise ValueError(f"the {self.kind} target must be >= 0, got {self.value}")


@dataclass(frozen=True)
class CostModel:
    """What one request costs on each tier (module docstring)."""

    prices: CostTable
    tokens: Mapping[str, tuple[float, float]]  # tier -> (mean prompt tokens, mean completion tokens)
    assumed: tuple[str, ...] = ()  # token counts neither the table nor the caller gave: defaults were used

    def per_request(self, tier: str) -> float:
        prices, (prompt, completion) = self.prices.prices(tier), self.tokens[tier]
        return (prompt * prices.input_per_million + completion * prices.output_per_million) / TOKENS_PER_PRICE_UNIT

    def per_1k(self, cloud_share: float) -> float:
        """USD per 1,000 requests when this share of them goes to the cloud."""
        return 1000 * ((1 - cloud_share) * self.per_request("local") + cloud_share * self.per_request("cloud"))


@dataclass(frozen=True)
class OperatingPoint:
    """A threshold and what it gives on the calibration data."""

    threshold: float
    cloud_share: float
    quality: float  # accuracy of the routed answers
    quality_of_strong: float  # quality / the strong tier's accuracy
    cost_per_1k: float  # USD per 1,000 requests

    def as_dict(self) -> dict:
        return dict(vars(self))


DEFAULT_TOKENS = (256, 256)  # mean prompt / completion tokens per request when nothing says otherwise


def cost_model(
    examples: Sequence, prices: CostTable, prompt_tokens: float | None = None, completion_tokens: float | None = None
) -> CostModel:
    """Per tier, the given mean token counts, else the table's means (live tables have them), else DEFAULT_TOKENS."""
    tokens, assumed = {}, []
    for tier in ("local", "cloud"):
        means = []
        for column, given, default in zip(
            TOKEN_COLUMNS, (prompt_tokens, completion_tokens), DEFAULT_TOKENS, strict=True
        ):
            values = [
                float(e.extra[f"{tier}_{column}"])
                for e in examples
                if e.extra.get(f"{tier}_{column}") not in (None, "")
            ]
            if given is None and not values:
                assumed.append(f"{tier}_{column}")
            means.append(float(given) if given is not None else float(np.mean(values)) if values else float(default))
        tokens[tier] = tuple(means)
    return CostModel(prices, tokens, tuple(assumed))


def escalates(confidence: np.ndarray, threshold: float) -> np.ndarray:
    """should_escalate over an array (a missing confidence is -inf, so it escalates)."""
    if threshold <= 0.0:
        return np.zeros(confidence.shape, bool)
    if threshold >= 1.0:
        return np.ones(confidence.shape, bool)
    return confidence < threshold


def measure(confidence, examples: Sequence, threshold: float, costs: CostModel | None = None) -> OperatingPoint:
    """What `threshold` gives on this table, by the run-time rule."""
    outcomes, confidence = Outcomes.of(examples), np.asarray(confidence, float)
    routed = escalates(confidence, threshold)
    share, quality = float(routed.mean()), float(np.where(routed, outcomes.strong, outcomes.weak).mean())
    of_strong = quality / outcomes.strong_acc if outcomes.strong_acc else float("nan")
    cost = costs.per_1k(share) if costs is not None else float("nan")
    return OperatingPoint(float(threshold), share, quality, of_strong, cost)


def candidates(confidence, examples: Sequence) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(thresholds, cloud shares, qualities) of every reachable operating point, share increasing."""
    c = np.asarray(confidence, float)
    finite = c[np.isfinite(c)]
    if np.isnan(c).any() or c[np.isinf(c)].max(initial=-np.inf) > 0 or ((finite < 0) | (finite > 1)).any():
        raise CalibrationError(
            "confidences must lie in [0, 1] (missing ones as -inf) to be compared with a threshold; "
            "check --higher-means, or rescale the score column"
        )
    outcomes = Outcomes.of(examples)
    c = np.maximum(c, 0.0)  # for t > 0 a -inf (missing) and a 0 both escalate: one group
    order = np.argsort(c, kind="stable")
    gains = np.r_[0, np.cumsum(outcomes.strong[order].astype(int) - outcomes.weak[order].astype(int))]
    distinct = np.unique(c)
    thresholds = np.r_[0.0, (distinct[:-1] + distinct[1:]) / 2, 1.0]
    num_escalated = np.r_[0, np.searchsorted(c[order], distinct[:-1], side="right"), c.size]
    return thresholds, num_escalated / c.size, outcomes.weak_acc + gains[num_escalated] / c.size


def choose_threshold(confidence, examples: Sequence, target: Target, costs: CostModel | None = None) -> OperatingPoint:
    """The threshold meeting `target` on this table, measured with the run-time rule."""
    thresholds, shares, quality = candidates(confidence, examples)
    if target.kind == "cloud_share":
        best = int(np.argmin(np.abs(shares - target.value)))  # first minimum: the cheaper of two equally close
    elif target.kind == "quality":
        wanted = target.value * Outcomes.of(examples).strong_acc
        met = np.flatnonzero(quality >= wanted - _EPS)
        if met.size == 0:
            top = int(np.argmax(quality))
            raise CalibrationError(
                f"no threshold reaches quality {wanted:.4f} ({target.value:g} of strong); the best is "
                f"{quality[top]:.4f} at cloud share {shares[top]:.3f}"
            )
        best = int(met[0])
    else:
        if costs is None:
            raise CalibrationError("a budget target needs a cost model (prices and tokens per request)")
        affordable = np.flatnonzero([costs.per_1k(share) <= target.value + _EPS for share in shares])
        if affordable.size == 0:
            raise CalibrationError(
                f"even all-local costs {costs.per_1k(0.0):.4f} USD per 1k requests, over {target.value:g}"
            )
        best = int(affordable[np.argmax(quality[affordable])])  # first maximum: the least cloud for that quality
    return measure(confidence, examples, float(thresholds[best]), costs)
