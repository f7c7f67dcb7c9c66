"""The cascade runner: one chat request (or one raw /v1/completions prompt) through the local tier, and the
cloud tier when the router escalates, with privacy, hand-off, circuit breaker and cost accounting.

    runner = CascadeRunner(local_engine, CloudClient("host:port"), CascadeConfig())
    async for event in runner.generate(messages, SamplingParams(max_tokens=64), model="auto:0.4"):
        ...  # event.text from either tier; the last event carries event.routing

The per-request flow lives in sdk.cascade.request; this module holds what requests share.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

from router.circuit_breaker import CircuitBreaker
from sdk.budgets.manager import BudgetManager
from router.costs import CostLedger, CostTable
from router.decision import parse_model_choice
from router.privacy import PrivacyRules, PrivacyVerdict
from sdk.cascade.device_drafts import DeviceDrafter
from router.privacy_counters import PrivacyCounters
from sdk.cascade.config import CascadeConfig
from sdk.cascade.counts import RouteCounter
from sdk.cascade.models import load_local_probe, load_prompt_scorer
from sdk.cascade.prompt import ChatPrompt, RawPrompt
from sdk.cascade.request import CascadeRequest
from sdk.cascade.traffic import ShadowSampling, TrafficRecorder
from sdk.cascade.types import CascadeEvent, CascadeResult, RoutingInfo, collect
from sdk.protocol.cloud_backend import CloudBackend
from sdk.protocol.engine import EngineProtocol, SamplingParams
from sdk.protocol.vocabulary import VOCABULARY_PROBE_TEXTS, same_token_ids, same_vocabulary

__all__ = ["CascadeConfig", "CascadeEvent", "CascadeResult", "CascadeRunner", "RoutingInfo", "collect"]


class CascadeRunner:
    """Routes requests between a local engine and an optional cloud client.

    Shared across requests: the privacy rules and counters, the circuit breaker (so
    failures of one request spare the next ones a doomed cloud call), the cost ledger and
    the routing counts (sdk.cascade.counts)."""

    def __init__(
        self,
        local: EngineProtocol,
        cloud: CloudBackend | None,
        config: CascadeConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,  # the breaker's clock; injectable for tests
        cloud_ready: Callable[[], bool] = lambda: True,  # False while an embedded cloud engine loads
        breaker: CircuitBreaker | None = None,  # shared with whatever else calls the tier (shadow sampling)
        budgets: BudgetManager | None = None,  # spend limits per key and user ([server] budgets_file)
        traffic: TrafficRecorder | None = None,  # the traffic record ([traffic] record)
        shadow: ShadowSampling | None = None,  # shadow calls on local answers ([traffic] shadow_fraction)
    ):
        self.local = local
        self.config = config or CascadeConfig()
        self.cloud: CloudBackend | None = None  # None: a device-only deployment; escalations degrade to local
        self.attach_cloud(cloud)
        self.cloud_ready = cloud_ready
        rules_config = {**self.config.privacy}
        rules_config.setdefault("redact_before_escalation", self.config.redact_before_escalation)
        self.privacy_rules = PrivacyRules.from_config(rules_config)
        self.privacy_counters = PrivacyCounters()
        self.breaker = breaker or breaker_for(self.config, clock)
        self.ledger = CostLedger(CostTable.from_config(self.config.prices))
        self.routes = RouteCounter()
        # The learned parts (sdk.cascade.models), loaded once: ONNX sessions shared by all requests.
        self.probe = load_local_probe(self.config.probe, local) if self.config.probe else None
        # Swapped whole by a background retrain (swap_prompt_scorer); each request reads it once.
        self.prompt_scorer = load_prompt_scorer(self.config.prompt_router) if self.config.prompt_router else None
        # The device drafting cloud answers (sdk.cascade.device_drafts), with draft_on_device.
        self.drafter = DeviceDrafter(local, self.config.draft_tokens) if self.config.draft_on_device else None
        self.budgets = budgets
        self.traffic = traffic
        self.shadow = shadow
        self._shared_vocabulary: bool | None = None  # settled by shares_vocabulary once the cloud has said

    def attach_cloud(self, cloud: CloudBackend | None) -> None:
        """The cloud tier requests escalate to from now on: given at construction, or later once an embedded
        cloud engine has loaded (sdk.assembly.cascade). ValueError for a tier this configuration cannot use."""
        if self.config.handoff == "continue" and cloud is not None and not cloud.supports_continuation:
            # Continuing needs the cloud to take the local token ids (a tandem.v1 server does).
            raise ValueError(f"{type(cloud).__name__} cannot continue a local answer; use handoff='restart'")
        self.cloud = cloud
        self._shared_vocabulary = None  # another tier: its vocabulary is asked again

    def swap_prompt_scorer(self, fresh, replacing=None) -> bool:
        """Serve the prompt router `fresh` from the next request on (a retrained or adopted one, loaded whole:
        sdk.traffic.retrain); with `replacing`, only if that one is still serving. Whether it was swapped."""
        if replacing is not None and self.prompt_scorer is not replacing:
            return False
        self.prompt_scorer = fresh
        return True

    async def shares_vocabulary(self) -> bool:
        """Whether token ids mean the same on both tiers, so logit_bias may go to either and a
        continuation may hand the local tokens over (vocabulary_verdict is True). No cloud: True."""
        return await self.vocabulary_verdict() is True

    async def vocabulary_verdict(self) -> bool | None:
        """Whether both tiers share one vocabulary: the local model's fingerprint against the cloud
        model's (sdk.protocol.vocabulary), else, for a cloud that gives none (vLLM), the two tokenizers'
        ids for VOCABULARY_PROBE_TEXTS. None: the cloud cannot say now (unreachable, loading) or at all
        (no fingerprint, no /tokenize); a definite answer is kept."""
        if self.cloud is None:
            return True
        if self._shared_vocabulary is not None:
            return self._shared_vocabulary
        try:
            models = await self.cloud.list_models(timeout_s=5.0)
        except Exception:  # noqa: BLE001  (any failure means "not known")
            return None
        wanted = self.config.cloud_model
        card = next((m for m in models if m.id == wanted), None) if wanted else (models[0] if models else None)
        if card is None:
            return None
        if card.vocabulary_fingerprint:
            local = await asyncio.to_thread(
                lambda: self.local.vocabulary_fingerprint
            )  # first read walks the vocabulary
            self._shared_vocabulary = same_vocabulary(local, card.vocabulary_fingerprint)
        else:
            cloud_ids = await self.cloud.tokenize(VOCABULARY_PROBE_TEXTS, timeout_s=5.0)
            local_ids = [self.local.tokenize(text, add_special=False) for text in VOCABULARY_PROBE_TEXTS]
            self._shared_vocabulary = same_token_ids(local_ids, cloud_ids)
        return self._shared_vocabulary

    @property
    def redact_before_escalation(self) -> bool:
        return self.privacy_rules.config.redact_before_escalation

    async def generate(
        self,
        messages: Sequence | RawPrompt,
        params: SamplingParams,
        model: str = "auto",
        private: bool = False,
        request_id: str | None = None,
        tool_choice: str | None = None,
        streamed: bool = True,
        key_fingerprint: str | None = None,
        user: str | None = None,
        verdict: PrivacyVerdict | None = None,
    ) -> AsyncIterator[CascadeEvent]:
        """Stream the answer (module docstring) to chat `messages`, or to a /v1/completions prompt given as
        an sdk.cascade.prompt.RawPrompt (continued as it is, without a chat template). Raises
        InvalidRequestError (400) for a bad model name or a request the cloud calls invalid; cloud outages
        never raise.
        `streamed=False` (a caller that only wants the whole answer) holds every local token
        until the router has decided, instead of committing after CascadeConfig.hold_tokens.
        `key_fingerprint`: whose request it is, for the traffic record (feedback must come from the same key)
        and the budgets; `user`: the request's OpenAI `user` (per-user budgets). Over a hard budget, model
        `cloud` raises BudgetExhaustedError (429) and `auto` answers locally (degraded `budget_exhausted`).
        `verdict`: the request's privacy verdict when its front door made it (sdk.cascade.openai.prepare_routed),
        so what it decides elsewhere (storing) is what routes it; else it is made here, on `messages`."""
        mode, threshold = parse_model_choice(model)  # ModelChoiceError is an InvalidRequestError (400)
        if threshold is None:
            threshold = self.config.default_threshold
        request = CascadeRequest(
            self,
            messages if isinstance(messages, RawPrompt) else ChatPrompt(messages),
            params,
            mode,
            threshold,
            private,
            request_id or f"cascade-{uuid.uuid4().hex}",
            tool_choice,
            streamed,
            key_fingerprint,
            model,
            user,
            verdict,
        )
        async for event in request.run():
            yield event

    async def complete(self, messages: Sequence, params: SamplingParams, **kwargs) -> CascadeResult:
        """The whole answer at once (see generate for the arguments)."""
        return await collect(self.generate(messages, params, streamed=False, **kwargs))


def breaker_for(config: CascadeConfig, clock: Callable[[], float] = time.monotonic) -> CircuitBreaker:
    """The circuit breaker of a cascade's cloud tier, as `config` sets it (one per tier: whatever calls it shares
    it, so a failing tier is spared every caller's calls)."""
    return CircuitBreaker(config.breaker_failure_threshold, config.breaker_cool_down_s, clock)
