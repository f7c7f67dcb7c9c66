"""bench.draft_fleet's simulated devices (bench.draft_fleet_replay): the recorded runs give, after any
prefix of the cloud's answer, exactly the token the device's model would draft, and nothing once the
cloud's tokens leave the recording; a smaller device parts from the cloud at about the rate it is set to."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from bench.draft_fleet_replay import Recording, ReplayDevice, record_device_runs

PROMPT = [5, 6, 7]


def device_model(context: list[int]) -> int:
    """A deterministic 'device model': its greedy token after `context` (agrees with ANSWER most of the time)."""
    return (sum(context) * 7 + len(context)) % 50


def cloud_answer(length: int) -> list[int]:
    """The cloud's answer: the device's greedy tokens, except at every fifth position."""
    answer: list[int] = []
    for position in range(length):
        token = device_model(PROMPT + answer)
        answer.append(token if position % 5 != 3 else (token + 1) % 50)
    return answer


class FakeLocal:
    """The local engine's generate, greedy with device_model."""

    max_model_len = 1000

    async def generate(self, request, hold_at=None):
        context = list(request.prompt_token_ids)
        for _ in range(request.params.max_tokens):
            token = device_model(context)
            context.append(token)
            yield SimpleNamespace(token_id=token, draft_support=None)


def recorded(length: int = 30) -> Recording:
    recording = Recording(list(PROMPT), cloud_answer(length))
    asyncio.run(record_device_runs(FakeLocal(), recording, lookahead=4))
    return recording


def test_the_runs_give_the_devices_token_after_every_prefix_of_the_answer():
    recording = recorded()
    answer = recording.answer
    assert len(recording.runs) > 1  # the device parts from the cloud at every fifth token
    for i in range(len(answer)):
        output = answer[:i]
        assert recording.device_token(output) == device_model(PROMPT + output)
        # and where the device went its own way after that prefix, for as far as a draft reaches
        own = list(output)
        for _ in range(3):
            own.append(device_model(PROMPT + own))
            assert recording.device_token(own) == device_model(PROMPT + own)


def test_nothing_is_drafted_once_the_cloud_leaves_the_recording():
    recording = recorded()
    elsewhere = recording.answer[:6] + [(recording.answer[6] + 2) % 50]
    if elsewhere[6] == device_model(PROMPT + elsewhere[:6]):
        elsewhere[6] = (elsewhere[6] + 1) % 50
    assert recording.device_token(elsewhere) is None


def test_a_smaller_device_parts_from_the_cloud_at_about_its_rate():
    recording = recorded(400)
    device = ReplayDevice([recording], ms_per_token=0.0, agreement=0.6, seed=1)
    same_model = [
        i for i in range(len(recording.answer)) if recording.device_token(recording.answer[:i]) == recording.answer[i]
    ]
    agreeing = [device._agrees(recording, i) for i in same_model]
    assert 0.5 < sum(agreeing) / len(agreeing) < 0.7
    assert agreeing == [device._agrees(recording, i) for i in same_model]  # the same positions every time


def test_the_replay_device_drafts_along_the_recording_and_holds():
    recording = recorded()

    async def scenario():
        device = ReplayDevice([recording], ms_per_token=0.0)
        request = SimpleNamespace(prompt_token_ids=list(PROMPT), request_id="d")
        events = device.generate(request, hold_at=3)
        tokens = [(await anext(events)).token_id for _ in range(3)]
        assert tokens == [device_model(PROMPT + tokens[:i]) for i in range(3)]
        waiting = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # held at 3
        cloud = recording.answer[:5]
        device.rewind("d", 0, cloud, hold_at=6)  # the cloud's five tokens, then one more of the device's
        assert (await waiting).token_id == recording.device_token(cloud)
        await events.aclose()

    asyncio.run(scenario())
