"""One request through the cascade (sdk.cascade): route, stream, hand off, fall back.

Cloud failure policy: the breaker is asked *before* the local request is stopped, so a
refused escalation simply lets the local answer go on (degraded, nothing re-run). A cloud
call that fails before its first token resumes the local answer where it stopped: the
prompt plus every local token generated so far is sent back to the local engine
(llama.cpp reuses the cached prefix), and the held-back tokens are released first. A cloud
stream that fails after tokens reached the client is finished by the local model: it goes
on after the text the client already has (re-tokenized with its own vocabulary), so the
app still gets a whole answer, marked degraded, and nothing it saw is taken back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator

from router.decision import HandoffMode, Reason, RoutingDecision, RoutingMode, Tier
from router.hold_back import HandoffPlan, HoldBackBuffer
from router.policy import (
    ForcedTier,
    PrivateFirst,
    PromptRouterPolicy,
    RequestContext,
    StreamingPolicy,
    ThresholdOnePolicy,
    ToolTurns,
    compose,
)
from sdk.budgets.manager import BudgetExhaustedError
from sdk.cascade.budget_hold import BudgetHold
from sdk.cascade.cloud import (
    CloudFailed,
    CloudTimeouts,
    CloudUsage,
    capability_refusal,
    refusal_reason,
    stream_from_cloud,
)
from sdk.cascade.device_drafts import DraftedAnswer, DraftRounds, draft_refusal
from sdk.cascade.local import LocalRun
from sdk.cascade.prompt import CascadePrompt, ChatPrompt
from sdk.cascade.traffic import after_request
from sdk.cascade.types import CascadeEvent, RoutingInfo
from sdk.protocol.engine import ContextLengthError, SamplingParams, StateUnavailableError, TokenEvent
from sdk.engine_common.repetition import ESCALATE_LOOP

COMMITTED_LOCAL = "committed_local"  # an escalation came after restart-mode tokens were released
# The budgets' shared books could not be asked (or this replica is fenced from them): no cloud spend now.
STATE_DATABASE_UNAVAILABLE = "state_database_unavailable"


def escalates_loops(params: SamplingParams) -> bool:
    """Whether a local answer caught in a loop escalates: not when the request opted out, asked for
    every token (ignore_eos), or is structured (JSON repeats itself legitimately: `[0, 0, 0, ...`)."""
    return params.repetition_stop is not False and not params.ignore_eos and params.structured is None


class CascadeRequest:
    """The state of one request; `run()` streams its CascadeEvents."""

    def __init__(
        self,
        runner,
        prompt: CascadePrompt | list,  # chat messages, or sdk.cascade.prompt's ChatPrompt / RawPrompt
        params: SamplingParams,
        mode: RoutingMode,
        threshold: float,
        private: bool,
        request_id: str,
        tool_choice: str | None = None,
        streamed: bool = True,
        key_fingerprint: str | None = None,
        model: str = "auto",
        user: str | None = None,
        verdict=None,  # router.privacy.PrivacyVerdict: the front door's one verdict (CascadeRunner.generate)
    ):
        self.runner, self.config, self.params, self.request_id = runner, runner.config, params, request_id
        self.started = time.monotonic()
        self.key_fingerprint, self.model, self.user = key_fingerprint, model, user
        self.mode = mode
        self.budget = BudgetHold(runner.budgets, key_fingerprint, user)
        self.scorer = runner.prompt_scorer  # read once: a retrain may swap the runner's meanwhile
        self.router_outputs = None  # what the prompt router computed for this prompt, when it ran
        self.answer_parts: list[str] = []  # the text the client got (the record's and the shadow judge's)
        # A streamed answer commits local after a hold window so its client sees tokens early; a
        # non-streamed one is held until decided (its client waits for the end either way).
        self.hold_window = self.config.stream_hold_window() if streamed else None
        self.prompt = prompt if isinstance(prompt, CascadePrompt) else ChatPrompt(prompt)
        if verdict is None:
            verdict = self.prompt.verdict(runner.privacy_rules, private)
        elif private and not verdict.flagged_private:  # a caller's private flag is never dropped
            verdict = dataclasses.replace(verdict, private=True, flagged_private=True)
        self.verdict = verdict
        private = verdict.flagged_private  # one verdict: its flag is the request's
        # With redaction allowed, matching rules no longer keep the request local; the flag still does. A
        # prompt that cannot be redacted (token ids) stays local when a rule matches its text.
        may_redact = runner.redact_before_escalation and not self.verdict.flagged_private and self.prompt.redactable
        self.cloud_prompt, self.redactions = (
            self.prompt.redacted(runner.privacy_rules) if may_redact else (self.prompt.unredacted(), [])
        )
        kept_local_rules = () if may_redact else self.verdict.rule_names
        prompt_text = self.prompt.text  # the same texts the privacy rules read
        self.context = RequestContext(prompt_text, mode, flagged_private=private, tool_choice=tool_choice)
        pre = [
            PrivateFirst(lambda _text: kept_local_rules),
            ForcedTier(),
            ThresholdOnePolicy(threshold),
            ToolTurns(self.config.tool_calls, threshold),
        ]
        if self.scorer is not None:  # last: only requests the others leave open are scored
            router_threshold = self.config.prompt_router_threshold
            pre.append(
                PromptRouterPolicy(self._score_prompt, threshold if router_threshold is None else router_threshold)
            )
        probe = runner.probe
        self.cascade = compose(
            pre=pre,
            streaming=StreamingPolicy(
                threshold,
                self.config.min_tokens_k,
                self.config.score_kind,
                decide_at=self.config.decide_at,
                score_fn=probe.score_features if probe is not None else None,
                loop_rule=ESCALATE_LOOP if escalates_loops(params) else None,
                structured=params.structured is not None,
            ),
        )
        self.threshold = threshold
        self.cost = runner.ledger.new_request()
        self.local = LocalRun(runner.local, self.prompt, params, request_id)
        self.degraded_reason: str | None = None
        self.refused_as_committed = False
        self.draft_rounds: DraftRounds | None = None  # draft_on_device: how the device drafted the cloud answer
        self.draft_refused: str | None = None  # draft_on_device: why it did not
        self.handoff: HandoffMode | None = None
        self.answered_by = Tier.LOCAL
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None  # "repetition": the tier that answered stopped a loop
        self.local_committed = False  # the local answer is settled: its tokens go straight to the client

    def _score_prompt(self, text: str) -> float:
        self.router_outputs = self.scorer.outputs([text])
        return float(self.router_outputs.score[0])

    async def run(self) -> AsyncIterator[CascadeEvent]:
        if self.mode is RoutingMode.CLOUD and await self._budget_refusal() is not None:
            raise BudgetExhaustedError(self.budget.refused)
        try:
            async for event in self._run():
                if event.routing is None:
                    self.answer_parts.append(event.text)
                else:
                    after_request(self, event)
                yield event
        finally:
            self._settle_budget()  # also when the client left part-way: what was reserved is released

    async def _budget_refusal(self) -> str | None:
        """sdk.cascade.budget_hold: the cloud call's largest cost held before it is made, or why not."""

        async def num_prompt_tokens() -> int:
            return self.local.num_prompt_tokens or len(
                await self.prompt.local_tokens(self.runner.local, self.cloud_prompt)
            )

        cloud_only = self.mode is RoutingMode.CLOUD
        try:
            return await self.budget.refusal(num_prompt_tokens, self.cost, self.params.max_tokens, cloud_only)
        except StateUnavailableError:
            if cloud_only:
                raise  # model cloud: 503, nothing was answered yet
            return STATE_DATABASE_UNAVAILABLE  # auto: the local answer stands (or is given), degraded

    def _settle_budget(self) -> None:
        self.budget.settle(self.cost)

    async def _run(self) -> AsyncIterator[CascadeEvent]:
        if self.scorer is not None:
            # The prompt router runs ONNX for ~20 ms: off the event loop, which serves other streams meanwhile.
            pre = await asyncio.to_thread(self.cascade.before_generation, self.context)
        else:
            pre = self.cascade.before_generation(self.context)
        if pre is not None and pre.tier is Tier.CLOUD:
            async for event in self._cloud_then_fallback(plan=None):
                yield event
        else:
            async for event in self._local_first(pre):
                yield event
        yield CascadeEvent("", None, self.answered_by.value, self.finish_reason, self._routing_info(), self.stop_reason)

    async def _local_first(self, pre: RoutingDecision | None) -> AsyncIterator[CascadeEvent]:
        buffer = HoldBackBuffer(self.config.handoff, self.hold_window)
        if pre is not None or self.threshold == 0.0:
            self._settle_local(buffer)  # nothing can escalate: stream the local tokens as they come
        observing, escalation = True, None
        async for event in self.local.stream():
            if observing and (escalation := self.cascade.observe(event)) is not None:
                if await self._may_hand_off(buffer):
                    break
                observing, escalation = False, None  # refused: keep the local answer, stop judging it
                for held in self._settle_local(buffer):
                    yield held
            for released in self._release(buffer, event):
                yield released
            self._ended_by(event)
        if escalation is None and observing:
            decision = self.cascade.finish()  # the short-answer or decide_at="end" verdict
            if decision.escalated and await self._may_hand_off(buffer):
                escalation = decision
        if escalation is None:
            for held in self._settle_local(buffer):
                yield held
            return
        await self.local.stop()
        async for event in self._cloud_then_fallback(plan=buffer.escalate()):
            yield event

    def _ended_by(self, event: TokenEvent) -> None:
        """Note the latest engine event's finish (None until the last one)."""
        self.finish_reason, self.stop_reason = event.finish_reason, event.stop_reason

    async def _may_hand_off(self, buffer: HoldBackBuffer) -> bool:
        """Whether an escalation can go ahead; if not, note why (the local answer stands)."""
        if not buffer.can_escalate:
            self.refused_as_committed = True
            return False
        # The budget before the breaker: a half-open breaker's trial call must not be taken and then not made.
        continuing = self.config.handoff == HandoffMode.CONTINUE.value
        self.degraded_reason = await self._budget_refusal() or await self._refusal(continuing)
        return self.degraded_reason is None

    async def _refusal(self, continuing: bool = False) -> str | None:
        """Why the cloud must not take this request now, or None. `continuing`: the cloud would go on
        after the local answer's tokens (handoff "continue"). What the cloud cannot take comes first:
        refusal_reason may take a half-open breaker's trial call."""
        runner = self.runner
        return await capability_refusal(
            runner, self.params.structured, continuing, self.config.cloud_first_token_timeout_s, self.prompt
        ) or refusal_reason(runner.cloud, runner.breaker, runner.cloud_ready())

    def _release(self, buffer: HoldBackBuffer, event) -> list[CascadeEvent]:
        # Call order (router.hold_back): the router has seen this token and did not escalate.
        pushed = [event] if self.local_committed else buffer.push(event)
        return [CascadeEvent(e.text, e.token_id, Tier.LOCAL.value) for e in pushed]

    def _settle_local(self, buffer: HoldBackBuffer) -> list[CascadeEvent]:
        if self.local_committed:
            return []
        self.local_committed = True
        return [CascadeEvent(e.text, e.token_id, Tier.LOCAL.value) for e in buffer.commit_local()]

    async def _cloud_then_fallback(self, plan: HandoffPlan | None) -> AsyncIterator[CascadeEvent]:
        """Call the cloud (plan None: before any local token); fall back to local on failure."""
        if plan is not None:
            self.handoff = plan.mode  # _may_hand_off already asked the breaker
        else:
            self.degraded_reason = await self._budget_refusal() or await self._refusal()
        num_cloud_tokens, cloud_text = 0, []
        if self.degraded_reason is None:
            if self.redactions:
                self.runner.privacy_counters.record_redacted(len(self.redactions))
            prefix = plan.prefix_token_ids if plan is not None and plan.prefix_token_ids else ()
            params = dataclasses.replace(self.params, max_tokens=max(1, self.params.max_tokens - len(prefix)))
            usage = CloudUsage()
            counted = False
            drafted = await self._drafting(params)
            cloud_prompt = self.cloud_prompt
            if drafted is not None and self.prompt.is_raw:  # the drafter reads token ids (the tiers share them)
                cloud_prompt = await self.prompt.local_tokens(self.runner.local, cloud_prompt)
            try:
                cloud_stream = stream_from_cloud(
                    self.runner.cloud,
                    self.runner.breaker,
                    cloud_prompt,
                    params,
                    usage,
                    model=self.config.cloud_model or "",
                    request_id=self.request_id,
                    continuation_token_ids=prefix,
                    timeouts=CloudTimeouts(
                        self.config.cloud_first_token_timeout_s,
                        self.config.cloud_stall_timeout_s,
                        self.config.cloud_deadline_s,
                    ),
                    drafted=drafted,
                )
                async for event in self._while_budget_holds(cloud_stream):
                    num_cloud_tokens += 1
                    cloud_text.append(event.text)
                    self.answered_by = Tier.CLOUD
                    self._ended_by(event)
                    yield CascadeEvent(event.text, event.token_id, Tier.CLOUD.value)
                self.cost.add("cloud", usage.prompt_tokens, usage.completion_tokens)
                counted = True
                return
            except CloudFailed as failure:
                self.degraded_reason = failure.reason
                self.cost.add("cloud", usage.prompt_tokens, usage.completion_tokens)
                counted = True
            finally:
                if not counted:  # the client left mid-stream: what the cloud spent so far still counts (budgets)
                    self.cost.add("cloud", usage.prompt_tokens, usage.completion_tokens)
            if num_cloud_tokens:
                async for event in self._take_over(plan, "".join(cloud_text), num_cloud_tokens):
                    yield event
                return
        async for event in self._resume_local(plan):
            yield event

    async def _while_budget_holds(self, events: AsyncIterator) -> AsyncIterator:
        """The cloud's events until this replica is fenced from the shared books (sdk.budgets.postgres_ledger):
        then the call is closed at its next token (CloudFailed), before the reservation it spends against can be
        deleted by the other replicas, and the local model finishes the answer."""
        async with contextlib.aclosing(events):
            async for event in events:
                if not self.budget.holds:
                    raise CloudFailed(STATE_DATABASE_UNAVAILABLE)
                yield event

    async def _drafting(self, params: SamplingParams):
        """With draft_on_device, the DeviceDrafter stream this cloud answer goes through (its rounds kept for
        the `tandem` extension), or None with the reason noted: the answer is then the cloud's alone."""
        drafter = self.runner.drafter
        if drafter is None:
            return None
        refused = draft_refusal(params)
        if refused is None and not self.runner.cloud.verifies_drafts:
            refused = "cloud_not_tandem"
        if refused is None and await self.runner.vocabulary_verdict() is not True:
            refused = "cloud_vocabulary_differs"
        if refused is not None:
            self.draft_refused = refused
            return None
        self.draft_rounds = DraftRounds()
        return DraftedAnswer(drafter, self.draft_rounds)

    async def _take_over(
        self, plan: HandoffPlan | None, cloud_text: str, num_cloud_tokens: int
    ) -> AsyncIterator[CascadeEvent]:
        """The local model finishes an answer whose cloud stream broke off part-way."""
        self.answered_by = Tier.LOCAL
        if self.finish_reason is not None:
            return  # the cloud's last token came through; only its trailing status was lost
        prefix_text = (plan.prefix_text or "") if plan is not None else ""
        num_emitted = (plan.num_released_tokens if plan is not None else 0) + num_cloud_tokens
        try:
            async for event in self.local.take_over(prefix_text + cloud_text, num_emitted):
                yield CascadeEvent(event.text, event.token_id, Tier.LOCAL.value)
                self._ended_by(event)
        except ContextLengthError:
            pass  # the answer so far fills the local context: it ends here, as if at max_tokens
        if self.finish_reason is None:
            self.finish_reason = "length"

    async def _resume_local(self, plan: HandoffPlan | None) -> AsyncIterator[CascadeEvent]:
        """The local answer after a failed hand-off: what the client has not seen, then the rest."""
        self.answered_by = Tier.LOCAL
        already_released = plan.num_released_tokens if plan is not None else 0
        for event in self.local.events[already_released:]:
            yield CascadeEvent(event.text, event.token_id, Tier.LOCAL.value)
            self._ended_by(event)
        async for event in self.local.resume():
            yield CascadeEvent(event.text, event.token_id, Tier.LOCAL.value)
            self._ended_by(event)

    def _routing_info(self) -> RoutingInfo:
        decision = self.cascade.finish()
        escalated = decision.escalated and not self.refused_as_committed
        if decision.reason == Reason.PRIVATE:
            self.runner.privacy_counters.record_kept_local(self.verdict.reasons, self.prompt.text_length)
        info = RoutingInfo(
            tier=self.answered_by.value,
            escalated=escalated,
            reason=COMMITTED_LOCAL if self.refused_as_committed else decision.reason,
            confidence=decision.confidence,
            decided_at_token=decision.decided_at_token,
            handoff=self.handoff.value if self.handoff is not None else None,
            degraded=self.degraded_reason is not None,
            degraded_reason=self.degraded_reason,
            privacy_reasons=self.verdict.reasons if decision.reason == Reason.PRIVATE else (),
            num_redactions=len(self.redactions) if self.answered_by is Tier.CLOUD else 0,
            decided_by=decision.decided_by,
            detail=decision.detail,
            cost=self.cost.as_dict(),
            drafts=self.draft_rounds.as_dict() if self.draft_rounds is not None else None,
            draft_refused=self.draft_refused,
        )
        if self.local.prompt_token_ids is not None:  # the local tier ran (resumed tokens included)
            self.cost.add("local", self.local.num_prompt_tokens, self.local.num_generated)
        info.cost = self.cost.as_dict()
        self.runner.ledger.record(self.cost)
        self._settle_budget()
        self.runner.routes.record(info)
        return info
