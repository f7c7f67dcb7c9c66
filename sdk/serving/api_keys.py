"""API keys for the hosted endpoints (HTTP and gRPC): where they come from and how they are checked.

Keys come from a file (one per line; blank lines and `#` comments ignored) and/or an
environment variable (comma-separated). Presented keys are compared in constant time
against every configured key, and keys are never logged.

A key's id (`key_fingerprint`) is the whole SHA-256 of the key, 64 hex digits: what owns stored
responses, budgets and traffic rows. Keys are high-entropy secrets, so the bare hash is enough (no salt
to keep); a short id would let two of many keys collide and share what each owns. Logs show the id's
first LOGGED_DIGITS digits (`loggable_id`), which budgets.toml's `[keys.<id>]` also accepts.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from collections.abc import Iterable

API_KEYS_ENV = "TANDEM_API_KEYS"


class ApiKeyConfigError(ValueError):
    """The key file is missing or unreadable, or it holds no key."""


def load_api_keys(path: str | None = None, env_var: str = API_KEYS_ENV) -> frozenset[str]:
    """Keys from `path` and `$env_var`; empty when neither is set (the server then runs without auth)."""
    keys: set[str] = set()
    if path:
        file_keys = read_key_file(path, "API key file")
        if not file_keys:
            raise ApiKeyConfigError(f"API key file {path!r} holds no key")
        keys |= set(file_keys)
    keys |= {part.strip() for part in os.environ.get(env_var, "").split(",") if part.strip()}
    return frozenset(keys)


def read_key_file(path: str, what: str) -> list[str]:
    """The keys of a key file, in order: one per line, blank lines and `#` comments skipped
    (ApiKeyConfigError, naming `what`, when it cannot be read)."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError as error:
        raise ApiKeyConfigError(f"cannot read {what} {path!r}: {error.strerror}") from error
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def bearer_token(header_value: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` value, or None when absent or malformed."""
    if not header_value:
        return None
    scheme, _, token = header_value.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def matching_key(presented: str | None, keys: Iterable[str]) -> str | None:
    """The configured key equal to `presented`, compared in constant time against every key."""
    if presented is None:
        return None
    found = None
    candidate = presented.encode()
    for key in keys:  # no early exit: timing does not reveal which key (or how much of one) matched
        if hmac.compare_digest(candidate, key.encode()):
            found = key
    return found


LOGGED_DIGITS = 16  # of a key's id in log lines: enough to tell keys apart, and what budgets.toml accepts


def key_fingerprint(key: str) -> str:
    """A key's id: the whole SHA-256 of it (64 hex digits), non-reversible, never the key itself."""
    return hashlib.sha256(key.encode()).hexdigest()


def loggable_id(fingerprint: str) -> str:
    """The prefix of a key's id that log lines show."""
    return fingerprint[:LOGGED_DIGITS]


LOOPBACK_NAMES = frozenset({"localhost"})


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`; anything else (0.0.0.0, '', a LAN name) is reachable from
    outside, so keys (and, for gRPC, TLS) matter there. Both servers warn with this test."""
    host = host.strip().strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
