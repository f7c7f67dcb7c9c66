"""What a router learns from an app's own labelled traffic: how wrong the cold-start head is,
per tier, along the main topic directions of that app's prompts.

The cold head (prompt shape only) cannot know a topic's difficulty, and topic difficulty is
what a deployment's labels reveal (bench.router_learning: per-subject means of the head's
residuals are the best of the simulated learners, and the product has no subject ids). So:

    directions = the top `dims` principal components of the traffic's MiniLM embeddings
                 (every recorded prompt, labelled or not: the app's own topic axes)
    per tier:    residual = label - the head's prediction, on the prompts that have that label
                 ridge(residual ~ (embedding - mean) @ directions), penalty `alpha`
    correction = (embedding - mean) @ directions @ coef        [n, 2], added to the head

A linear map: the router file holds one [384, 2] matrix and a bias, never the traffic's
embeddings (which derive from private text). Compared in bench.router_learning with a
nearest-neighbour memory of the residuals, per-cluster means and a head refit: as good at 10%
labels, never worse than the cold head at few labels, and nothing of any one prompt kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_DIMS = 16  # principal directions (8 to 64 alike in the design-subject CV below)
# Ridge penalty on the raw coordinates: small corrections until labels accumulate. Chosen by
# grouped CV on the design subjects (issue 37): with 10% of each held-out subject labelled in a
# table, 10 gained +0.046 +- 0.013 pooled APGR over prompt length and 100 +0.023 +- 0.006
# (8, 16, 32 or 64 directions alike); labels from simulated traffic: 10 and 100 within a SE.
DEFAULT_ALPHA = 10.0
MIN_ROWS = 32  # fewer embedded prompts than this: no directions worth fitting


@dataclass(frozen=True)
class TopicCorrection:
    """correction = embedding @ weight + bias, columns (weak, strong)."""

    weight: np.ndarray  # [d_embedding, 2]: the directions times their coefficients
    bias: np.ndarray  # [2]
    dims: int
    alpha: float
    num_rows: int  # embedded traffic prompts the directions came from
    num_labels: tuple[int, int]  # labelled rows per tier

    def corrections(self, embeddings: np.ndarray) -> np.ndarray:
        return np.asarray(embeddings, np.float64) @ self.weight + self.bias

    def describe(self) -> dict:
        return {
            "dims": self.dims,
            "alpha": self.alpha,
            "num_rows": self.num_rows,
            "num_labels_weak": self.num_labels[0],
            "num_labels_strong": self.num_labels[1],
        }


def fit_topic_correction(
    embeddings: np.ndarray,
    labelled: np.ndarray,
    labels: np.ndarray,
    predictions: np.ndarray,
    dims: int = DEFAULT_DIMS,
    alpha: float = DEFAULT_ALPHA,
) -> TopicCorrection | None:
    """`embeddings` [n, d] of every traffic prompt; `labelled` indexes the ones with labels,
    `labels` [len(labelled), 2] (NaN: unknown) and `predictions` the head's for them.
    None when there are too few prompts to find directions in."""
    embeddings = np.asarray(embeddings, np.float64)
    if len(embeddings) < max(MIN_ROWS, dims) or not len(labelled):
        return None
    mean = embeddings.mean(0)
    _, _, right = np.linalg.svd(embeddings - mean, full_matrices=False)
    directions = right[:dims].T  # [d, dims]
    coordinates = (embeddings[labelled] - mean) @ directions
    coef = np.zeros((dims, 2))
    for column in range(2):
        known = ~np.isnan(labels[:, column])
        if known.sum() < 2:
            continue
        residual = labels[known, column] - predictions[known, column]
        x = coordinates[known]
        # the residual's mean is a shift of every score alike: it changes no ranking, so it is left out
        coef[:, column] = np.linalg.solve(x.T @ x + alpha * np.eye(dims), x.T @ (residual - residual.mean()))
    weight = directions @ coef
    counts = tuple(int((~np.isnan(labels[:, c])).sum()) for c in range(2))
    return TopicCorrection(weight, -mean @ weight, dims, alpha, len(embeddings), counts)
