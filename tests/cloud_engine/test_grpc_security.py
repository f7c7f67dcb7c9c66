"""API keys, TLS, and what stays public (health, reflection) on the tandem.v1 gRPC server."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from sdk.protocol.cloud_backend import CloudStatus
from sdk.serving.grpc.server import (
    GrpcServerConfig,
    GrpcServerStartError,
    bound_port,
    start_grpc_server,
    stop_grpc_server,
)
from sdk.serving.api_keys import key_fingerprint, loggable_id
from sdk.cloud.grpc_client import CloudClient, CloudUnauthenticatedError, CloudUnavailableError
from sdk.protocol.engine import SamplingParams
from tests.cloud_engine.grpc_helpers import engine, long_tiny_dir, serve, wait_until_serving  # noqa: F401

GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


async def test_api_keys_guard_the_service_but_not_health_or_reflection(engine, serve, caplog):  # noqa: F811  (fixtures)
    target = await serve(engine, api_keys=frozenset({"key-one", "key-two"}))
    async with CloudClient(target) as anonymous, CloudClient(target, api_key="wrong-key-123") as wrong:
        with caplog.at_level(logging.DEBUG, logger="sdk.serving.access_gate"):
            for client, says in (
                (wrong, "not valid"),
                (anonymous, "authorization: Bearer"),
            ):  # the first line per address is logged
                with pytest.raises(CloudUnauthenticatedError) as caught:
                    await anext(client.generate([5, 6], GREEDY))
                assert caught.value.code == CloudStatus.UNAUTHENTICATED and says in str(caught.value)
                with pytest.raises(CloudUnauthenticatedError):
                    await client.list_models()
            assert await wait_until_serving(anonymous)  # health is public
        assert "wrong-key-123" not in caplog.text and loggable_id(key_fingerprint("wrong-key-123")) in caplog.text

    async with CloudClient(target, api_key="key-two") as client:
        events = [e async for e in client.generate([5, 6], GREEDY)]
        assert events[-1].finish_reason == "length"
        assert [m.id for m in await client.list_models()] == ["tiny"]

    services = await asyncio.to_thread(_reflected_services, target)
    assert {"tandem.v1.Tandem", "grpc.health.v1.Health"} <= set(services)


def _reflected_services(target: str) -> list[str]:
    with grpc.insecure_channel(target) as channel:  # no key: reflection is public
        return ProtoReflectionDescriptorDatabase(channel).get_services()


@pytest.fixture
def self_signed(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return str(cert), str(key)


async def test_tls_round_trip_with_a_self_signed_certificate(engine, serve, self_signed):  # noqa: F811  (fixtures)
    cert, key = self_signed
    target = await serve(engine, tls_cert_path=cert, tls_key_path=key, api_keys=frozenset({"k"}))
    async with CloudClient(target, api_key="k", tls_root_cert=cert) as client:
        events = [e async for e in client.generate("w5 w6", GREEDY)]
        assert events[-1].finish_reason == "length"
        assert await wait_until_serving(client)
    async with CloudClient(target, api_key="k", timeout_s=5) as plaintext:
        with pytest.raises(CloudUnavailableError):
            await plaintext.list_models()


def test_config_wants_both_tls_files_or_neither():
    with pytest.raises(ValueError, match="both"):
        GrpcServerConfig(tls_cert_path="cert.pem")
    with pytest.raises(ValueError, match="port"):
        GrpcServerConfig(port=70000)


async def test_a_taken_port_is_a_clear_error(engine):  # noqa: F811  (fixtures)
    first = await start_grpc_server(engine, GrpcServerConfig(port=0))
    try:
        with pytest.raises(GrpcServerStartError, match="already in use"):
            await start_grpc_server(engine, GrpcServerConfig(port=bound_port(first)))
    finally:
        await stop_grpc_server(first, grace_s=0)
