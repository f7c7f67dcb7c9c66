"""The router: decides, per request, whether the local answer stands or the cloud answers.

Pure decision logic; the cascade that drives the two tiers with it comes next.
- Decisions and the `model` grammar ("auto", "local", "cloud", "auto:0.35"): `decision`.
- Policies before, during and after generation, composed into a per-request `Cascade`:
  `pre_generation`, `streaming_policy`, `post_generation`, `policy`.
- Hand-off of a streamed answer (restart holds local tokens back; continue sends the
  accepted prefix): `hold_back`.
- Privacy rules, PII detectors and redaction: `privacy`, `pii_detectors`, `redaction`.
- Failure handling: `circuit_breaker`, `retry`, `failure_kinds`; cost accounting: `costs`.
"""

from router.circuit_breaker import BreakerState, CircuitBreaker, CircuitOpenError
from router.costs import CostLedger, CostTable, RequestCost, TierPrices, TierUsage
from router.decision import (
    HandoffMode,
    ModelChoiceError,
    Reason,
    RoutingDecision,
    RoutingMode,
    Tier,
    parse_model_choice,
    should_escalate,
    validate_threshold,
)
from router.failure_kinds import RETRYABLE_KINDS, FailureKind, classify_failure
from router.hold_back import HandoffPlan, HoldBackBuffer
from router.policy import (
    Cascade,
    DecideAt,
    ForcedTier,
    PostGenerationPolicy,
    PreGenerationPolicy,
    PrivateFirst,
    PromptRouterPolicy,
    RequestContext,
    StreamingPolicy,
    ThresholdOnePolicy,
    compose,
)
from router.privacy import PRIVATE_FLAG_REASON, PrivacyConfig, PrivacyMatch, PrivacyRules, PrivacyVerdict
from router.privacy_counters import PrivacyCounters, PrivacySnapshot
from router.redaction import Redaction
from router.retry import retry_with_backoff
from router.user_patterns import PrivacyConfigError

__all__ = [
    "BreakerState",
    "CircuitBreaker",
    "CircuitOpenError",
    "CostLedger",
    "CostTable",
    "RequestCost",
    "TierPrices",
    "TierUsage",
    "HandoffMode",
    "ModelChoiceError",
    "Reason",
    "RoutingDecision",
    "RoutingMode",
    "Tier",
    "parse_model_choice",
    "should_escalate",
    "validate_threshold",
    "RETRYABLE_KINDS",
    "FailureKind",
    "classify_failure",
    "HandoffPlan",
    "HoldBackBuffer",
    "Cascade",
    "DecideAt",
    "ForcedTier",
    "PostGenerationPolicy",
    "PreGenerationPolicy",
    "PrivateFirst",
    "PromptRouterPolicy",
    "RequestContext",
    "StreamingPolicy",
    "ThresholdOnePolicy",
    "compose",
    "PRIVATE_FLAG_REASON",
    "PrivacyConfig",
    "PrivacyMatch",
    "PrivacyRules",
    "PrivacyVerdict",
    "PrivacyCounters",
    "PrivacySnapshot",
    "Redaction",
    "retry_with_backoff",
    "PrivacyConfigError",
]
