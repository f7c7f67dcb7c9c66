"""The embedded cloud engine's gRPC listener (sdk.cloud.tier.serve_embedded) serves this process
only: a key that lives in its memory, no reflection, a unix socket in a 0700 directory (or
loopback TCP where there is none). Another process that finds the socket or the port is refused."""

from __future__ import annotations

import os
import stat

import grpc
import pytest

from sdk.cloud.grpc_client import CloudClient, CloudUnauthenticatedError
from sdk.cloud.tier import serve_embedded
from sdk.protocol.engine import SamplingParams
from tests.cloud_engine.grpc_helpers import engine, long_tiny_dir, wait_until_serving  # noqa: F401  (fixtures)

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
