"""Per-key rate and concurrency limits on the gRPC service, and one budget per key shared
with the HTTP listener of the same process (sdk.serving.access_gate)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from sdk.protocol.cloud_backend import CloudStatus
from sdk.serving.grpc.auth import peer_host
from sdk.serving.grpc.server import GrpcServerConfig, bound_port, start_grpc_server, stop_grpc_server
from sdk.cloud.grpc_client import CloudClient, CloudOverloadedError, CloudUnauthenticatedError
from tests.app_helpers import make_app
from sdk.serving.client_limits import ClientLimits
from sdk.protocol.engine import SamplingParams
from tests.cloud_engine.grpc_helpers import engine, long_tiny_dir, serve, wait_until  # noqa: F401

KEYS = frozenset({"key-one", "key-two"})
LONG = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)


async def refused(call) -> CloudOverloadedError:
    with pytest.raises(CloudOverloadedError) as caught:
        await call
    error = caught.value
    assert error.code == CloudStatus.RESOURCE_EXHAUSTED and error.retry_after_s >= 1
    return error


async def test_rate_limit_per_key_with_a_retry_hint(engine, serve):  # noqa: F811
    target = await serve(engine, api_keys=KEYS, rate_limit_per_minute=2)  # a burst of 2, then one every 30 s
    async with CloudClient(target, api_key="key-one") as one, CloudClient(target, api_key="key-two") as two:
        assert [len(await one.list_models()) for _ in range(2)] == [1, 1]
        error = await refused(one.list_models())
        assert 25 <= error.retry_after_s <= 30 and "rate limit" in str(error) and "2 requests a minute" in str(error)
        await refused(anext(one.generate([5, 6], LONG)))  # every method spends the same budget
        assert len(await two.list_models()) == 1  # another key has its own
        assert await one.health() == "SERVING"  # health is never limited


async def test_concurrency_limit_holds_a_slot_until_the_stream_ends(engine, serve):  # noqa: F811
    target = await serve(engine, api_keys=KEYS, max_concurrent_per_key=1)
    async with CloudClient(target, api_key="key-one") as one, CloudClient(target, api_key="key-two") as two:
        stream = one.generate([5, 6], LONG)
        await anext(stream)  # one stream in flight for key-one
        error = await refused(anext(one.generate([5, 6], LONG)))
        assert "at most 1 in flight" in str(error)
        assert len(await two.list_models()) == 1
        await stream.aclose()  # the client cancels: the server's handler ends and frees the slot
        assert await wait_until(lambda: engine.stats().num_kv_blocks_used == 0)
        for _ in range(50):  # the cancellation reaches the server's handler asynchronously
            try:
                assert len(await one.list_models()) == 1
                break
            except CloudOverloadedError:
                await asyncio.sleep(0.05)
        else:
            pytest.fail("the cancelled stream's slot never came back")


async def test_without_keys_the_client_address_is_the_budget(engine, serve):  # noqa: F811
    target = await serve(engine, rate_limit_per_minute=1)
    async with CloudClient(target) as first, CloudClient(target) as second:
        assert len(await first.list_models()) == 1
        error = await refused(second.list_models())  # another channel, the same address
        assert "this client address" in str(error)


async def test_one_budget_per_key_across_grpc_and_http(engine):  # noqa: F811
    limits = ClientLimits.build(rate_limit_per_minute=3, max_concurrent_per_key=1)
    app = make_app(engine, api_keys=KEYS, client_limits=limits)
    server = await start_grpc_server(engine, GrpcServerConfig(port=0, api_keys=KEYS), limits)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
    try:
        async with (
            CloudClient(f"127.0.0.1:{bound_port(server)}", api_key="key-one") as grpc_one,
            httpx.AsyncClient(
                transport=transport, base_url="http://test", headers={"Authorization": "Bearer key-one"}
            ) as http_one,
        ):
            stream = grpc_one.generate([5, 6], LONG)
            await anext(stream)  # key-one's one slot, taken over gRPC (1 of its 3 requests)
            busy = await http_one.get("/v1/models")
            assert busy.status_code == 429 and busy.json()["error"]["code"] == "concurrency_limit_exceeded"
            await stream.aclose()
            assert await wait_until(lambda: limits.in_flight.in_flight("key-one") == 0)
            assert (await http_one.get("/v1/models")).status_code == 200  # request 3 of 3
            error = await refused(grpc_one.list_models())  # the 4th, whichever door it takes
            assert "rate limit" in str(error)
            over = await http_one.get("/v1/models")
            assert over.status_code == 429 and over.json()["error"]["code"] == "rate_limit_exceeded"
    finally:
        await stop_grpc_server(server, grace_s=0)


async def test_wrong_keys_back_off_per_address_without_being_checked(engine, serve):  # noqa: F811
    target = await serve(engine, api_keys=KEYS, auth_backoff_after=3)
    async with CloudClient(target, api_key="guess") as guesser, CloudClient(target, api_key="key-one") as right:
        codes, started = [], asyncio.get_running_loop().time()
        while asyncio.get_running_loop().time() - started < 1.5:
            try:
                await guesser.list_models()
            except CloudOverloadedError as error:  # RESOURCE_EXHAUSTED: backing off, key unchecked
                assert "not checked" in str(error) and error.retry_after_s >= 1
                codes.append("backoff")
            except CloudUnauthenticatedError:
                codes.append("checked")
        # 3 free guesses, a 1 s wait, one more, then a 2 s wait: 4 checked in 1.5 s, however fast the loop.
        assert codes.count("checked") == 4 and codes.count("backoff") > 10, codes[:12]
        await refused(right.list_models())  # the right key from the same address waits too


@pytest.mark.parametrize(
    "peer, host",
    [
        ("ipv4:127.0.0.1:5000", "127.0.0.1"),
        ("ipv6:%5B::1%5D:5000", "::1"),
        ("ipv6:[2001:db8::1]:443", "2001:db8::1"),
        ("unix:/tmp/s.sock", "unix"),
        ("", "unknown"),
    ],
)
def test_the_budget_identity_is_the_peer_host_without_its_port(peer, host):
    assert peer_host(peer) == host
