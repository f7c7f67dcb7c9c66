"""The policy that watches the local answer as it streams and escalates early.

Escalating at token 20 instead of after 500 saves the local work and lets a restart
happen before the client has seen anything (see router.hold_back). One instance
follows one request: feed it every local TokenEvent in order, then call finish().
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np

from confidence import DEFAULT_WINDOW, FEATURE_NAMES, RunningConfidence
from router.decision import (
    Reason,
    RoutingDecision,
    StrChoice,
    Tier,
    threshold_decision,
    validate_threshold,
)
from sdk.protocol.engine import TokenEvent
from sdk.engine_common.repetition import ESCALATE_LOOP, LoopRule

# Features that are already probability-like in [0, 1] and grow with confidence, so a
# [0, 1] threshold means something without a calibrator. The others (log-probabilities,
# entropies, counts) need a calibrator that maps them to P(acceptable).
UNCALIBRATED_SCORE_KINDS = frozenset(
    name
    for name in FEATURE_NAMES
    if name not in ("num_tokens", "mean_logprob", "mean_entropy", "max_entropy", "repeated_ngram_fraction")
)


class DecideAt(StrChoice):
    """When the streaming policy compares its confidence with the threshold."""

    FIRST_K = "first_k"  # once, at token K; a pass there settles the request as local
    EVERY_TOKEN = "every_token"  # at every token from K on: escalate as soon as it dips
    END = "end"  # once, when the local answer is complete


class Calibrator(Protocol):
    """Maps raw scores to P(acceptable), like confidence.PlattCalibrator and IsotonicCalibrator."""

    def predict(self, scores) -> np.ndarray: ...


class StreamingPolicy:
    """Escalates when the (calibrated) running confidence falls below the threshold.

    No decision is taken before `min_tokens_k` tokens (the first tokens say little);
    an answer that ends sooner is judged once, at its end, on all of its tokens. The
    threshold rule is router.decision.should_escalate: threshold 0 never escalates,
    threshold 1 always does (at token K, or at the end of a shorter answer).

    A loop escalates whatever the confidence (a looping answer is often confident): once
    the answer's tail repeats one unit by `loop_rule`, at any token, unless the request is
    already settled or the threshold is 0. None turns this off (ignore_eos, constrained
    output, or a request that sent repetition_stop false).

    A structured answer (`structured`: a grammar constrains it) that max_tokens cuts off cannot
    parse: it escalates as invalid_structure, whatever the confidence, unless already settled.
    """

    name = "streaming"

    def __init__(
        self,
        threshold: float,
        min_tokens_k: int,
        score_kind: str = "mean_prob",
        calibrator: Calibrator | None = None,
        decide_at: DecideAt | str = DecideAt.EVERY_TOKEN,
        window: int = DEFAULT_WINDOW,
        score_fn: Callable[[Mapping[str, float]], float] | None = None,
        loop_rule: LoopRule | None = ESCALATE_LOOP,
        structured: bool = False,
    ):
        if isinstance(min_tokens_k, bool) or not isinstance(min_tokens_k, int) or min_tokens_k < 1:
            raise ValueError(
                f"min_tokens_k must be an integer >= 1 (tokens before the first decision), got {min_tokens_k!r}"
            )
        if score_kind not in FEATURE_NAMES:
            raise ValueError(f"unknown score_kind {score_kind!r}; choose one of {', '.join(FEATURE_NAMES)}")
        if score_fn is not None and calibrator is not None:
            raise ValueError("score_fn already returns P(acceptable); it takes no calibrator")
        if calibrator is None and score_fn is None and score_kind not in UNCALIBRATED_SCORE_KINDS:
            raise ValueError(
                f"score_kind {score_kind!r} is not a confidence in [0, 1]; pass a calibrator fitted "
                f"to map it to P(acceptable), or use one of {', '.join(sorted(UNCALIBRATED_SCORE_KINDS))}"
            )
        try:
            self.decide_at = DecideAt(decide_at)  # when the threshold is applied
        except ValueError:
            raise ValueError(f"decide_at must be one of {[d.value for d in DecideAt]}, got {decide_at!r}") from None
        self.threshold = validate_threshold(threshold)  # escalate iff confidence < threshold (0 never, 1 always)
        self.min_tokens_k = min_tokens_k  # tokens generated before the first decision
        self.score_kind = score_kind  # the FEATURE_NAMES entry the confidence is read from
        self.calibrator = calibrator  # raw score -> P(acceptable); None uses the raw score
        # All running features -> P(acceptable) (a learned probe); replaces score_kind when set.
        self.score_fn = score_fn
        self.running = RunningConfidence(window)  # features of the tokens seen so far
        self.loop_rule = loop_rule  # when a repeating tail escalates; None: loops are not judged
        self.structured = structured  # a grammar constrains the answer: one cut off by max_tokens cannot fit
        self._decision: RoutingDecision | None = None  # settled early: an escalation, or a pass at K
        self._finished = False

    @property
    def decision(self) -> RoutingDecision | None:
        """The decision taken so far (None while the request is still open)."""
        return self._decision

    def confidence(self) -> float:
        """The (calibrated) confidence of the tokens seen so far; NaN before the first token."""
        if self.score_fn is not None:
            if self.running.num_tokens == 0:
                return math.nan
            score = float(self.score_fn(self.running.features_dict()))
            if not math.isnan(score) and not 0.0 <= score <= 1.0:
                raise ValueError(f"score_fn must return a probability in [0, 1], got {score!r}")
            return score
        raw = self.running.score(self.score_kind)
        if self.calibrator is None or math.isnan(raw):
            return raw
        return float(np.asarray(self.calibrator.predict(np.array([raw])), dtype=np.float64).reshape(-1)[0])

    def observe(self, event: TokenEvent) -> RoutingDecision | None:
        """Take the next local token; returns an escalation, or None to keep streaming."""
        if self._finished:
            raise RuntimeError("this local answer is finished; use a new StreamingPolicy per request")
        if self._decision is not None and self._decision.escalated:
            raise RuntimeError(
                f"already escalated at token {self._decision.decided_at_token}; stop feeding local tokens"
            )
        self.running.update(event)  # skips tokens a grammar forced: only the model's own choices are judged
        num_tokens = self.running.num_tokens
        if self._decision is None and (loop := self._loop()) is not None:
            self._decision = loop
            return loop
        if self._decision is None and self.structured and event.finish_reason == "length" and self.threshold > 0.0:
            self._decision = RoutingDecision(
                tier=Tier.CLOUD,
                escalated=True,
                reason=Reason.INVALID_STRUCTURE,
                confidence=self.confidence(),
                decided_at_token=self.running.num_seen,
                decided_by=self.name,
                detail=f"the structured answer was cut off by max_tokens after {self.running.num_seen} tokens: "
                "it cannot parse",
            )
            return self._decision
        if (
            event.forced
            or self._decision is not None
            or num_tokens < self.min_tokens_k
            or self.decide_at is DecideAt.END
        ):
            return None  # a forced token changes nothing to judge
        if self.decide_at is DecideAt.FIRST_K and num_tokens > self.min_tokens_k:
            return None
        decision = self._judge()
        if decision.escalated or self.decide_at is DecideAt.FIRST_K:
            self._decision = decision
        return decision if decision.escalated else None

    def finish(self) -> RoutingDecision:
        """The decision for the complete local answer (an earlier one if it was settled)."""
        self._finished = True
        if self._decision is None:
            self._decision = self._judge()
        return self._decision

    def _loop(self) -> RoutingDecision | None:
        """An escalation if the answer so far ends in a loop by loop_rule (never at threshold 0)."""
        if self.loop_rule is None or self.threshold == 0.0:
            return None
        loop = self.running.repetition.loop(self.loop_rule)
        if loop is None:
            return None
        return RoutingDecision(
            tier=Tier.CLOUD,
            escalated=True,
            reason=Reason.REPETITION,
            confidence=self.confidence(),
            decided_at_token=self.running.num_seen,
            decided_by=self.name,
            detail=f"the last {loop.span} tokens repeat a {loop.period}-token unit",
        )

    def _judge(self) -> RoutingDecision:
        confidence = self.confidence()
        num_tokens = self.running.num_tokens
        return threshold_decision(
            confidence,
            self.threshold,
            escalate_reason=Reason.LOW_CONFIDENCE,
            decided_at_token=self.running.num_seen,
            what=f"{'probe' if self.score_fn else self.score_kind} confidence",
            decided_by=self.name,
            suffix=f" after {num_tokens} tokens",
        )
