"""The simulated devices of bench.draft_fleet: each drafts exactly what the device's model would draft given
the cloud's tokens so far, replayed from a recording, so that a fleet of them costs this machine's CPU
nothing while the cloud is timed.

Recording (before any timing): for each prompt, the cloud's greedy answer, then the device's own greedy
continuations along it on the real local engine (SmolLM2 Q4_1), as runs: a run starts at a prefix of
the answer and holds the device's tokens after it, until `lookahead` tokens past the first one where the
device and the cloud part. The next run starts one token later (the device then continues the cloud's
token, not its own), so the device's draft after any prefix of the answer is in exactly one run.

Replaying: `ReplayDevice` is the part of the local engine that sdk.cascade.device_drafts.DeviceDrafter
drafts with (generate with a hold, rewind, hold_further, stats), so the production drafter runs unchanged;
each token takes `ms_per_token` of the event loop's time (a sleep: the device's decode step) instead of a
forward pass. A device whose cloud left the recorded answer (bf16 near-ties under another batch shape)
drafts nothing more for that answer.

`agreement` below 1 stands in for a smaller device model: at a position where the device would draft the
cloud's own token, it drafts another one with probability 1 - agreement (the same positions in every
repetition, from a fixed seed), and goes on drafting its own way until the drafter rewinds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

from sdk.cascade.device_drafts import drafter_params
from sdk.protocol.drafts import MAX_DRAFT_TOKENS
from sdk.protocol.engine import GenerationRequest, SamplingParams


@dataclass
class Recording:
    """One prompt's cloud answer and the device's greedy runs along it (module docstring)."""

    prompt_ids: list[int]
    answer: list[int]
    runs: list[tuple[int, list[int]]] = field(default_factory=list)  # (start, the device's tokens after it)

    def device_token(self, output: list[int]) -> int | None:
        """The device's greedy token after the answer's prompt and `output`, if the recording has it: `output`
        follows the answer, then (where the device parted from it) the run that covers that prefix."""
        agreed = _common_prefix(output, self.answer)
        run = max((run for run in self.runs if run[0] <= agreed), key=lambda run: run[0], default=None)
        if run is None:
            return None
        start, tokens = run
        offset = len(output) - start
        if offset >= len(tokens) or output[start:] != tokens[:offset]:
            return None
        return tokens[offset]


async def record_device_runs(local, recording: Recording, lookahead: int = MAX_DRAFT_TOKENS) -> None:
    """Fill `recording.runs` from the local engine (an AsyncLocalEngine), greedy, as the drafter samples."""
    answer, start = recording.answer, 0
    while start < len(answer):
        tokens = await _device_greedy(local, recording.prompt_ids, answer[:start], len(answer) - start, lookahead)
        recording.runs.append((start, tokens))
        parted = next((j for j, token in enumerate(tokens[: len(answer) - start]) if token != answer[start + j]), None)
        if parted is None:
            return
        start += parted + 1


async def _device_greedy(local, prompt_ids, continuation, answer_left: int, lookahead: int) -> list[int]:
    """The device's greedy tokens after prompt + continuation: until `lookahead` past where they part from the
    answer, or past its end."""
    room = (local.max_model_len or 0) - len(prompt_ids) - len(continuation) - 1
    params = drafter_params(SamplingParams(max_tokens=1, temperature=0.0), max(1, min(room, answer_left + lookahead)))
    request = GenerationRequest(
        f"record-{id(continuation)}-{len(continuation)}",
        list(prompt_ids) + list(continuation),
        params,
        num_continuation_tokens=len(continuation),
    )
    tokens: list[int] = []
    async with contextlib.aclosing(local.generate(request)) as events:
        async for event in events:
            tokens.append(event.token_id)
            if len(tokens) >= answer_left + lookahead:
                break
    return tokens


async def device_ms_per_token(local, prompt_ids: list[int], tokens: int = 64) -> float:
    """The local engine's decode speed at one sequence: ms between its first and last token, per token."""
    params = drafter_params(SamplingParams(max_tokens=1, temperature=0.0), tokens)
    times = []
    async with contextlib.aclosing(local.generate(GenerationRequest("speed", list(prompt_ids), params))) as events:
        async for _ in events:
            times.append(time.perf_counter())
    return (times[-1] - times[0]) / (len(times) - 1) * 1000


@dataclass
class _Drafting:
    recording: Recording
    output: list[int]
    hold: int
    changed: asyncio.Event
    own_way_from: int | None = None  # where a smaller device's token parted from the cloud's, until rewound


class ReplayDevice:
    """What DeviceDrafter drafts with, replaying `recordings` (keyed by prompt ids) at `ms_per_token` a token."""

    max_model_len = 4096  # the drafter sizes its request by it; the recording bounds each answer

    def __init__(self, recordings: list[Recording], ms_per_token: float, agreement: float = 1.0, seed: int = 0):
        self.recordings = {tuple(r.prompt_ids): r for r in recordings}
        self.s_per_token = ms_per_token / 1000
        self.agreement = agreement
        self.seed = seed
        self._drafting: dict[str, _Drafting] = {}
        self.tokens_drafted = 0

    def stats(self):
        return SimpleNamespace(num_waiting=0, num_waiting_drafts=0)  # each device drafts for one answer only

    async def generate(self, request: GenerationRequest, hold_at: int | None = None):
        recording = self.recordings[tuple(request.prompt_token_ids)]
        state = _Drafting(recording, [], hold_at if hold_at is not None else 1 << 30, asyncio.Event())
        self._drafting[request.request_id] = state
        try:
            while True:
                while len(state.output) >= state.hold:
                    state.changed.clear()
                    await state.changed.wait()
                await asyncio.sleep(self.s_per_token)  # the device's decode step
                if len(state.output) >= state.hold:
                    continue  # rewound meanwhile, to a hold it has reached
                token = self._next(state)
                if token is None:
                    return  # the cloud left the recording, or the recording ends: nothing more to draft
                state.output.append(token)
                self.tokens_drafted += 1
                yield SimpleNamespace(token_id=token, draft_support=None)
        finally:
            self._drafting.pop(request.request_id, None)

    def rewind(self, request_id: str, keep: int, append, hold_at: int | None) -> None:
        state = self._drafting.get(request_id)
        if state is None:
            return
        state.output = state.output[:keep] + list(append)
        if state.own_way_from is not None and keep <= state.own_way_from:
            state.own_way_from = None
        state.hold = hold_at if hold_at is not None else 1 << 30
        state.changed.set()

    def hold_further(self, request_id: str, hold_at: int) -> None:
        state = self._drafting.get(request_id)
        if state is not None:
            state.hold = max(state.hold, hold_at)
            state.changed.set()

    def _next(self, state: _Drafting) -> int | None:
        """The device's next token for the answer: the recorded one, or (a smaller device) another one."""
        answer, position = state.recording.answer, len(state.output)
        if state.own_way_from is not None:
            return _other(answer, position)  # a smaller device gone its own way: wrong until rewound
        token = state.recording.device_token(state.output)  # None where the cloud's tokens left the recording
        if token is None or self.agreement >= 1.0 or position >= len(answer) or token != answer[position]:
            return token
        if self._agrees(state.recording, position):
            return token
        state.own_way_from = position
        return _other(answer, position)

    def _agrees(self, recording: Recording, position: int) -> bool:
        """Whether the smaller device drafts the cloud's token at `position` (the same in every repetition)."""
        return random.Random(hash((self.seed, tuple(recording.prompt_ids[-8:]), position))).random() < self.agreement


def _other(answer: list[int], position: int) -> int:
    """A token that is not the cloud's at `position` (within any even-sized vocabulary)."""
    return answer[position] ^ 1 if position < len(answer) else 0


def _common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
