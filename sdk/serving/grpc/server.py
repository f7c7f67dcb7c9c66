"""Starting and stopping the cloud tier's gRPC server (grpc.aio) around an engine.

Besides tandem.v1.Tandem the server runs the standard grpc.health.v1 service (NOT_SERVING
until the engine is ready, for "" and for "tandem.v1.Tandem") and server reflection (unless
turned off). When API keys or per-client limits are configured, every call except health and
reflection goes through an AccessGate (sdk.serving.grpc.auth); pass the process's ClientLimits
to share one budget per key with its HTTP listener. It listens on host:port, or on a unix
domain socket.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sdk.serving.grpc.auth import AccessInterceptor
from sdk.serving.grpc.service import SERVICE_NAME, add_tandem_servicer
from sdk.serving.access_gate import AccessGate
from sdk.serving.api_keys import is_loopback
from sdk.serving.client_limits import DEFAULT_AUTH_BACKOFF_AFTER, DEFAULT_AUTH_BACKOFF_MAX_S, ClientLimits
from sdk.protocol.drafts import DraftLimits
from sdk.protocol.engine import EngineProtocol

logger = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # gRPC's own default for received messages
READY_POLL_S = 0.1  # how soon health turns SERVING once the engine has loaded
HEALTH_POLL_S = 0.2  # afterwards: how soon it turns NOT_SERVING if the engine stops or the replica drains
HEALTH_SERVICES = ("", SERVICE_NAME)  # "" is the whole server, as load balancers ask


class GrpcServerStartError(OSError):
    """The server could not listen on the configured address."""


@dataclass
class GrpcServerConfig:
    """Where and how the gRPC server listens."""

    host: str = "127.0.0.1"  # loopback by default: expose it on purpose (0.0.0.0, with TLS and keys)
    port: int = 50051  # 0: any free port (see bound_port)
    api_keys: frozenset[str] = frozenset()  # empty: no authentication
    tls_cert_path: str | None = None  # PEM certificate chain; TLS needs both paths
    tls_key_path: str | None = None  # PEM private key
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # larger requests get RESOURCE_EXHAUSTED from gRPC
    max_concurrent_streams: int | None = None  # per HTTP/2 connection; None: gRPC's default
    unix_socket_path: str | None = None  # listen on this unix domain socket instead of host:port
    reflection: bool = True  # server reflection (grpcurl-style discovery); off for private listeners
    # The HTTP servers' settings, same meaning (sdk.serving.client_limits); None: off.
    rate_limit_per_minute: float | None = None  # calls a minute per key (per client address without keys)
    rate_limit_burst: float | None = None  # default: the per-minute figure
    max_concurrent_per_key: int | None = None  # calls in flight at once per key (per address without keys)
    auth_backoff_after: int | None = (
        DEFAULT_AUTH_BACKOFF_AFTER  # failed keys per address before it backs off; 0/None: off
    )
    auth_backoff_max_s: float = DEFAULT_AUTH_BACKOFF_MAX_S
    # What GenerateWithDrafts takes of a request's drafts (sdk.serving.grpc.draft_door; [cloud_server] settings).
    draft_limits: DraftLimits = field(default_factory=DraftLimits)

    def __post_init__(self) -> None:
        self.api_keys = frozenset(self.api_keys)
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if (self.tls_cert_path is None) != (self.tls_key_path is None):
            raise ValueError("TLS needs both tls_cert_path and tls_key_path (or neither, for plaintext)")
        if self.max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be >= 1, got {self.max_message_bytes}")
        if self.max_concurrent_streams is not None and self.max_concurrent_streams < 1:
            raise ValueError(f"max_concurrent_streams must be >= 1, got {self.max_concurrent_streams}")

    @property
    def address(self) -> str:
        if self.unix_socket_path is not None:
            return f"unix:{self.unix_socket_path}"
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"


@dataclass
class _Running:
    """What stop_grpc_server and bound_port need to find for a server."""

    health: health.aio.HealthServicer
    readiness: asyncio.Task
    port: int


_running: weakref.WeakKeyDictionary[grpc.aio.Server, _Running] = weakref.WeakKeyDictionary()


async def start_grpc_server(
    engine: EngineProtocol, config: GrpcServerConfig, limits: ClientLimits | None = None
) -> grpc.aio.Server:
    """A started server bound to config.address; raises GrpcServerStartError if it cannot listen.
    `limits`: the process's shared per-client budgets; None builds them from config."""
    credentials = _server_credentials(config)
    options = [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        # gRPC sets SO_REUSEPORT by default, which would let a second server "bind" a taken port.
        ("grpc.so_reuseport", 0),
    ]
    if config.max_concurrent_streams is not None:
        options.append(("grpc.max_concurrent_streams", config.max_concurrent_streams))
    if limits is None:
        limits = ClientLimits.build(
            config.rate_limit_per_minute,
            config.rate_limit_burst,
            config.max_concurrent_per_key,
            auth_backoff_after=config.auth_backoff_after,
            auth_backoff_max_s=config.auth_backoff_max_s,
        )
    gate = AccessGate(config.api_keys, limits)
    interceptors = [AccessInterceptor(gate)] if gate.active else []
    server = grpc.aio.server(interceptors=interceptors, options=options)

    add_tandem_servicer(engine, server, config.draft_limits)
    health_servicer = health.aio.HealthServicer()
    for name in HEALTH_SERVICES:  # the servicer starts out SERVING; nothing is served before the engine loads
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if config.reflection:
        health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
        reflection.enable_server_reflection((SERVICE_NAME, health_name, reflection.SERVICE_NAME), server)

    try:
        port = (
            server.add_secure_port(config.address, credentials)
            if credentials
            else server.add_insecure_port(config.address)
        )
    except RuntimeError as exc:  # grpc's way of saying the bind failed
        raise GrpcServerStartError(
            f"cannot listen on {config.address}: the port is already in use or the address is not available here"
        ) from exc
    await server.start()
    readiness = asyncio.create_task(_track_readiness(engine, health_servicer), name="tandem-grpc-health")
    _running[server] = _Running(health_servicer, readiness, port)
    auth = f"{len(config.api_keys)} API key(s)" if config.api_keys else "no authentication"
    where = config.address if config.unix_socket_path is not None else f"{config.host}:{port}"
    logger.info("gRPC server on %s (%s, %s)", where, "TLS" if credentials else "plaintext", auth)
    if config.api_keys and not credentials and config.unix_socket_path is None and not is_loopback(config.host):
        logger.warning("API keys are checked but travel in plaintext: configure TLS for a non-loopback host")
    return server


async def stop_grpc_server(server: grpc.aio.Server, grace_s: float | None = 5.0) -> None:
    """Health turns NOT_SERVING first (load balancers stop sending), then calls get grace_s to finish."""
    running = _running.pop(server, None)
    if running is not None:
        running.readiness.cancel()
        await asyncio.gather(running.readiness, return_exceptions=True)
        await running.health.enter_graceful_shutdown()
    await server.stop(grace_s)


def bound_port(server: grpc.aio.Server) -> int:
    """The port a server started by start_grpc_server listens on (the chosen one when port was 0)."""
    return _running[server].port


def _server_credentials(config: GrpcServerConfig) -> grpc.ServerCredentials | None:
    if config.tls_cert_path is None or config.tls_key_path is None:
        return None
    pem = {}
    for what, path in (("certificate", config.tls_cert_path), ("private key", config.tls_key_path)):
        try:
            with open(path, "rb") as handle:
                pem[what] = handle.read()
        except OSError as error:
            raise GrpcServerStartError(f"cannot read the TLS {what} {path!r}: {error.strerror}") from error
    return grpc.ssl_server_credentials([(pem["private key"], pem["certificate"])])


async def _track_readiness(engine: EngineProtocol, health_servicer: health.aio.HealthServicer) -> None:
    """Mirror engine.is_ready into the health service (polled: any EngineProtocol engine has it)."""
    serving: bool | None = None
    while True:
        ready = bool(engine.is_ready)
        if ready != serving:
            status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
            for name in HEALTH_SERVICES:
                await health_servicer.set(name, status)
            logger.info("gRPC health: %s", "SERVING" if ready else "NOT_SERVING")
            serving = ready
        await asyncio.sleep(HEALTH_POLL_S if ready else READY_POLL_S)
