"""The cascade when the cloud misbehaves: killed mid-stream, too slow, wrong key, refusing
the request; and the restart-mode hold window. Real tiers on loopback, as in test_cascade."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sdk.serving.grpc.server import GrpcServerConfig, bound_port, start_grpc_server, stop_grpc_server
from sdk.cascade.runner import CascadeConfig, CascadeRunner, collect
from sdk.cloud.grpc_client import CloudClient
from sdk.protocol.engine import InvalidRequestError, SamplingParams
from tests.cloud_engine.grpc_helpers import long_tiny_dir, serve  # noqa: F401  (fixtures)
from tests.sdk.test_cascade import (  # noqa: F401  (fixtures)
    GREEDY,
    QUESTION,
    RecordingCloudEngine,
    between_threshold,
    cloud_engine,
    local_engine,
    make_runner,
    recording,
    reference_scores,
)

pytestmark = pytest.mark.slow


class PacedCloudEngine(RecordingCloudEngine):
    """The recording cloud engine, `delay_s` per token: time to fail it part-way."""

    def __init__(self, engine, delay_s: float):
        super().__init__(engine)
        self.delay_s = delay_s

    async def generate(self, request):
        async for event in super().generate(request):
            await asyncio.sleep(self.delay_s)
            yield event


def tiers_of(events) -> list[str]:
    return [event.tier for event in events if event.routing is None]


async def test_cloud_killed_mid_stream_is_finished_by_the_local_tier(cloud_engine, make_runner):  # noqa: F811
    server = await start_grpc_server(PacedCloudEngine(cloud_engine, 0.05), GrpcServerConfig(port=0))
    runner = await make_runner(f"127.0.0.1:{bound_port(server)}")
    params = SamplingParams(max_tokens=24, temperature=0.0)
    events, killed = [], False
    async for event in runner.generate(QUESTION, params, model="cloud"):  # no exception reaches the app
        events.append(event)
        if not killed and tiers_of(events).count("cloud") == 3:
            killed = True
            await stop_grpc_server(server, grace_s=0)
    routing, tiers = events[-1].routing, tiers_of(events)
    assert (routing.tier, routing.degraded) == ("local", True) and routing.degraded_reason
    num_cloud = tiers.count("cloud")
    assert (
        num_cloud >= 3
        and tiers == ["cloud"] * num_cloud + ["local"] * (len(tiers) - num_cloud)
        and len(tiers) > num_cloud
    )
    assert events[-1].finish_reason == "stop" or len(tiers) == params.max_tokens  # a whole answer
    assert routing.cost["local"]["completion_tokens"] == len(tiers) - num_cloud
    assert runner.breaker.num_consecutive_failures == 1


@pytest.mark.parametrize(
    "timeouts, reason",
    [
        ({"cloud_deadline_s": 0.4}, "cloud_deadline"),
        ({"cloud_first_token_timeout_s": 5.0, "cloud_stall_timeout_s": 0.1}, "cloud_stall_timeout"),
    ],
)
async def test_slow_cloud_times_out_and_the_local_tier_answers(
    cloud_engine,  # noqa: F811
    make_runner,  # noqa: F811
    timeouts,
    reason,
):
    server = await start_grpc_server(PacedCloudEngine(cloud_engine, 0.25), GrpcServerConfig(port=0))
    try:
        runner = await make_runner(f"127.0.0.1:{bound_port(server)}", **timeouts)
        result = await runner.complete(QUESTION, SamplingParams(max_tokens=12, temperature=0.0), model="cloud")
        deadline = asyncio.get_running_loop().time() + 5
        while cloud_engine.stats().num_kv_blocks_used and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)  # the cancelled call reaches the engine thread asynchronously
        assert cloud_engine.stats().num_kv_blocks_used == 0, "the timed-out cloud request freed its blocks"
    finally:
        await stop_grpc_server(server, grace_s=0)
    assert (result.routing.tier, result.routing.degraded_reason) == ("local", reason)
    assert result.finish_reason == "stop" or len(result.token_ids) == 12
    assert result.tiers[-1] == "local"


async def test_rejected_key_turns_escalation_off_with_one_log_line(
    recording,  # noqa: F811
    serve,  # noqa: F811
    local_engine,  # noqa: F811
    caplog,
):
    target = await serve(recording, api_keys={"sk-right"})
    runner = CascadeRunner(local_engine, CloudClient(target, api_key="sk-wrong"), CascadeConfig())
    params = SamplingParams(max_tokens=4, temperature=0.0)
    with caplog.at_level(logging.WARNING):
        reasons = [(await runner.complete(QUESTION, params, model="auto:1")).routing for _ in range(3)]
    await runner.cloud.close()
    assert [(r.tier, r.degraded_reason) for r in reasons] == [("local", "cloud_auth")] * 3
    assert runner.breaker.auth_disabled and recording.received == []
    auth_lines = [r for r in caplog.records if "UNAUTHENTICATED" in r.getMessage()]
    assert len(auth_lines) == 1, [r.getMessage() for r in caplog.records]


async def test_request_the_cloud_calls_invalid_is_the_callers_error(make_runner):  # noqa: F811
    runner = await make_runner()
    with pytest.raises(InvalidRequestError):
        await runner.complete(QUESTION, SamplingParams(max_tokens=5000, temperature=0.0), model="cloud")
    assert runner.breaker.num_consecutive_failures == 0 and runner.breaker.state.value == "closed"


async def test_hold_window_commits_a_streamed_answer_before_a_late_escalation(
    make_runner,  # noqa: F811
    recording,  # noqa: F811
    local_engine,  # noqa: F811
):
    k = 4
    scores = await reference_scores(local_engine)
    threshold = between_threshold(scores, k)
    late = next((n for n in range(k + 1, len(scores) + 1) if scores[n - 1] < threshold), None)
    assert late is not None, f"this greedy answer never dips after token {k}: {scores}"
    held = await make_runner(min_tokens_k=k, hold_tokens=k)
    result = await collect(held.generate(QUESTION, GREEDY, model=f"auto:{threshold!r}"))  # streamed
    # The window released the local tokens at K; the later dip cannot contradict them.
    assert (result.routing.tier, result.routing.escalated, result.routing.reason) == ("local", False, "committed_local")
    assert recording.received == [] and set(result.tiers) == {"local"}
    # Not streamed, the same runner holds the answer until decided: the same dip escalates.
    routing = (await held.complete(QUESTION, GREEDY, model=f"auto:{threshold!r}")).routing
    assert (routing.tier, routing.escalated, routing.decided_at_token) == ("cloud", True, late)


async def test_a_confident_streamed_answer_reaches_the_client_while_it_is_generated(
    make_runner,  # noqa: F811
    local_engine,  # noqa: F811
):
    # Default settings (restart hand-off, decide_at every_token): the stream commits local after
    # the default hold window instead of holding a confident answer back to its end.
    runner = await make_runner()
    window = runner.config.stream_hold_window()
    params = SamplingParams(max_tokens=window + 48, temperature=0.0, ignore_eos=True)
    events = runner.generate(QUESTION, params, model="auto:0.001")  # judged, and confident enough
    first = await anext(events)
    still_generating = local_engine.num_in_flight > 0
    rest = [event async for event in events]
    assert first.tier == "local" and still_generating, "the first token waited for the whole local answer"
    assert (rest[-1].routing.tier, rest[-1].routing.escalated) == ("local", False)
    assert 1 + len(rest) - 1 == params.max_tokens  # every token once: the first, the others, then the routing event
