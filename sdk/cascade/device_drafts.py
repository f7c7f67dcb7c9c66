"""The device drafts, the cloud verifies (issue 56): a cloud answer produced with the device's model
drafting the next tokens, so the cloud pays one step for several of its tokens while the answer
stays exactly its own (the cloud verifies each draft: cloud_engine.spec_decode.outside_drafts).

One call per answer: the cloud's GenerateWithDrafts (sdk.cloud.grpc_drafts) streams the cloud's
tokens; beside it a drafting request runs on the local engine (LocalEngine.rewind), in rounds:

1. the drafter decodes k tokens past what the cloud has emitted and is held there;
2. they are offered to the cloud as a draft (its start: the cloud's tokens so far);
3. when the cloud's tokens go past or away from the draft, the drafter is rewound to the tokens the
   two agree on plus the cloud's own, and drafts the next k from there.

The drafter is rewound only while it is held, so every token it reports afterwards is fresh. The
cloud never waits for a draft: while the device drafts, it decodes on its own, and a draft that
arrives late is verified past what it already emitted. The prompt goes to the cloud as the device's
own token ids (the tiers share one vocabulary: CascadeRunner.vocabulary_verdict), so both continue
the same sequence.

Drafts are sent without their distributions: the cloud reads each token as one-hot, which keeps a
sampled answer in the cloud's distribution (cloud_engine.spec_decode.outside_drafts) and costs only
acceptance; greedy answers are unaffected.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from sdk.protocol.cloud_backend import CloudTokenEvent
from sdk.protocol.engine import GenerationRequest, SamplingParams

logger = logging.getLogger(__name__)

DEFAULT_DRAFT_TOKENS = 4


@dataclass
class DraftRounds:
    """What drafting did for one answer (the `tandem` extension reports it)."""

    rounds: int = 0  # drafts offered
    drafted_tokens: int = 0
    accepted_tokens: int = 0  # the cloud's count, from its last response
    verified_tokens: int = 0  # draft tokens the cloud verified (a late or dropped draft is never verified)
    stopped: str | None = None  # why drafting stopped before the answer ended, if it did

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def draft_refusal(params: SamplingParams) -> str | None:
    """Why a request cannot be drafted for exactly (the cloud drafts nothing for it either), else None."""
    if params.uses_token_history or params.logit_bias or params.min_tokens:
        return "sampling_uses_token_history"
    return None


def drafter_params(params: SamplingParams, room: int) -> SamplingParams:
    """The drafting request's sampling: the answer's own distribution (temperature, top-p, top-k, min-p and
    its grammar), never stopping on its own (the cloud decides where the answer ends), `room` tokens."""
    return SamplingParams(
        max_tokens=room,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        seed=params.seed,
        ignore_eos=True,
        repetition_stop=False,
        structured=params.structured,
    )


@dataclass
class _Shared:
    """The cloud's tokens as they arrive, for the drafting task."""

    tokens: list[int] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = False


class DeviceDrafter:
    """Cloud answers drafted by the local engine `local` (an AsyncLocalEngine), `k` tokens a round."""

    def __init__(self, local, k: int = DEFAULT_DRAFT_TOKENS):
        if k < 1:
            raise ValueError(f"draft tokens per round must be >= 1, got {k}")
        self.local = local
        self.k = k

    async def stream(
        self,
        client,
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
        room = (self.local.max_model_len or 0) - len(prompt_ids) - len(continuation) - 1
        drafting = asyncio.create_task(
            self._draft(call, shared, prompt_ids + continuation, len(continuation), params, room, rounds)
        )
        try:
            async for event in call:
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

    async def _draft(self, call, shared: _Shared, prompt_ids, num_continuation, params, room, rounds) -> None:
        """Rounds of drafting until the answer ends (or drafting cannot go on: `rounds.stopped` says why)."""
        if room < 2:
            rounds.stopped = "no_room_on_the_device"
            call.close_drafts()
            return
        request = GenerationRequest(
            f"draft-{uuid.uuid4().hex[:12]}",
            prompt_ids,
            drafter_params(params, room),
            num_continuation_tokens=num_continuation,
        )
        device: list[int] = []  # the drafter's output, mirrored
        hold = min(self.k, room - 1)
        events = self.local.generate(request, hold_at=hold)
        try:
            while not shared.finished:
                while len(device) < hold:  # 1. the drafter decodes up to its hold
                    event = await anext(events, None)
                    if event is None:
                        rounds.stopped = "the drafter ended"
                        call.close_drafts()
                        return
                    device.append(event.token_id)
                offered = False
                while not shared.finished:
                    cloud = shared.tokens
                    agreed = _common_prefix(device, cloud)
                    if agreed < len(cloud):  # 3. the cloud went past or away from the draft: rewind
                        hold = min(len(cloud) + self.k, room - 1)  # at `room` the drafter would end instead
                        if hold <= len(cloud):
                            rounds.stopped = "no_room_on_the_device"
                            call.close_drafts()
                            return
                        self.local.rewind(request.request_id, agreed, cloud[agreed:], hold)
                        device = list(cloud)
                        break
                    if not offered:  # 2. the draft past the cloud's tokens
                        draft = device[len(cloud) :]
                        call.offer(len(cloud), draft)
                        rounds.rounds += 1
                        rounds.drafted_tokens += len(draft)
                        offered = True
                    shared.changed.clear()
                    await shared.changed.wait()
        except Exception as exc:  # the device failing to draft never fails the answer: the cloud goes on alone
            logger.warning("drafting for %s stopped: %s", request.request_id, exc)
            rounds.stopped = f"the device failed: {type(exc).__name__}"
            call.close_drafts()
        finally:
            await events.aclose()  # the drafting request ends: its slot and blocks go back


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
