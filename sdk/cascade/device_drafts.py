"""The device drafts, the cloud verifies (issue 56): a cloud answer produced with the device's model
drafting the next tokens, so the cloud pays one step for several of its tokens while the answer
stays exactly its own (the cloud verifies each draft: cloud_engine.spec_decode.outside_drafts).

One call per answer: the cloud's GenerateWithDrafts (sdk.cloud.grpc_drafts) streams the cloud's
tokens; beside it a drafting request runs on the local engine (LocalEngine.rewind):

1. the drafter decodes up to k tokens past what the cloud has emitted, then is held there (its hold
   moves HOLD_CHUNK tokens at a time while the cloud agrees with it, so it stops within that many
   tokens once the cloud goes another way); each token
   it adds goes out at once as the draft from the cloud's tokens on (its start), replacing the one
   before, so every cloud step verifies all the device has drafted by then (the two overlap);
2. when the cloud's tokens go past or away from the draft, the drafter is rewound to the tokens the
   two agree on plus the cloud's own, and drafts the next k from there.

The drafter is rewound only while it is held, so every token it reports afterwards is fresh. The
cloud never waits for a draft: while the device drafts, it decodes on its own, and a draft that
arrives late is verified past what it already emitted. The prompt goes to the cloud as the device's
own token ids (the tiers share one vocabulary: CascadeRunner.vocabulary_verdict), so both continue
the same sequence.

A sampled answer's drafts carry the distribution each token was drawn from (the local sampler's
support, TokenEvent.draft_support), which the cloud's rejection rule reads as q: the answer stays in
the cloud's distribution and is accepted as often as the two models agree. The drafter samples with at
most DRAFT_SUPPORT_TOKENS candidates (its own top-k: any q is exact, so long as it is the one the token
was drawn from), so a draft stays a few hundred bytes. Greedy drafts go one-hot.

How many tokens a round (DraftLength): the draft grows while the cloud accepts all of it and shrinks
when it does not, plus the tokens the cloud emits on its own while a draft is in flight (the round
trip), which the draft must cover to reach anything the cloud has not yet decided. Drafting stops, and
the cloud streams on alone, when it does not pay: too few tokens accepted, or local requests waiting
for the device (drafting takes a slot of the local engine like any request; local answers come first).

The cloud bounds what it takes of a request's drafts (sdk.protocol.drafts: tokens a draft, support
entries a token, drafts a second, drafts it has not taken yet) and ends a call past them; the drafter
stays within its defaults: at most MAX_DRAFT_TOKENS a draft, DRAFT_SUPPORT_TOKENS a support, and half
the cloud's drafts a second (a draft held back goes out at the next chance, with all drafted by then).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from sdk.protocol.cloud_backend import CloudBackend, CloudTokenEvent
from sdk.protocol.drafts import DRAFTS_PER_SECOND, MAX_DRAFT_TOKENS, MAX_SUPPORT_TOKENS
from sdk.protocol.engine import GenerationRequest, SamplingParams

logger = logging.getLogger(__name__)

DEFAULT_DRAFT_TOKENS = 4
# MAX_DRAFT_TOKENS (sdk.protocol.drafts): the cloud verifies at most this many a round (its step grows with every row)
# The drafter's hold moves this many tokens at a time, raised before it is reached while the device's tokens
# start with all of the cloud's: a draft the cloud went away from is given up within this many tokens (a
# rewind waits for the hold, so that every token reported after it is fresh).
HOLD_CHUNK = 2
DRAFT_SUPPORT_TOKENS = MAX_SUPPORT_TOKENS  # the drafter's own top-k for sampled answers: each q has this many entries
# Drafts sent a second, in bursts of OFFER_BURST: half of what a cloud at its defaults takes, so that it never
# refuses them (a cloud step takes the latest draft only: more a second would not be verified anyway).
OFFERS_PER_SECOND = DRAFTS_PER_SECOND / 2
OFFER_BURST = OFFERS_PER_SECOND / 2
# Drafting stops once this many draft tokens were verified with fewer than MIN_ACCEPTANCE of them accepted:
# a verification step of k + 1 rows then costs the cloud more than the tokens it saves.
JUDGED_AFTER_TOKENS = 24
MIN_ACCEPTANCE = 0.25


@dataclass
class DraftRounds:
    """What drafting did for one answer (the `tandem` extension reports it)."""

    rounds: int = 0  # cloud steps that verified a draft (each emits its accepted tokens and one of its own)
    offers: int = 0  # drafts sent (each replaces the one before it, if the cloud has not yet taken that)
    drafted_tokens: int = 0  # tokens the device decoded to draft
    accepted_tokens: int = 0  # the cloud's count, from its last response
    verified_tokens: int = 0  # draft tokens the cloud verified (a late or dropped draft is never verified)
    stopped: str | None = None  # why drafting stopped before the answer ended, if it did
    draft_length: int = 0  # the last round's (DraftLength)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def draft_refusal(params: SamplingParams) -> str | None:
    """Why a request cannot be drafted for exactly (the cloud drafts nothing for it either), else None."""
    if params.uses_token_history or params.logit_bias or params.min_tokens:
        return "sampling_uses_token_history"
    return None


def drafter_params(params: SamplingParams, room: int) -> SamplingParams:
    """The drafting request's sampling: the answer's own distribution (temperature, top-p, min-p and its
    grammar) with at most DRAFT_SUPPORT_TOKENS candidates, `room` tokens, never stopping on its own (the cloud
    decides where the answer ends) unless a grammar ends it: a structured answer ends where its JSON does, on
    both tiers alike (ignore_eos is refused beside a grammar)."""
    top_k = DRAFT_SUPPORT_TOKENS if not params.top_k else min(params.top_k, DRAFT_SUPPORT_TOKENS)
    return SamplingParams(
        max_tokens=room,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=top_k,
        min_p=params.min_p,
        seed=params.seed,
        ignore_eos=params.structured is None,
        repetition_stop=False,
        structured=params.structured,
    )


def not_paying(rounds: DraftRounds, local) -> str | None:
    """Why drafting for an answer should stop before its next round, if it should: too few of its tokens
    accepted, or local answers waiting for a slot of the device (`local`: the drafting engine)."""
    if rounds.verified_tokens >= JUDGED_AFTER_TOKENS and rounds.accepted_tokens < MIN_ACCEPTANCE * (
        rounds.verified_tokens
    ):
        return "low_acceptance"
    stats = local.stats()
    if stats.num_waiting > stats.num_waiting_drafts:  # local answers waiting for a slot: they come first
        return "device_busy"
    return None


class DraftLength:
    """Tokens to draft next round: `accept` (what the cloud is expected to take: +2 after a round it took
    whole, -1 after one it cut short, as Hugging Face's assisted generation adapts) plus `lag` (a running
    mean of the tokens the cloud emitted on its own between sending a draft and verifying it)."""

    def __init__(self, k: int):
        self.accept = k
        self.lag = 0.0

    def next(self) -> int:
        return max(1, min(self.accept + round(self.lag), MAX_DRAFT_TOKENS))

    def verified(self, num_verified: int, num_accepted: int, lag: int) -> None:
        if num_accepted >= num_verified:
            self.accept = min(self.accept + 2, MAX_DRAFT_TOKENS)
        else:
            self.accept = max(1, self.accept - 1)
        self.lag = 0.7 * self.lag + 0.3 * lag


class _OfferPace:
    """A token bucket of OFFERS_PER_SECOND drafts a second, holding up to OFFER_BURST."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.tokens = OFFER_BURST
        self.updated = clock()
        self.held_back = False  # the last draft was not sent: send it once the bucket has a token

    def may_send(self) -> bool:
        now = self.clock()
        self.tokens = min(OFFER_BURST, self.tokens + (now - self.updated) * OFFERS_PER_SECOND)
        self.updated = now
        self.held_back = self.tokens < 1.0
        if not self.held_back:
            self.tokens -= 1.0
        return not self.held_back

    def wait_s(self) -> float | None:
        """How long until a held-back draft may go (None: none is held back)."""
        return (1.0 - self.tokens) / OFFERS_PER_SECOND if self.held_back else None


@dataclass
class _Shared:
    """The cloud's tokens as they arrive, for the drafting task."""

    tokens: list[int] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = False
    offered_at: int = 0  # the cloud's token count when the last draft was offered


@dataclass
class DraftedAnswer:
    """One cloud answer to be drafted for by `drafter`, what it did kept in `rounds` (the `tandem` extension)."""

    drafter: DeviceDrafter
    rounds: DraftRounds

    def stream(self, client: CloudBackend, prompt, params: SamplingParams, **call) -> AsyncIterator[CloudTokenEvent]:
        """The cloud's tokens through `client.generate_with_drafts`, the device drafting (DeviceDrafter.stream)."""
        return self.drafter.stream(client, prompt, params, rounds=self.rounds, **call)


class DeviceDrafter:
    """Cloud answers drafted by the local engine `local` (an AsyncLocalEngine), `k` tokens a round."""

    def __init__(self, local, k: int = DEFAULT_DRAFT_TOKENS):
        if k < 1:
            raise ValueError(f"draft tokens per round must be >= 1, got {k}")
        self.local = local
        self.k = k

    async def stream(
        self,
        client: CloudBackend,
        prompt: Sequence[dict] | Sequence[int],
        params: SamplingParams,
        *,
        rounds: DraftRounds,
        model: str = "",
        request_id: str = "",
        continuation_token_ids: Sequence[int] = (),
        timeout_s: float | None = None,
    ) -> AsyncIterator[CloudTokenEvent]:
        """The cloud's tokens for `prompt` (chat messages, or the device's token ids), drafted for."""
        prompt_ids = list(prompt) if prompt and isinstance(prompt[0], int) else self.local.apply_chat_template(prompt)
        continuation = list(continuation_token_ids)
        call = client.generate_with_drafts(
            prompt_ids,
            params,
            model=model,
            request_id=request_id,
            continuation_token_ids=continuation,
            timeout_s=timeout_s,
        )
        shared = _Shared()
        length = DraftLength(self.k)
        room = (self.local.max_model_len or 0) - len(prompt_ids) - len(continuation) - 1
        request = GenerationRequest(
            f"draft-{uuid.uuid4().hex[:12]}",
            prompt_ids + continuation,
            drafter_params(params, max(room, 1)),
            num_continuation_tokens=len(continuation),
        )
        drafting = asyncio.create_task(_Drafting(self.local, call, shared, length, rounds, request, room).run())
        try:
            async for event in call:
                if event.num_draft_tokens > rounds.verified_tokens:  # a draft was verified in this step
                    rounds.rounds += 1
                    length.verified(
                        event.num_draft_tokens - rounds.verified_tokens,
                        event.num_accepted_tokens - rounds.accepted_tokens,
                        len(shared.tokens) - shared.offered_at,
                    )
                shared.tokens.append(event.token_id)
                shared.changed.set()
                rounds.accepted_tokens = event.num_accepted_tokens
                rounds.verified_tokens = event.num_draft_tokens
                yield event
        finally:
            shared.finished = True
            shared.changed.set()
            drafting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await drafting
            call.cancel()


class _Drafting:
    """One answer's drafting request on the device, in rounds until the answer ends or drafting stops
    (`rounds.stopped` says why): decode up to the hold, offering each token; held, wait for the cloud's
    tokens; rewind to them when they leave the draft, or draft further while they agree."""

    def __init__(self, local, call, shared: _Shared, length: DraftLength, rounds, request, room):
        self.local = local
        self.call, self.shared, self.length, self.rounds = call, shared, length, rounds
        self.request, self.room = request, room
        self.device: list[int] = []  # the drafter's output, mirrored
        self.supports: list = []  # per device token: the distribution it was drawn from (None: greedy)
        self.offered = (0, 0)  # (start, length) of the last draft sent
        self.pace = _OfferPace()
        self.hold = 0  # the drafter's output length it is held at

    def reach(self) -> int:
        """How far the drafter may run this round: a draft's length past the cloud's tokens, within the room."""
        return min(len(self.shared.tokens) + self.rounds.draft_length, self.room - 1)

    def next_hold(self, after: int) -> int:
        """The hold one chunk past `after`, within reach: the one rule every hold is set by."""
        return min(after + HOLD_CHUNK, self.reach())

    def stop(self, reason: str) -> None:
        self.rounds.stopped = reason
        self.call.close_drafts()

    async def run(self) -> None:
        if self.room < 2:
            return self.stop("no_room_on_the_device")
        self.rounds.draft_length = self.length.next()
        self.hold = self.next_hold(0)
        events = self.local.generate(self.request, hold_at=self.hold)
        try:
            while not self.shared.finished:
                if not await self.decode_to_the_hold(events):
                    return await self.drafted_to_the_end()
                reason = await self.wait_for_the_cloud()
                if reason is not None:
                    return self.stop(reason)
        except Exception as exc:  # the device failing to draft never fails the answer: the cloud goes on alone
            logger.warning("drafting for %s stopped: %s", self.request.request_id, exc)
            self.stop(f"the device failed: {type(exc).__name__}")
        finally:
            await events.aclose()  # the drafting request ends: its slot and blocks go back

    async def decode_to_the_hold(self, events) -> bool:
        """The drafter decodes up to its hold; every token it adds past the cloud's goes out at once as the draft
        from there (the cloud verifies, at its next step, the latest draft it holds). False: the drafter ended."""
        while len(self.device) < self.hold and not self.shared.finished:
            event = await anext(events, None)
            if event is None:
                return False
            self.device.append(event.token_id)
            self.supports.append(event.draft_support)
            self.rounds.drafted_tokens += 1
            self.offer()
            self.raise_the_hold_ahead()
        return True

    async def drafted_to_the_end(self) -> None:
        """The drafter ended (its grammar completed the JSON, or its room ran out): nothing more to draft. Its
        last tokens still go out as the cloud catches up; drafting stops only if the cloud goes another way."""
        while not self.shared.finished:
            if _common_prefix(self.device, self.shared.tokens) < len(self.shared.tokens):
                return self.stop("the drafter ended")
            await self.offer_and_wait()

    def raise_the_hold_ahead(self) -> None:
        """Raise the hold before the drafter reaches it while the cloud agrees: a drafter that stops at every
        chunk would step alone, splitting the device's batch (each step costs the same for one row as for
        several)."""
        reaching = self.hold - len(self.device) <= 1 and self.hold < self.reach()
        if reaching and _ahead_and_agreeing(self.device, self.shared.tokens):
            self.hold = self.next_hold(self.hold)
            self.local.hold_further(self.request.request_id, self.hold)

    async def wait_for_the_cloud(self) -> str | None:
        """Held: wait until the cloud's tokens leave the draft (rewind to them) or it still agrees with room to
        draft further (raise the hold). Why drafting should stop, or None to go on."""
        while not self.shared.finished:
            agreed = _common_prefix(self.device, self.shared.tokens)
            if agreed < len(self.shared.tokens):
                return self.rewind_to_the_cloud(agreed)
            if len(self.device) < self.reach():  # the cloud still agrees: draft the next chunk
                self.hold = self.next_hold(len(self.device))
                self.local.hold_further(self.request.request_id, self.hold)
                return None
            await self.offer_and_wait()
        return None

    async def offer_and_wait(self) -> None:
        """Offer the draft (one held back by the pace goes now if it may), then wait for the cloud's next tokens,
        or until a held-back draft may go."""
        self.offer()
        self.shared.changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.shared.changed.wait(), self.pace.wait_s())

    def rewind_to_the_cloud(self, agreed: int) -> str | None:
        """The drafter rewound to what the two agree on plus the cloud's own tokens, held a new round's draft
        past them; why drafting should stop instead, if it should."""
        reason = not_paying(self.rounds, self.local)
        if reason is not None:
            return reason
        cloud = self.shared.tokens
        self.rounds.draft_length = self.length.next()
        self.hold = self.next_hold(len(cloud))
        if self.hold <= len(cloud):  # at `room` the drafter would end instead of holding
            return "no_room_on_the_device"
        self.local.rewind(self.request.request_id, agreed, cloud[agreed:], self.hold)
        self.device = list(cloud)
        self.supports = self.supports[:agreed] + [None] * (len(cloud) - agreed)
        return None

    def offer(self) -> None:
        """Send the device's tokens past the cloud's as a draft, when they agree with the cloud's so far, are not
        the draft last sent and the pace allows."""
        cloud, device = self.shared.tokens, self.device
        start = len(cloud)
        if (
            len(device) == start
            or not _ahead_and_agreeing(device, cloud)
            or (start, len(device) - start) == self.offered
        ):
            return
        if not self.pace.may_send():
            return
        draft, support = device[start:], self.supports[start:]
        self.call.offer(start, draft, None if None in support else support)
        self.shared.offered_at = start
        self.rounds.offers += 1
        self.offered = (start, len(draft))


def _ahead_and_agreeing(device: Sequence[int], cloud: Sequence[int]) -> bool:
    """The device's tokens start with all of the cloud's: what it drafts next is still ahead of the cloud. Checked
    at every device token, so one slice comparison rather than a loop over the answer so far."""
    return len(device) >= len(cloud) and device[: len(cloud)] == cloud


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
