"""What the router decided and why, the one threshold rule every policy shares, and the
model-name grammar ("auto", "local", "cloud", "auto:0.35") the SDK accepts.

The threshold is the cost/quality knob. Every policy turns its signal into a
confidence that the local answer is acceptable (higher = more confident) and applies
`should_escalate`: escalate iff confidence < threshold, except that threshold 0 never
escalates and threshold 1 always does, whatever the confidence (even NaN or exactly 1).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass

from sdk.protocol.engine import InvalidRequestError


class StrChoice(str, enum.Enum):
    """A string-valued choice that prints as its value (f-strings, logs, JSON)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Tier(StrChoice):
    """Which engine answers."""

    LOCAL = "local"
    CLOUD = "cloud"


class HandoffMode(StrChoice):
    """How the cloud takes over a request the local model had started."""

    RESTART = "restart"  # the cloud answers the original request; held-back local tokens are dropped
    CONTINUE = "continue"  # the cloud continues after the local prefix already sent to the client


class RoutingMode(StrChoice):
    """What the request asked for in its model name."""

    AUTO = "auto"  # let the router decide
    LOCAL = "local"  # the local tier only
    CLOUD = "cloud"  # the cloud tier only


class Reason:
    """The machine-readable reasons a RoutingDecision carries (plain strings)."""

    PRIVATE = "private"  # a privacy rule matched: the request never leaves the device
    FORCED = "forced"  # the model name asked for one tier
    THRESHOLD_ONE = "threshold_one"  # threshold 1: always the cloud
    PROMPT_ROUTER = "prompt_router"  # the prompt scorer judged the request too hard for the local tier
    LOW_CONFIDENCE = "low_confidence"  # running confidence fell below the threshold during generation
    REPETITION = "repetition"  # the local answer fell into an exact loop (sdk.engine_common.repetition.ESCALATE_LOOP)
    INVALID_STRUCTURE = "invalid_structure"  # a structured local answer cannot fit (cut off by max_tokens)
    TOOL_CALLS = "tool_calls"  # the deployment's tool-call policy sends tool-choosing turns to the cloud
    FINAL_CHECK = "final_check"  # the verifier of the complete local answer rejected it
    CONFIDENT = "confident"  # the local answer passed every check that ran
    NO_POLICY = "no_policy"  # no policy had an opinion: local by default


@dataclass(frozen=True)
class RoutingDecision:
    """One routing outcome; the response's routing metadata is built from it."""

    tier: Tier  # who answers (or finishes answering)
    escalated: bool  # the router moved an "auto" request to the cloud (a forced cloud request is not escalated)
    reason: str  # a Reason value
    confidence: float | None = None  # the (calibrated) confidence the decision was based on, if any
    decided_at_token: int | None = None  # local tokens generated when it was decided; None before generation
    handoff: HandoffMode | None = None  # how the cloud took over, for escalations after local tokens
    detail: str = ""  # a short human-readable explanation (matched rules, scores)
    decided_by: str = ""  # the name of the policy that decided

    def __post_init__(self) -> None:
        if self.escalated and self.tier is not Tier.CLOUD:
            raise ValueError("an escalated decision must route to the cloud tier")
        if self.handoff is not None and not self.escalated:
            raise ValueError("only an escalation hands a request off to the cloud")

    def with_handoff(self, mode: HandoffMode) -> RoutingDecision:
        """The same decision, saying how the cloud took over (known once the hold-back buffer escalated)."""
        return dataclasses.replace(self, handoff=mode)


def validate_threshold(threshold: float) -> float:
    """The threshold as a float; ValueError unless it is a number in [0, 1]."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise ValueError(f"threshold must be a number in [0, 1], got {threshold!r}")
    if not 0.0 <= threshold <= 1.0:  # also refuses NaN
        raise ValueError(f"threshold must be in [0, 1] (0 never escalates, 1 always does), got {threshold!r}")
    return float(threshold)


def should_escalate(confidence: float, threshold: float) -> bool:
    """The one threshold rule (module docstring). A NaN confidence (nothing to judge,
    e.g. an empty answer) counts as not confident: it escalates unless threshold is 0."""
    if threshold <= 0.0:
        return False
    if threshold >= 1.0:
        return True
    return math.isnan(confidence) or confidence < threshold


def threshold_decision(
    confidence: float,
    threshold: float,
    *,
    escalate_reason: str,
    decided_at_token: int,
    what: str,
    decided_by: str,
    suffix: str = "",
) -> RoutingDecision:
    """Apply should_escalate and say so: cloud with `escalate_reason`, or local as confident."""
    escalate = should_escalate(confidence, threshold)
    comparison = "vs" if escalate else ">="
    return RoutingDecision(
        tier=Tier.CLOUD if escalate else Tier.LOCAL,
        escalated=escalate,
        reason=escalate_reason if escalate else Reason.CONFIDENT,
        confidence=confidence,
        decided_at_token=decided_at_token,
        detail=f"{what} {confidence:.4f} {comparison} threshold {threshold:g}{suffix}",
        decided_by=decided_by,
    )


class ModelChoiceError(InvalidRequestError, ValueError):
    """The model name is not one the router understands (HTTP 400 on param "model")."""

    def __init__(self, message: str):
        super().__init__(message, "model")


_VALID_FORMS = '"auto", "local", "cloud" or "auto:<threshold in [0, 1]>" such as "auto:0.35"'


def parse_model_choice(model: str) -> tuple[RoutingMode, float | None]:
    """(mode, threshold) from a model name; the threshold is None unless "auto:<t>" set one."""
    if not isinstance(model, str):
        raise ModelChoiceError(f"model must be a string: {_VALID_FORMS}; got {model!r}")
    name, has_colon, threshold_text = model.strip().lower().partition(":")
    try:
        mode = RoutingMode(name)
    except ValueError:
        raise ModelChoiceError(f"unknown model {model!r}; use {_VALID_FORMS}") from None
    if not has_colon:
        return mode, None
    if mode is not RoutingMode.AUTO:
        raise ModelChoiceError(f'model {model!r}: a threshold only applies to "auto" (the router); use "{mode}" alone')
    try:
        threshold = float(threshold_text)
    except ValueError:
        raise ModelChoiceError(f"model {model!r}: {threshold_text!r} is not a number; use {_VALID_FORMS}") from None
    if not 0.0 <= threshold <= 1.0:  # also refuses nan and inf
        raise ModelChoiceError(f"model {model!r}: the threshold must be in [0, 1] (0 never escalates, 1 always does)")
    return mode, threshold
