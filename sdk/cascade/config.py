"""Settings of the cascade runner (sdk.cascade): one validated dataclass, whose fields declare the
[cascade] settings (sdk.protocol.config_fields; env variables TANDEM_CASCADE_<KEY> unless named)."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

from confidence import FEATURE_NAMES
from router.costs import CostTable
from router.decision import HandoffMode, validate_threshold
from router.privacy import PrivacyRules
from router.streaming_policy import UNCALIBRATED_SCORE_KINDS, DecideAt
from sdk.protocol.config_fields import at_least, one_of, setting

logger = logging.getLogger("tandem.cascade")

# bench.stream_hold (bench/results/stream_hold.json): at threshold 0.5, 24 of SmolLM2's 25
# low-confidence escalations came by token 16; a streamed answer's first token waits for the
# window (~16 decode steps: TTFT p50 1.05 s vs 2.47 s held until decided, at 4 clients).
DEFAULT_HOLD_TOKENS = 16


@dataclass
class CascadeConfig:
    """How one deployment routes between the local and the cloud tier."""

    default_threshold: float = setting(  # used when the model name is plain "auto"
        0.5, "Confidence below which a request escalates (model 'auto').", key="threshold", env="TANDEM_THRESHOLD"
    )
    min_tokens_k: int = setting(8, "Local tokens before the first judgement.")  # before the streaming policy judges
    score_kind: str = setting("mean_prob", "Confidence feature compared with the threshold.")
    decide_at: str = setting(  # router.streaming_policy.DecideAt value
        "every_token", "When the threshold is checked.", check=one_of(*(d.value for d in DecideAt))
    )
    handoff: str = setting(
        "restart",
        "restart (cloud answers anew) or continue (after the local prefix: a tandem gRPC cloud, or a vLLM cloud "
        "sharing the local vocabulary; elsewhere the local answer stands).",
        check=one_of(*(m.value for m in HandoffMode)),
    )
    # Streamed answers, restart mode: local tokens held back before the answer is committed local and
    # reaches the client (a restart after that would contradict it). None: DEFAULT_HOLD_TOKENS, or
    # min_tokens_k if larger; 0: hold until decided (the whole answer, with decide_at every_token).
    # A non-streamed answer is always held until decided: its client sees nothing before the end anyway.
    hold_tokens: int | None = setting(
        None,
        "Streamed answers, restart mode: local tokens held back before committing local (0: until decided).",
        unset=f"{DEFAULT_HOLD_TOKENS} (at least min_tokens_k)",
    )
    privacy: dict = setting(  # router.privacy.PrivacyRules.from_config input
        default_factory=dict,
        help="Privacy rules: detectors, patterns (router.privacy).",
        check=PrivacyRules.from_config,
        env=False,
    )
    redact_before_escalation: bool = setting(  # placeholders instead of keeping rule-matching requests local
        False, "Escalate privacy-matching requests redacted instead of keeping them local."
    )
    draft_on_device: bool = setting(
        False,
        "The device drafts, the cloud verifies: cloud answers (model cloud, and auto once it escalates) are drafted "
        "by the local model and verified by a tandem gRPC cloud with the same vocabulary; the answer is the cloud's "
        "own, for fewer cloud steps per token (docs/cascade-and-routing.md).",
    )
    draft_tokens: int = setting(
        4,
        "With draft_on_device: tokens the device drafts past the cloud's at first; each answer then adapts it "
        "(longer while the cloud takes whole drafts, shorter when it cuts them, up to 16).",
        check=at_least(1),
    )
    cloud_first_token_timeout_s: float = setting(
        15.0,
        "Longest wait for the cloud's first token, seconds; then the answer is local (degraded: "
        "cloud_first_token_timeout).",
        check=at_least(0, inclusive=False),
    )
    cloud_stall_timeout_s: float = setting(
        10.0,
        "Longest gap between two cloud tokens, seconds; then the local model finishes (cloud_stall_timeout).",
        check=at_least(0, inclusive=False),
    )
    cloud_deadline_s: float | None = setting(  # a long answer may stream on when unset
        None,
        "Deadline of one whole cloud stream, seconds (cloud_deadline).",
        check=at_least(0, inclusive=False),
        unset="none",
    )
    cloud_timeout_s: float | None = setting(  # the old whole-stream deadline
        None, "Deprecated: read as cloud_deadline_s, with a warning.", unset="not set"
    )
    breaker_failure_threshold: int = setting(3, "Consecutive cloud failures that open the circuit breaker.")
    breaker_cool_down_s: float = setting(30.0, "Seconds the breaker stays open before a trial call.")
    prices: dict = setting(  # router.costs.CostTable.from_config input
        default_factory=dict,
        help="USD per million tokens per tier (router.costs).",
        check=CostTable.from_config,
        env=False,
    )
    cloud_model: str | None = None  # model id on the cloud server ([cloud] model_name); None: the server's default
    probe: str | None = setting(
        None, "Confidence probe (ONNX) trained for the local model; replaces score_kind.", unset="no probe"
    )
    prompt_router: str | None = setting(
        None,
        "Prompt router before generation: 'default' (shipped) or a `tandem router train` file. Its score is the share "
        "of its reference prompts (the shipped router's: the design tables) it ranks lower.",
        unset="off",
    )
    prompt_router_threshold: float | None = setting(
        None,
        "Escalate before generation iff 1 - prompt score < this: the top this share of the router's reference prompts "
        "goes to the cloud.",
        unset="the request's threshold",
    )
    tool_calls: str = setting(  # router.pre_generation.ToolTurns
        "auto",
        "Where turns offering tools go: auto (tool_choice auto to the cloud, required local), local, or cloud.",
        check=one_of("auto", "local", "cloud"),
    )

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
