"""The cloud clients implement the declared CloudBackend (sdk.protocol.cloud_backend): their
capabilities are fields the cascade reads, and their failures carry a transport-neutral status."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from router.failure_kinds import FailureKind, classify_failure
from sdk.cascade.config import CascadeConfig
from sdk.cascade.runner import CascadeRunner
from sdk.cloud.grpc_client import CloudClient, cloud_error
from sdk.cloud.openai_client import OpenAICloudClient
from sdk.cloud.openai_wire import error_from_response
from sdk.protocol.cloud_backend import CloudBackend, CloudContextLengthError, CloudStatus, CloudUnavailableError


def test_both_clients_are_cloud_backends_with_their_capabilities_declared():
    grpc_client, http_client = CloudClient("localhost:1"), OpenAICloudClient("http://localhost:1/v1")
    assert all(
        CloudBackend in type(client).__mro__ for client in (grpc_client, http_client)
    )  # declared, not just shaped alike
    assert (grpc_client.supports_continuation, grpc_client.takes_grammars) == (True, True)
    # The HTTP client's depend on the server (discover(): tests/sdk/test_vllm_cloud.py); before it knows, it
    # claims both, so that a request needing one makes the cascade ask the server first.
    assert (http_client.supports_continuation, http_client.takes_grammars, http_client.continues_constrained) == (
        True,
        True,
        False,
    )
    assert not grpc_client.spreads_over_replicas and not http_client.spreads_over_replicas
    assert CloudClient("ipv4:10.0.0.1:1,10.0.0.2:1").spreads_over_replicas
    for method in ("generate", "list_models", "health", "close"):
        declared = inspect.signature(getattr(CloudBackend, method)).parameters
        for client in (CloudClient, OpenAICloudClient):
            own = inspect.signature(getattr(client, method)).parameters
            assert set(declared) - {"self"} <= set(own), (client.__name__, method)  # callable as declared


def test_leaving_async_with_closes_what_each_client_opened():
    async def open_in_async_with(client, transport):
        async with client as entered:
            assert entered is client
            opened = transport(client)  # opened on first use, as a call would
        return opened

    grpc_client, http_client = CloudClient("localhost:1"), OpenAICloudClient("http://localhost:1/v1")
    assert asyncio.run(open_in_async_with(grpc_client, lambda client: client.channel)) is not None
    assert grpc_client._channel is None  # closed, and opened again by the next call
    http = asyncio.run(open_in_async_with(http_client, lambda client: client.http))
    assert http.is_closed and http_client._http is None


def test_a_backend_that_cannot_continue_is_refused_for_continue_handoff():
    class TextOnlyCloud(CloudBackend):
        supports_continuation = False

    with pytest.raises(ValueError, match="cannot continue"):
        CascadeRunner(local=None, cloud=TextOnlyCloud(), config=CascadeConfig(handoff="continue"))


class _RpcError:
    """What grpc.aio.AioRpcError offers cloud_error: a code (its `.name`), details and trailing metadata."""

    def __init__(self, code_name: str, metadata=()):
        import grpc

        self._code, self._metadata = getattr(grpc.StatusCode, code_name), metadata

    def code(self):
        return self._code

    def details(self):
        return "details"

    def trailing_metadata(self):
        return self._metadata


@pytest.mark.parametrize(
    "code_name", ["UNAVAILABLE", "DEADLINE_EXCEEDED", "INVALID_ARGUMENT", "UNAUTHENTICATED", "INTERNAL", "DATA_LOSS"]
)
def test_grpc_and_http_failures_map_to_the_same_neutral_status(code_name):
    error = cloud_error(_RpcError(code_name), "host:1")
    assert isinstance(error.code, CloudStatus) and error.code.name == code_name
    assert classify_failure(error) is not None
    http = {"UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504, "INVALID_ARGUMENT": 400, "UNAUTHENTICATED": 401}.get(
        code_name
    )
    if http is not None:
        assert error_from_response(http, {}, b"{}", "http://h/v1").code is error.code
        assert classify_failure(error_from_response(http, {}, b"{}", "http://h/v1")) is classify_failure(error)


def test_context_length_travels_in_metadata_and_in_words():
    grpc_error = cloud_error(_RpcError("INVALID_ARGUMENT", (("tandem-error-type", "context_length_exceeded"),)))
    http_error = error_from_response(
        400, {}, b'{"error": {"message": "too long", "code": "context_length_exceeded"}}', "u"
    )
    assert isinstance(grpc_error, CloudContextLengthError) and isinstance(http_error, CloudContextLengthError)
    unavailable = cloud_error(_RpcError("UNAVAILABLE"), "host:1")
    assert isinstance(unavailable, CloudUnavailableError) and classify_failure(unavailable) is FailureKind.UNAVAILABLE
