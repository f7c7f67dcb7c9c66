"""The prompt router's score scale: what a threshold on its score means.

A router predicts the gain the cloud tier would bring, p_strong - p_weak (linear_head). That gain
is a ranking with a narrow range (the shipped router's runs from about 0.1 to 0.25 on the design
tables, since the cloud is right more often almost everywhere), so `0.5 + gain / 2` put every
prompt above 0.5 and a threshold of 0.5 sent every request to the cloud. The score is instead the
gain's place among reference prompts: the share of them whose predicted gain is lower. With the
cascade's rule (escalate iff 1 - score < threshold) a threshold t sends the top t of prompts like
the reference ones to the cloud before generation: the threshold is the cloud share on them.

Reference prompts: a router trained on tables takes its training tables (the shipped default: the
design tables, router.prompt_router.locked_split); a router refitted from traffic alone keeps the
scale of the router it started from, so a retrain moves a prompt's score, and the cloud share,
only as far as its predicted gain moves. The scale is piecewise linear in the gain through the
reference quantiles at LEVELS, with straight tails to (-1, 0) and (1, 1): it keeps every prompt's
order (nothing is clipped inside [-1, 1]), and the router file computes it (router_graph).

Ties: prompts of one length get one gain from a length-only head, so the reference has steps. A
knot on a step gets the step's middle (the share below it plus half the share on it), so a
threshold never splits prompts the router cannot tell apart: the whole step goes one way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Quantile levels of the reference gains the scale passes through: every percent, and half a
# percent from each end (the last half percent at each end lies on the tails).
LEVELS = (0.005, *(k / 100 for k in range(1, 100)), 0.995)
MIN_REFERENCE = 20  # prompts: fewer cannot place a quantile


@dataclass(frozen=True)
class ScoreScale:
    """score = the share of reference prompts whose predicted gain is lower (interpolated)."""

    gains: tuple[float, ...]  # knots, strictly increasing, from -1 to 1
    shares: tuple[float, ...]  # the score at each knot, from 0 to 1
    reference: str  # what the reference prompts were, for messages and reports
    num_reference: int  # how many

    def __post_init__(self):
        gains, shares = np.asarray(self.gains, float), np.asarray(self.shares, float)
        if gains.ndim != 1 or gains.shape != shares.shape or gains.size < 2:
            raise ValueError("a score scale needs as many shares as gains, at least two")
        if not (np.all(np.diff(gains) > 0) and np.all(np.diff(shares) >= 0)):
            raise ValueError("a score scale's gains must increase strictly and its shares must not decrease")
        if gains[0] != -1.0 or gains[-1] != 1.0 or shares[0] != 0.0 or shares[-1] != 1.0:
            raise ValueError("a score scale runs from (-1, 0) to (1, 1)")

    @classmethod
    def of(cls, gains: np.ndarray, reference: str) -> ScoreScale:
        """The scale whose score is the share of `gains` (the reference prompts' predicted gains) below a gain."""
        gains = np.asarray(gains, np.float32).astype(np.float64)  # as the router file computes them: ties stay ties
        gains = gains[np.isfinite(gains)]
        if gains.size < MIN_REFERENCE:
            raise ValueError(f"a score scale needs at least {MIN_REFERENCE} reference prompts, got {gains.size}")
        # distinct in float32, which the router file computes in; the tails keep some room inside [-1, 1]
        inner = np.unique(np.clip(np.quantile(gains, LEVELS), -0.999, 0.999).astype(np.float32)).astype(np.float64)
        ordered = np.sort(gains)
        below = np.searchsorted(ordered, inner, side="left")
        at_or_below = np.searchsorted(ordered, inner, side="right")
        inner_shares = (below + at_or_below) / (2 * gains.size)  # the middle of a step; the CDF where there is none
        knots = np.concatenate([[-1.0], inner, [1.0]])
        shares = np.concatenate([[0.0], inner_shares, [1.0]])
        return cls(tuple(float(g) for g in knots), tuple(float(s) for s in shares), reference, int(gains.size))

    def apply(self, gain) -> np.ndarray:
        """The score of each gain (what the router file computes, in float64)."""
        return np.interp(np.clip(np.asarray(gain, np.float64), -1.0, 1.0), self.gains, self.shares)

    def gain_at(self, share: float) -> float:
        """The gain whose score is `share`."""
        return float(np.interp(share, self.shares, self.gains))

    def segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(start, width, rise) of each linear piece: score = sum(rise * clip((gain - start) / width, 0, 1))."""
        gains, shares = np.asarray(self.gains), np.asarray(self.shares)
        return gains[:-1], np.diff(gains), np.diff(shares)

    def as_json(self) -> dict:
        return {
            "gains": list(self.gains),
            "shares": list(self.shares),
            "reference": self.reference,
            "num_reference": self.num_reference,
        }

    @classmethod
    def from_json(cls, document) -> ScoreScale:
        try:
            gains, shares = tuple(float(g) for g in document["gains"]), tuple(float(s) for s in document["shares"])
            return cls(gains, shares, str(document["reference"]), int(document["num_reference"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"score scale is malformed: {exc}") from exc
