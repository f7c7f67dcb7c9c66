"""What the state database's address and errors may show: passwords never, in a postgresql:// URL (its
user-info or its query string) or a `key=value` connection string alike. Log lines and /admin/status use
these; callers of the API see none of it (sdk.state.database)."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

SECRET_PARAMS = ("password", "sslpassword")

_DSN_SECRET = re.compile(r"\b((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def redacted(url: str) -> str:
    """`url` (a postgresql:// URL or a `key=value` connection string) with every password shown as ***."""
    if "://" not in url:
        return _DSN_SECRET.sub(r"\1***", url)
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        host = parts.hostname or ""
        netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(name, "***" if name.lower() in SECRET_PARAMS else value) for name, value in pairs], safe="*"
        )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def check_url(url: str) -> str:
    """`url`, if it names a PostgreSQL database (ValueError naming the setting otherwise)."""
    if urlsplit(url).scheme not in ("postgresql", "postgres"):
        raise ValueError(f"state_db must be a postgresql:// URL, got {redacted(url)!r}")
    return url


def reason(exc: BaseException) -> str:
    """The first line of an error, redacted: what a log line says of it."""
    text = str(exc).strip().splitlines()
    return redacted(text[0]) if text else type(exc).__name__
