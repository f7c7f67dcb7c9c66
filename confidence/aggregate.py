"""Sequence-level confidence: one feature vector from a generation's per-token signals.

Which aggregate predicts "the local answer is right" depends on the task: the mean is
diluted by long easy stretches, the minimum is set by a single token. Low quantiles
of token probability sit between the two and stay comparable across answer lengths
(Gupta et al. 2024, "Language Model Cascades: Token-level uncertainty and beyond");
a sliding-window mean catches one unsure stretch inside a confident answer. We compute
them all and let calibration (or a learned probe) choose.

Conventions, shared with `confidence.running.RunningConfidence`:
- an empty sequence gives `num_tokens` 0 and NaN for every other feature (never raises);
- `first_k` computes the same features over only the first K tokens (all of them when
  the sequence is shorter), for decisions taken early in a generation;
- windows are the last `window` tokens; a sequence shorter than the window is one
  window, so both window features equal `mean_prob`;
- quantiles interpolate linearly between order statistics (numpy's default method).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from confidence.signals import SignalArrays
from sdk.engine_common.repetition import repeated_ngram_fraction

QUANTILE_LEVELS = (0.05, 0.1, 0.25)  # low quantiles of token probability we report
DEFAULT_WINDOW = 8  # tokens per sliding window: short enough to catch one unsure phrase

# Stable order: probes and calibration files store vectors in this order. Append new
# features at the end so stored vectors stay readable.
FEATURE_NAMES: tuple[str, ...] = (
    "num_tokens",  # tokens aggregated (at most first_k)
    "mean_logprob",  # mean chosen-token log-probability (length-normalised log-likelihood)
    "mean_prob",  # mean chosen-token probability
    "min_prob",  # least likely chosen token
    "quantile_0.05",  # 5% quantile of chosen-token probability
    "quantile_0.1",  # 10% quantile of chosen-token probability
    "quantile_0.25",  # 25% quantile of chosen-token probability
    "mean_entropy",  # mean entropy (nats) of the model's distributions
    "max_entropy",  # most spread-out distribution
    "mean_margin",  # mean top-1 minus top-2 probability
    "min_margin",  # closest call between the two best tokens
    "window_min_mean_prob",  # lowest mean probability over any window of `window` tokens
    "window_mean_prob",  # mean probability of the last `window` tokens
    "mean_topk_mass",  # mean top-k alternative mass over tokens that carry alternatives
    # share of recent n-grams repeating another (sdk.engine_common.repetition); grows as it loops
    "repeated_ngram_fraction",
)
QUANTILE_FEATURE_NAMES = ("quantile_0.05", "quantile_0.1", "quantile_0.25")  # one per QUANTILE_LEVELS entry


def validate_window(window: int) -> None:
    """Raise ValueError unless `window` is a usable window length."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an integer >= 1 (tokens per sliding window), got {window!r}")


def quantile_of_sorted(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile of ascending values, interpolated linearly; NaN when there are none.

    One implementation for the batch and the incremental paths, so they agree exactly.
    """
    num_values = len(sorted_values)
    if num_values == 0:
        return math.nan
    position = q * (num_values - 1)
    lower_index = int(math.floor(position))
    upper_index = min(lower_index + 1, num_values - 1)
    lower, upper = float(sorted_values[lower_index]), float(sorted_values[upper_index])
    fraction = position - lower_index
    if fraction == 0.0:
        return lower
    # Clamp: lower + (upper - lower) * fraction can round one ulp outside [lower, upper].
    return min(max(lower + (upper - lower) * fraction, lower), upper)


def pack_features(values: Mapping[str, float]) -> np.ndarray:
    """Order named feature values as FEATURE_NAMES (float64); the names must match exactly."""
    if set(values) != set(FEATURE_NAMES):
        raise ValueError(f"feature names differ from FEATURE_NAMES: {sorted(set(values) ^ set(FEATURE_NAMES))}")
    return np.array([values[name] for name in FEATURE_NAMES], dtype=np.float64)


def empty_features() -> dict[str, float]:
    """Features of a sequence with no tokens: a count of 0 and NaN everywhere else."""
    return {name: (0.0 if name == "num_tokens" else math.nan) for name in FEATURE_NAMES}


def _mean_of_present(values: np.ndarray) -> float:
    # Mean over non-NaN entries without numpy's "mean of empty slice" warning.
    present = values[~np.isnan(values)]
    return float(present.mean()) if present.size else math.nan


def features_dict(signals: SignalArrays, first_k: int | None = None, window: int = DEFAULT_WINDOW) -> dict[str, float]:
    """Sequence features by name (see FEATURE_NAMES and the module docstring)."""
    validate_window(window)
    if first_k is not None:
        if isinstance(first_k, bool) or not isinstance(first_k, int) or first_k < 0:
            raise ValueError(f"first_k must be None or an integer >= 0 (tokens to keep), got {first_k!r}")
        signals = signals.head(first_k)
    num_tokens = len(signals)
    if num_tokens == 0:
        return empty_features()
    prob = signals.prob
    sorted_prob = np.sort(prob)
    if num_tokens >= window:
        window_means = np.lib.stride_tricks.sliding_window_view(prob, window).mean(axis=1)
    else:
        window_means = np.array([prob.mean()])
    values = {
        "num_tokens": float(num_tokens),
        "mean_logprob": float(signals.logprob.mean()),
        "mean_prob": float(prob.mean()),
        "min_prob": float(sorted_prob[0]),
        "mean_entropy": float(signals.entropy.mean()),
        "max_entropy": float(signals.entropy.max()),
        "mean_margin": float(signals.margin.mean()),
        "min_margin": float(signals.margin.min()),
        "window_min_mean_prob": float(window_means.min()),
        "window_mean_prob": float(window_means[-1]),
        "mean_topk_mass": _mean_of_present(signals.topk_mass),
        "repeated_ngram_fraction": math.nan
        if signals.token_ids is None
        else repeated_ngram_fraction(signals.token_ids.tolist()),
    }
    for name, q in zip(QUANTILE_FEATURE_NAMES, QUANTILE_LEVELS):
        values[name] = quantile_of_sorted(sorted_prob, q)
    return values


def sequence_features(signals: SignalArrays, first_k: int | None = None, window: int = DEFAULT_WINDOW) -> np.ndarray:
    """Sequence features as a float64 vector in FEATURE_NAMES order."""
    return pack_features(features_dict(signals, first_k=first_k, window=window))
