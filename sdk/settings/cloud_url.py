"""Where the cascade's cloud tier is: `cloud.url` parsed into a CloudTarget, or a SettingsError
saying which forms are allowed."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from sdk.cloud.targets import is_replica_target
from sdk.settings.setting_field import SettingsError


@dataclass(frozen=True)
class CloudTarget:
    """Where the cascade's cloud tier is, parsed from `cloud.url`."""

    kind: str  # "embedded" | "none" | "grpc" | "http"
    target: str | None = None  # "host:port" for grpc, the base URL for http, None otherwise
    tls: bool = False  # grpcs:// or https://


CLOUD_URL_FORMS = (
    "'embedded', 'none', grpc://HOST:PORT, grpcs://HOST:PORT, replicas in gRPC's syntax (ipv4:H1:P1,H2:P2, "
    "ipv6:[H1]:P1,..., dns:///HOST:PORT) or an OpenAI-compatible http(s):// base URL"
)


def parse_cloud_url(url: str) -> CloudTarget:
    """The cloud tier named by `url`; SettingsError (saying which forms are allowed) otherwise."""
    if url in ("embedded", "none"):
        return CloudTarget(url)
    if is_replica_target(url):
        return CloudTarget("grpc", _replica_target(url), tls=False)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a port that is not a number, or out of range
        raise SettingsError(f"cloud URL {url!r} is malformed ({exc}); expected {CLOUD_URL_FORMS}") from exc
    if parts.scheme in ("grpc", "grpcs"):
        # A gRPC channel target is host:port only; a path would be silently ignored.
        if not parts.hostname or not port or parts.username or parts.path.strip("/") or parts.query or parts.fragment:
            raise SettingsError(f"cloud URL {url!r} must be {parts.scheme}://HOST:PORT with nothing after the port")
        return CloudTarget("grpc", parts.netloc, tls=parts.scheme == "grpcs")
    if parts.scheme in ("http", "https") and parts.hostname:
        return CloudTarget("http", url.rstrip("/"), tls=parts.scheme == "https")
    raise SettingsError(f"cloud URL {url!r} is not supported; expected {CLOUD_URL_FORMS}")


def _replica_target(url: str) -> str:
    """A set of replicas as gRPC names them, checked enough that a typo fails here, not at the first call."""
    scheme, _, rest = url.partition(":")
    if scheme == "dns":
        name = rest[3:] if rest.startswith("///") else rest
        host, _, port = name.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SettingsError(f"cloud URL {url!r} must be dns:///HOST:PORT (every address HOST resolves to, on PORT)")
        return url
    addresses = rest.split(",")
    for address in addresses:
        host, _, port = address.rpartition(":")
        if (
            not host
            or not port.isdigit()
            or not 0 < int(port) < 65536
            or (scheme == "ipv6" and not host.startswith("["))
        ):
            form = "[ADDR]:PORT" if scheme == "ipv6" else "ADDR:PORT"
            raise SettingsError(f"cloud URL {url!r}: {address!r} is not {form}; expected {scheme}:{form},{form},...")
    return url
