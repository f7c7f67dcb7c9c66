"""The embedded cloud engine's gRPC listener (sdk.cloud.tier.serve_embedded) serves this process
only: a key that lives in its memory, no reflection, a unix socket in a 0700 directory (or
loopback TCP where there is none). Another process that finds the socket or the port is refused,
and its wrong keys cannot make the cascade's own calls wait (the listener has no failed-key backoff)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys

import grpc
import pytest

from sdk.cascade.runner import CascadeConfig, CascadeRunner
from sdk.cloud.grpc_client import CloudClient, CloudUnauthenticatedError
from sdk.cloud.tier import serve_embedded
from sdk.protocol.engine import SamplingParams
from tests.cloud_engine.grpc_helpers import engine, long_tiny_dir, wait_until_serving  # noqa: F401  (fixtures)
from tests.conftest import REPO_ROOT, clean_env
from tests.sdk.test_cascade import QUESTION, RecordingCloudEngine
from tests.sdk.test_openai_server import FakeEngine

GREEDY = SamplingParams(max_tokens=3, temperature=0.0)


async def generate(client: CloudClient) -> list:
    return [event async for event in client.generate([5, 6, 7], GREEDY)]


async def reflection_status(target: str) -> grpc.StatusCode:
    """What the server answers a reflection call (grpcurl's first question)."""
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")(iter([b""]))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call:
                pass
        return info.value.code()


@pytest.mark.parametrize("unix_socket", [True, False], ids=["unix-socket", "loopback-tcp"])
async def test_only_the_serving_process_can_call_the_embedded_engine(engine, unix_socket):  # noqa: F811
    if unix_socket and not hasattr(__import__("socket"), "AF_UNIX"):
        pytest.skip("no unix domain sockets on this platform")
    tier = await serve_embedded(engine, use_unix_socket=unix_socket)
    target = tier.client.target
    try:
        assert target.startswith("unix:") == unix_socket
        if unix_socket:
            folder = tier.socket_folder
            assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700 and target == f"unix:{folder}/grpc.sock"
        assert await wait_until_serving(tier.client)
        assert len(await generate(tier.client)) == 3  # the process's own client holds the key
        for stranger in (CloudClient(target), CloudClient(target, api_key="guessed")):
            async with stranger:
                assert await stranger.health() == "SERVING"  # health stays public, as for load balancers
                with pytest.raises(CloudUnauthenticatedError):
                    await generate(stranger)
        assert await reflection_status(target) == grpc.StatusCode.UNIMPLEMENTED
    finally:
        folder = tier.socket_folder
        tier.engine = None  # the module's engine fixture outlives this tier
        await tier.close()
    assert folder is None or not os.path.exists(folder)


# Another process of the same user that found the listener (its socket, or its loopback port) and
# sends it wrong keys in a loop, bounded in calls and seconds, until the stop file appears. It says
# "guessing" once it has sent more wrong keys than a backoff would let through (10 by default), and
# prints the status codes it got as one JSON line when it ends.
GUESSER = """
import collections, json, os, sys, time
import grpc
target, stop, seconds, max_calls = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
codes, deadline = collections.Counter(), time.monotonic() + seconds
with grpc.insecure_channel(target) as channel:
    generate = channel.unary_stream("/tandem.v1.Tandem/Generate")  # refused before its bytes are parsed
    for n in range(max_calls):
        if os.path.exists(stop) or time.monotonic() > deadline:
            break
        try:
            for _ in generate(b"", metadata=(("authorization", f"Bearer guess-{n}"),), timeout=5):
                pass
            codes["OK"] += 1
        except grpc.RpcError as error:
            codes[error.code().name] += 1
        if n == 30:
            print("guessing", flush=True)
        time.sleep(0.005)
print(json.dumps(codes), flush=True)
"""


@pytest.mark.parametrize("unix_socket", [True, False], ids=["unix-socket", "loopback-tcp"])
async def test_a_process_sending_wrong_keys_cannot_lock_the_cascade_out(engine, unix_socket, tmp_path):  # noqa: F811
    # Every peer of the unix socket is one address to the server ("unix"), as every loopback peer is
    # ("127.0.0.1"): with a failed-key backoff the guesser would make the cascade's own calls wait
    # (RESOURCE_EXHAUSTED: escalations answered locally, degraded cloud_overloaded).
    if unix_socket and not hasattr(__import__("socket"), "AF_UNIX"):
        pytest.skip("no unix domain sockets on this platform")
    tier = await serve_embedded(RecordingCloudEngine(engine), use_unix_socket=unix_socket)
    runner = CascadeRunner(FakeEngine(), tier.client, CascadeConfig())
    stop, log = tmp_path / "stop", tmp_path / "guesser.log"
    guesser = None
    try:
        assert await wait_until_serving(tier.client)
        with open(log, "w") as stderr:
            guesser = subprocess.Popen(
                [sys.executable, "-c", GUESSER, tier.client.target, str(stop), "60", "5000"],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                cwd=REPO_ROOT,
                env=clean_env(),
            )
        started = await asyncio.to_thread(guesser.stdout.readline)
        assert started == "guessing\n", log.read_text()
        routings = []
        for _ in range(3):  # while it guesses: the cloud tier answers every forced escalation
            result = await runner.complete(QUESTION, SamplingParams(max_tokens=4, temperature=0.0), model="cloud")
            routings.append(result.routing)
            await asyncio.sleep(0.2)
        assert guesser.poll() is None, "the guesser ended before the cascade's requests did: " + log.read_text()
        stop.touch()
        out, _ = await asyncio.to_thread(guesser.communicate, timeout=30)
    finally:
        if guesser is not None and guesser.poll() is None:
            guesser.kill()
            guesser.wait()
        tier.engine = None  # the module's engine fixture outlives this tier
        await tier.close()
    assert [(r.tier, r.degraded, r.degraded_reason) for r in routings] == [("cloud", False, None)] * 3, routings
    codes = json.loads(out.splitlines()[-1])
    assert set(codes) == {"UNAUTHENTICATED"} and codes["UNAUTHENTICATED"] > 30, codes  # each guess checked, none let in
