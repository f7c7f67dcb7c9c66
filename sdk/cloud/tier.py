"""The cloud tier `tandem serve` routes to, built from [cloud] (sdk.settings.serve_config.CloudTierConfig):

- "embedded": the PyTorch cloud engine started in this process, behind its gRPC service on a
  listener only this process can use (serve_embedded: a per-process key, a unix socket in a
  0700 directory, no reflection); the cascade reaches it like a remote one;
- "grpc://HOST:PORT" / "grpcs://...": a `tandem cloud serve` elsewhere (sdk.cloud.grpc_client);
- "http(s)://.../v1": any OpenAI-compatible server (sdk.cloud.openai_client);
- "none": a device-only deployment; escalations answer locally, marked degraded.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sdk.protocol.cloud_backend import CloudBackend

if TYPE_CHECKING:
    from sdk.settings.serve_config import CloudTierConfig

logger = logging.getLogger("tandem.serve")


@dataclass
class CloudTier:
    client: CloudBackend | None = None  # what the cascade runner calls; None for "none"
    engine: Any = None  # the embedded AsyncCloudEngine
    grpc_server: Any = None  # the embedded engine's gRPC server
    description: str = "none"
    pending: bool = False  # an embedded tier not started yet (tandem serve starts it behind the local tier)
    socket_folder: str | None = None  # the embedded listener's 0700 directory (removed on close)

    @property
    def is_ready(self) -> bool:
        """False only while an embedded engine is still starting or loading (remote tiers are probed
        by the breaker)."""
        return not self.pending and (self.engine is None or self.engine.is_ready)

    def take(self, other: CloudTier) -> None:
        """Become `other`, a tier started later (its client, engine and server are ours to close)."""
        self.client, self.engine, self.grpc_server, self.description = (
            other.client,
            other.engine,
            other.grpc_server,
            other.description,
        )
        self.socket_folder, self.pending = other.socket_folder, False

    async def close(self) -> None:
        """Stop in dependency order: the client, then the server it talks to, then the engine."""
        from sdk.serving.grpc.server import stop_grpc_server

        if self.client is not None:
            await self.client.close()
        if self.grpc_server is not None:
            await stop_grpc_server(self.grpc_server, grace_s=2.0)
        if self.engine is not None:
            self.engine.shutdown()
        if self.socket_folder is not None:
            shutil.rmtree(self.socket_folder, ignore_errors=True)


async def start_cloud_tier(config: CloudTierConfig) -> CloudTier:
    """The cloud tier [cloud] describes (call in the serving event loop: clients bind to it)."""
    target = config.target
    if target.kind == "none":
        return CloudTier()
    if target.kind == "http":
        from sdk.cloud.openai_client import OpenAICloudClient

        return CloudTier(OpenAICloudClient(target.target, api_key=config.api_key), description=target.target)
    from sdk.cloud.grpc_client import CloudClient
    from sdk.cloud.targets import is_replica_target

    if target.kind == "grpc":
        # Replicas in gRPC's name syntax have no grpcs:// form: TLS when a CA file is configured.
        replicas_over_tls = is_replica_target(target.target) and config.tls_ca
        tls = (config.tls_ca or True) if target.tls or replicas_over_tls else None
        return CloudTier(CloudClient(target.target, api_key=config.api_key, tls_root_cert=tls), description=config.url)
    return await _start_embedded(config.engine)


async def _start_embedded(engine_config) -> CloudTier:
    from cloud_engine.async_engine import AsyncCloudEngine

    engine = AsyncCloudEngine(engine_config).start()  # loads on its own thread
    try:
        return await serve_embedded(engine)
    except BaseException:
        engine.shutdown()
        raise


async def serve_embedded(engine, use_unix_socket: bool = hasattr(socket, "AF_UNIX")) -> CloudTier:
    """The embedded engine behind a gRPC listener only this process can use: a random key that
    lives in this process's memory only (every call but health needs it), no reflection, and a
    unix domain socket in a fresh 0700 directory (loopback TCP where the platform has none). Any
    other process on the host is refused, whatever port or path it finds, and cannot lock this
    process out by failing keys: the listener has no failed-key backoff (see below)."""
    from sdk.serving.grpc.server import GrpcServerConfig, bound_port, start_grpc_server
    from sdk.cloud.grpc_client import CloudClient

    key = secrets.token_urlsafe(32)
    folder = tempfile.mkdtemp(prefix="tandem-cloud-") if use_unix_socket else None  # mkdtemp: mode 0700
    try:
        # No failed-key backoff here (auth_backoff_after=0), on the socket and on the TCP fallback alike.
        # The backoff is kept per peer address, and every peer of a unix socket is one address ("unix":
        # grpc reports no pid or uid for it, and its auth context carries no SO_PEERCRED), as is every
        # process on loopback ("127.0.0.1"): another process sending wrong keys would lock this process
        # out of its own cloud tier (escalations degraded to cloud_overloaded). The backoff has nothing
        # to protect here anyway: the key is 256 random bits that never leave this process's memory,
        # so guessing it is hopeless at any rate, and only this user can reach the 0700 socket folder.
        config = GrpcServerConfig(
            host="127.0.0.1",
            port=0,
            api_keys=frozenset({key}),
            reflection=False,
            auth_backoff_after=0,
            unix_socket_path=os.path.join(folder, "grpc.sock") if folder else None,
        )
        server = await start_grpc_server(engine, config)
    except BaseException:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    target = config.address if folder else f"127.0.0.1:{bound_port(server)}"
    logger.info("embedded cloud engine: gRPC on %s (this process only: a per-process key, no reflection)", target)
    return CloudTier(
        CloudClient(target, api_key=key),
        engine=engine,
        grpc_server=server,
        description=f"embedded ({target})",
        socket_folder=folder,
    )
