"""The SDK's client of the cloud tier's gRPC service (tandem.v1): generate, list models, health.

A `CloudBackend` (sdk.protocol.cloud_backend). Every failure is raised as a `CloudError` whose
`CloudStatus` is the gRPC status code of the same name; the subclasses the cascade router acts on
also inherit the engine exception with the same meaning (`CloudInvalidArgumentError` is an
`InvalidRequestError`, `CloudOverloadedError` an `EngineOverloadedError`, ...), so code written
against a local engine handles them too.

The channel is opened on first use, in the running event loop; use one client per loop
and close it (or use `async with`).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sdk.cloud.grpc_drafts import DraftedGeneration
from sdk.cloud.targets import is_replica_target
from sdk.protocol.cloud_backend import (
    CloudBackend,
    CloudContextLengthError,
    CloudDeadlineExceededError,
    CloudError,
    CloudInvalidArgumentError,
    CloudModel,
    CloudOverloadedError,
    CloudQuotaExceededError,
    CloudStatus,
    CloudTokenEvent,
    CloudUnauthenticatedError,
    CloudUnavailableError,
    Prompt,
)
from sdk.protocol.engine import SamplingParams
from sdk.protocol.wire import tandem_pb2 as pb
from sdk.protocol.wire import tandem_pb2_grpc as pb_grpc
from sdk.protocol.wire.messages import event_from_response, request_message
from sdk.protocol.wire.status import (
    CONTEXT_LENGTH_TYPE,
    ERROR_PARAM_KEY,
    ERROR_TYPE_KEY,
    INSUFFICIENT_QUOTA_TYPE,
    RETRY_AFTER_KEY,
)

__all__ = [
    "CloudClient",
    "CloudModel",
    "CloudTokenEvent",
    "CloudError",
    "CloudUnauthenticatedError",
    "CloudUnavailableError",
    "CloudDeadlineExceededError",
    "CloudInvalidArgumentError",
    "CloudContextLengthError",
    "CloudOverloadedError",
    "CloudQuotaExceededError",
]  # (the errors and events are declared in sdk.protocol.cloud_backend)


# gRPC backs off reconnecting to a dead server exponentially up to 120 s, failing calls at once in
# between: a cloud that came back stayed unreachable through the circuit breaker's half-open trial
# (found by tests/reliability/test_cloud_faults.py). The breaker already limits how often a dead cloud
# is called, so reconnect attempts can stay frequent: one connect every 2 s at most is cheap.
# (grpc.min_reconnect_backoff_ms stays at its default: gRPC also uses it as the connect timeout, and a
# TLS handshake over a mobile network can take seconds.)
CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
)

# Replica targets (sdk.cloud.targets): calls spread over the replicas in turn (round_robin), each replica watched
# through grpc.health.v1 (the servers implement it) so one that is NOT_SERVING (loading, draining on
# SIGTERM or an admin call) gets no new calls until it serves again; calls it already has go on.
REPLICA_SERVICE_CONFIG = json.dumps(
    {
        "loadBalancingConfig": [{"round_robin": {}}],
        "healthCheckConfig": {"serviceName": pb.DESCRIPTOR.services_by_name["Tandem"].full_name},
    }
)


def channel_options(target: str) -> tuple[tuple[str, object], ...]:
    if not is_replica_target(target):
        return CHANNEL_OPTIONS
    return CHANNEL_OPTIONS + (("grpc.service_config", REPLICA_SERVICE_CONFIG),)


class CloudClient(CloudBackend):
    """Talks to one tandem.v1 server.

    target: "host:port", or replicas in gRPC's name syntax ("ipv4:h1:p1,h2:p2", "dns:///host:port"):
    round robin over the replicas that report SERVING (REPLICA_SERVICE_CONFIG).
    api_key: sent as `authorization: Bearer <key>`.
    tls_root_cert: None for plaintext; PEM bytes or a PEM file path to trust that CA (or
    self-signed certificate); True for TLS with the system's trusted roots.
    timeout_s: the default deadline of each call (of a whole Generate stream), None for none.
    """

    verifies_drafts = True  # GenerateWithDrafts (a server whose engine verifies none refuses it: FAILED_PRECONDITION)

    def __init__(
        self,
        target: str,
        api_key: str | None = None,
        tls_root_cert: bytes | str | os.PathLike | bool | None = None,
        timeout_s: float | None = None,
    ):
        self.target = target
        self.timeout_s = timeout_s
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._credentials = _channel_credentials(tls_root_cert)
        self._channel: grpc.aio.Channel | None = None

    @property
    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            if self._credentials is None:
                self._channel = grpc.aio.insecure_channel(self.target, options=channel_options(self.target))
            else:
                self._channel = grpc.aio.secure_channel(
                    self.target, self._credentials, options=channel_options(self.target)
                )
        return self._channel

    @property
    def spreads_over_replicas(self) -> bool:
        return is_replica_target(self.target)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        model: str = "",
        request_id: str = "",
        continuation_token_ids: Sequence[int] = (),
        priority: int = 0,
        timeout_s: float | None = None,
    ) -> AsyncIterator[CloudTokenEvent]:
        """Stream the tokens for a prompt: text, token ids, or chat messages ({"role", "content"} dicts).

        params None takes the server's defaults (max_tokens: what the context has left). The
        last event carries finish_reason and the usage counts. Closing the iterator early
        cancels the call, which aborts the request on the server.
        """
        message = request_message(
            prompt,
            params,
            request_id=request_id,
            model=model,
            continuation_token_ids=continuation_token_ids,
            priority=priority,
        )
        call = pb_grpc.TandemStub(self.channel).Generate(
            message, timeout=self._timeout(timeout_s), metadata=self._metadata
        )
        num_output_tokens = 0
        try:
            async for response in call:
                num_output_tokens += 1
                yield event_from_response(response, num_output_tokens)
        except grpc.aio.AioRpcError as error:
            raise cloud_error(error, self.target) from None
        finally:
            call.cancel()  # a no-op once the stream ended; otherwise the server frees the request

    def generate_with_drafts(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        model: str = "",
        request_id: str = "",
        continuation_token_ids: Sequence[int] = (),
        timeout_s: float | None = None,
    ) -> DraftedGeneration:
        """As `generate`, with the caller drafting (sdk.cloud.grpc_drafts): iterate the returned call for
        the cloud's tokens, and `offer` it drafts of the next ones meanwhile."""
        message = request_message(
            prompt, params, request_id=request_id, model=model, continuation_token_ids=continuation_token_ids
        )
        return DraftedGeneration(
            self.channel,
            message,
            self._timeout(timeout_s),
            self._metadata,
            lambda error: cloud_error(error, self.target),
        )

    async def list_models(self, timeout_s: float | None = None) -> list[CloudModel]:
        try:
            response = await pb_grpc.TandemStub(self.channel).ListModels(
                pb.ListModelsRequest(), timeout=self._timeout(timeout_s), metadata=self._metadata
            )
        except grpc.aio.AioRpcError as error:
            raise cloud_error(error, self.target) from None
        return [CloudModel(card.id, card.max_model_len, card.vocabulary_fingerprint) for card in response.models]

    async def health(self, service: str = "", timeout_s: float | None = None) -> str:
        """The grpc.health.v1 status name: "SERVING", "NOT_SERVING", ... ("" asks about the whole server)."""
        try:
            response = await health_pb2_grpc.HealthStub(self.channel).Check(
                health_pb2.HealthCheckRequest(service=service),
                timeout=self._timeout(timeout_s),
                metadata=self._metadata,
            )
        except grpc.aio.AioRpcError as error:
            raise cloud_error(error, self.target) from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def _timeout(self, timeout_s: float | None) -> float | None:
        return self.timeout_s if timeout_s is None else timeout_s


def cloud_error(error: grpc.aio.AioRpcError, target: str = "") -> CloudError:
    """The CloudError for a failed call, rebuilt from its status and tandem's trailing metadata."""
    code = CloudStatus.__members__.get(
        error.code().name, CloudStatus.UNKNOWN
    )  # every failing gRPC code has its namesake
    details = error.details() or error.code().name
    metadata = {key: value for key, value in (error.trailing_metadata() or ()) if isinstance(value, str)}
    param = metadata.get(ERROR_PARAM_KEY)
    retry_after_s = float(metadata.get(RETRY_AFTER_KEY, "1") or 1)
    if code == CloudStatus.UNAUTHENTICATED:
        cls: type[CloudError] = CloudUnauthenticatedError
    elif code == CloudStatus.UNAVAILABLE:
        cls = CloudUnavailableError
        details = f"the cloud tier at {target} is unavailable: {details}" if target else details
    elif code == CloudStatus.DEADLINE_EXCEEDED:
        cls = CloudDeadlineExceededError
    elif code in (CloudStatus.INVALID_ARGUMENT, CloudStatus.NOT_FOUND):
        cls = (
            CloudContextLengthError
            if metadata.get(ERROR_TYPE_KEY) == CONTEXT_LENGTH_TYPE
            else CloudInvalidArgumentError
        )
    elif code == CloudStatus.RESOURCE_EXHAUSTED and metadata.get(ERROR_TYPE_KEY) == INSUFFICIENT_QUOTA_TYPE:
        cls = CloudQuotaExceededError
    elif code == CloudStatus.RESOURCE_EXHAUSTED and RETRY_AFTER_KEY in metadata:
        cls = CloudOverloadedError  # the engine's queue; gRPC's own limits (message size) carry no retry-after
    else:
        cls = CloudError
    return cls(details, code, param=param, retry_after_s=retry_after_s)


def _channel_credentials(tls_root_cert: bytes | str | os.PathLike | bool | None) -> grpc.ChannelCredentials | None:
    if tls_root_cert is None or tls_root_cert is False:
        return None
    if tls_root_cert is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls_root_cert, bytes):
        return grpc.ssl_channel_credentials(root_certificates=tls_root_cert)
    with open(tls_root_cert, "rb") as handle:
        return grpc.ssl_channel_credentials(root_certificates=handle.read())
