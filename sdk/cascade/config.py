"""Settings of the cascade runner (sdk.cascade): one validated dataclass."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

from confidence import FEATURE_NAMES
from router.decision import HandoffMode, validate_threshold
from router.streaming_policy import UNCALIBRATED_SCORE_KINDS, DecideAt

logger = logging.getLogger("tandem.cascade")

# bench.stream_hold (bench/results/stream_hold.json): at threshold 0.5, 24 of SmolLM2's 25
# low-confidence escalations came by token 16; a streamed answer's first token waits for the
# window (~16 decode steps: TTFT p50 1.05 s vs 2.47 s held until decided, at 4 clients).
DEFAULT_HOLD_TOKENS = 16


@dataclass
class CascadeConfig:
    """How one deployment routes between the local and the cloud tier."""

    default_threshold: float = 0.5  # used when the model name is plain "auto"
    min_tokens_k: int = 8  # local tokens before the streaming policy first judges
    score_kind: str = "mean_prob"  # the confidence feature compared with the threshold
    decide_at: str = "every_token"  # router.streaming_policy.DecideAt value
    handoff: str = "restart"  # "restart" (cloud answers anew) or "continue" (cloud goes on after the local prefix)
    # Streamed answers, restart mode: local tokens held back before the answer is committed local and
    # reaches the client (a restart after that would contradict it). None: DEFAULT_HOLD_TOKENS, or
    # min_tokens_k if larger; 0: hold until decided (the whole answer, with decide_at every_token).
    # A non-streamed answer is always held until decided: its client sees nothing before the end anyway.
    hold_tokens: int | None = None
    privacy: dict = field(default_factory=dict)  # router.privacy.PrivacyRules.from_config input
    redact_before_escalation: bool = (
        False  # escalate rule-matching requests with placeholders instead of keeping them local
    )
    cloud_first_token_timeout_s: float = 15.0  # longest wait for the cloud's first token
    cloud_stall_timeout_s: float = 10.0  # longest gap between two cloud tokens
    cloud_deadline_s: float | None = None  # of one whole cloud stream; None: none (a long answer may stream on)
    cloud_timeout_s: float | None = None  # deprecated: the old whole-stream deadline, taken as cloud_deadline_s
    breaker_failure_threshold: int = 3  # consecutive cloud failures that open the circuit breaker
    breaker_cool_down_s: float = 30.0  # how long the breaker stays open before a trial call
    prices: dict = field(default_factory=dict)  # router.costs.CostTable.from_config input
    cloud_model: str | None = None  # model id on the cloud server; None: the server's default
    probe: str | None = None  # confidence probe (ONNX) for the local model: replaces score_kind when set
    prompt_router: str | None = None  # "default" (shipped) or a `tandem router train` file; None: off
    prompt_router_threshold: float | None = (
        None  # escalate before generation iff 1 - score < it; None: the request's threshold
    )
    tool_calls: str = "auto"  # where turns offering tools go: auto / local / cloud (router.pre_generation.ToolTurns)

    def stream_hold_window(self) -> int | None:
        """Tokens a streamed answer holds back (router.hold_back); None: until decided, or (continue
        mode) nothing: tokens are released as they come."""
        if self.handoff == HandoffMode.CONTINUE.value:
            return None
        if self.hold_tokens is None:
            return max(DEFAULT_HOLD_TOKENS, self.min_tokens_k)
        return self.hold_tokens or None

    def __post_init__(self) -> None:
        self.default_threshold = validate_threshold(self.default_threshold)
        if isinstance(self.min_tokens_k, bool) or not isinstance(self.min_tokens_k, int) or self.min_tokens_k < 1:
            raise ValueError(f"min_tokens_k must be an integer >= 1, got {self.min_tokens_k!r}")
        if self.score_kind not in FEATURE_NAMES or self.score_kind not in UNCALIBRATED_SCORE_KINDS:
            # The runner has no calibrator, so only probability-like features make sense against [0, 1].
            raise ValueError(f"score_kind must be one of {sorted(UNCALIBRATED_SCORE_KINDS)}, got {self.score_kind!r}")
        self.decide_at = DecideAt(self.decide_at).value
        if self.tool_calls not in ("auto", "local", "cloud"):
            raise ValueError(f"tool_calls must be one of auto, local, cloud, got {self.tool_calls!r}")
        self.handoff = HandoffMode(self.handoff).value
        if self.hold_tokens is not None:
            if self.handoff == HandoffMode.CONTINUE.value:
                raise ValueError("hold_tokens applies to restart mode only; continue mode releases tokens as they come")
            bad = isinstance(self.hold_tokens, bool) or not isinstance(self.hold_tokens, int)
            if bad or (self.hold_tokens != 0 and self.hold_tokens < self.min_tokens_k):
                # A shorter window would commit local before the first decision at token K.
                raise ValueError(
                    f"hold_tokens must be 0 (hold until decided) or an integer >= min_tokens_k "
                    f"({self.min_tokens_k}), got {self.hold_tokens!r}"
                )
        if self.prompt_router_threshold is not None:
            self.prompt_router_threshold = validate_threshold(self.prompt_router_threshold)
        if self.cloud_timeout_s is not None:
            warnings.warn(
                "cascade.cloud_timeout_s is deprecated: it is read as cloud_deadline_s (a whole-stream "
                "deadline); see cloud_first_token_timeout_s and cloud_stall_timeout_s",
                DeprecationWarning,
                stacklevel=3,
            )
            logger.warning("cascade.cloud_timeout_s is deprecated; read as cloud_deadline_s = %s", self.cloud_timeout_s)
            if self.cloud_deadline_s is None:
                self.cloud_deadline_s = self.cloud_timeout_s
        for name in ("cloud_first_token_timeout_s", "cloud_stall_timeout_s", "cloud_deadline_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
        if self.breaker_failure_threshold < 1 or not self.breaker_cool_down_s >= 0:
            raise ValueError("breaker_failure_threshold must be >= 1 and breaker_cool_down_s >= 0")
