"""Where a traffic record lives: a SQLite file (one per process), or the state database replicas
share (sdk.traffic.postgres_store, when `state_db` is set). `connect` opens either by its target,
a path or a postgresql:// URL, for the record, training, calibration and `tandem traffic`; the
operations of sdk.traffic.store then run on what it opened."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from sdk.traffic import store
from sdk.traffic.store import RecordConnection


def is_database(target: str | os.PathLike) -> bool:
    return urlsplit(str(target)).scheme in ("postgresql", "postgres")


def connect(target: str | os.PathLike, *, create: bool = True) -> RecordConnection:
    """A connection to the record at `target` (see the module docstring), its schema current."""
    if is_database(target):
        from sdk.traffic import postgres_store

        return postgres_store.connect(str(target), create=create)
    return store.connect(target, create=create)


def described(target: str | os.PathLike) -> str:
    """`target` for a log line or a message: a database URL without its password."""
    if is_database(target):
        from sdk.state.redaction import redacted

        return redacted(str(target))
    return str(target)
