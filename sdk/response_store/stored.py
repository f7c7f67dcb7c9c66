"""What a stored response is, and what every store does with one (sdk.response_store)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

MAINTENANCE_EVERY_S = 60.0  # retention is applied at most this often (and every MAINTENANCE_EVERY_PUTS)
MAINTENANCE_EVERY_PUTS = 200
MB = 1024 * 1024


@dataclass(frozen=True)
class StoreSettings:
    """The bounds of a store. Sizes are checked on every put, per key: a put past its key's share deletes
    that key's oldest rows; a put past the whole store's bound deletes that key's oldest too, and is not
    kept when they are not enough. So one key's puts never delete another key's responses."""

    retention_days: float = 30.0  # rows older than this are deleted
    max_mb: float = 256.0  # the whole store
    max_mb_per_key: float = 32.0  # one key's share (at most max_mb)
    max_row_mb: float = 2.0  # one stored response (at most one key's share): a larger one is not kept

    def __post_init__(self) -> None:
        if min(self.retention_days, self.max_mb, self.max_mb_per_key, self.max_row_mb) <= 0:
            raise ValueError(
                "responses_retention_days, responses_max_mb, responses_max_mb_per_key and responses_max_row_mb "
                "must be > 0"
            )

    @property
    def max_bytes(self) -> int:
        return int(self.max_mb * MB)

    @property
    def max_bytes_per_key(self) -> int:
        return min(int(self.max_mb_per_key * MB), self.max_bytes)

    @property
    def max_row_bytes(self) -> int:
        return min(int(self.max_row_mb * MB), self.max_bytes_per_key)

    def oldest_kept(self) -> float:
        """The creation time (seconds since the epoch) before which a response is past its retention."""
        return time.time() - self.retention_days * 86400


@dataclass(frozen=True)
class StoredResponse:
    id: str
    key_fingerprint: str | None  # the API key's id, its whole SHA-256 (None on a server without keys)
    created_at: float
    conversation: list[dict[str, Any]]  # chat messages: the history, this input, the answer
    response: dict[str, Any]  # the response object as answered (GET returns it)

    def to_row(self) -> dict[str, Any]:
        """Its row in either store, by column name (sdk.state.tables.responses.RESPONSES), its size counted."""
        conversation, response = _json(self.conversation), _json(self.response)
        return {
            "id": self.id,
            "key_fingerprint": self.key_fingerprint,
            "created_at": self.created_at,
            "bytes": row_bytes(self.id, conversation, response),
            "conversation": conversation,
            "response": response,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StoredResponse:
        """From a row of either store read by column name (READ_COLUMNS at least)."""
        return cls(
            row["id"],
            row["key_fingerprint"],
            row["created_at"],
            json.loads(row["conversation"]),
            json.loads(row["response"]),
        )


READ_COLUMNS = ("id", "key_fingerprint", "created_at", "conversation", "response")  # what from_row reads


def _json(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def row_bytes(response_id: str, conversation: str, response: str) -> int:
    """What a row counts against the bounds: its texts' UTF-8 bytes."""
    return len(response_id) + len(conversation.encode()) + len(response.encode())


def size_of(conversation: list[dict[str, Any]], response: dict[str, Any]) -> int:
    """The bytes a response with this conversation and object would count (before it is answered: its echo)."""
    return row_bytes("", _json(conversation), _json(response))


@runtime_checkable
class ResponseStore(Protocol):
    """What every store does (sdk.response_store.sqlite_store, postgres_store), and all the server asks of
    one. `key` is the caller's key id: another key's response is not found (get: None; delete: False)."""

    where: str  # for log lines and messages
    settings: StoreSettings

    async def put(self, stored: StoredResponse) -> bool:
        """Keep it (before the answer naming it goes out); False when it is not kept: larger than one
        response may be, or its key's older responses free too little of a full store."""
        ...

    async def get(self, response_id: str, key: str | None) -> StoredResponse | None: ...

    async def delete(self, response_id: str, key: str | None) -> bool: ...

    async def stored_bytes(self, key: str | None = None, *, every_key: bool = True) -> int:
        """The bytes all rows hold; with `every_key=False`, the bytes of `key`'s rows."""
        ...

    async def close(self) -> None: ...


class MaintenanceClock:
    """When a store should next delete what is past its retention: every MAINTENANCE_EVERY_S seconds or
    MAINTENANCE_EVERY_PUTS puts, whichever comes first (expired rows are never answered meanwhile)."""

    def __init__(self, every_s: float = MAINTENANCE_EVERY_S, every_puts: int = MAINTENANCE_EVERY_PUTS):
        self.every_s = every_s
        self.every_puts = every_puts
        self._last = float("-inf")
        self._puts = 0

    def due(self) -> bool:
        self._puts += 1
        now = time.monotonic()
        if self._puts >= self.every_puts or now - self._last >= self.every_s:
            self._last, self._puts = now, 0
            return True
        return False
