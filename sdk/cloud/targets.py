"""Which cloud targets name a set of replicas (gRPC's own name syntax), kept free of grpc so that
settings can check a `--cloud` value without importing it.

    "ipv4:10.0.0.1:50051,10.0.0.2:50051", "ipv6:[::1]:50051,...",
    "dns:///cloud.internal:50051" (every address the name resolves to, re-resolved as it changes)
"""

from __future__ import annotations

REPLICA_TARGET_SCHEMES = ("dns:", "ipv4:", "ipv6:")


def is_replica_target(target: str) -> bool:
    """Whether `target` names a set of replicas in gRPC's name syntax (not one host:port)."""
    return target.startswith(REPLICA_TARGET_SCHEMES)
