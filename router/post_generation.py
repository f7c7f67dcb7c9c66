"""The policy that verifies a complete local answer before it is accepted.

A verifier sees the whole answer, so it can be stronger than the running aggregate (a
learned probe over all sequence features). Its escalation is only useful while the
client has not seen the answer yet: a non-streamed request, or a restart-mode hold
window long enough to cover the answer (router.hold_back).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from router.decision import (
    Reason,
    RoutingDecision,
    threshold_decision,
    validate_threshold,
)

# Feature values by name, as confidence.RunningConfidence.features_dict() gives them.
Features = Mapping[str, float]


class PostGenerationPolicy:
    """Escalates when `score_fn(features)` = P(local answer acceptable) < threshold
    (router.decision.should_escalate: threshold 0 never, 1 always escalates)."""

    name = "post_check"

    def __init__(self, score_fn: Callable[[Features], float], threshold: float):
        self.score_fn = score_fn  # sequence features by name -> P(acceptable) in [0, 1]
        self.threshold = validate_threshold(threshold)

    @classmethod
    def from_probe(cls, probe, threshold: float) -> PostGenerationPolicy:
        """Verify with a loaded confidence.probe_runtime.OnnxProbe (calibrated P(acceptable));
        features the probe was trained on but the mapping lacks are imputed by the probe."""
        return cls(probe.score_features, threshold)

    def decide(self, features: Features) -> RoutingDecision:
        """The verdict on a complete local answer described by its sequence features."""
        score = float(self.score_fn(features))
        if not math.isnan(score) and not 0.0 <= score <= 1.0:
            raise ValueError(f"post-generation score must be a probability in [0, 1], got {score!r}")
        num_tokens = int(features.get("num_tokens", 0))
        return threshold_decision(
            score,
            self.threshold,
            escalate_reason=Reason.FINAL_CHECK,
            decided_at_token=num_tokens,
            what="verifier P(acceptable)",
            decided_by=self.name,
        )
