"""What a stored response is, and what every store does with one (sdk.response_store)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Protocol

MAINTENANCE_EVERY_S = 60.0  # retention and size are checked at most this often (and every MAINTENANCE_EVERY_PUTS)
MAINTENANCE_EVERY_PUTS = 200
SIZE_SLACK = 0.9  # past the size bound, the oldest rows go until the rest is under this share of it


@dataclass(frozen=True)
class StoreSettings:
    retention_days: float = 30.0  # rows older than this are deleted
    max_mb: float = 256.0  # past this, the oldest rows are deleted

    def __post_init__(self) -> None:
        if not self.retention_days > 0 or not self.max_mb > 0:
            raise ValueError("responses_retention_days and responses_max_mb must be > 0")

    @property
    def max_bytes(self) -> int:
        return int(self.max_mb * 1024 * 1024)

    def oldest_kept(self) -> float:
        """The creation time (seconds since the epoch) before which a response is past its retention."""
        return time.time() - self.retention_days * 86400


@dataclass(frozen=True)
class StoredResponse:
    id: str
    key_fingerprint: str | None  # the API key's fingerprint (None on a server without keys)
    created_at: float
    conversation: list[dict[str, Any]]  # chat messages: the history, this input, the answer
    response: dict[str, Any]  # the response object as answered (GET returns it)

    def columns(self) -> tuple:
        """(id, key_fingerprint, created_at, bytes, conversation, response): a row of either store."""
        conversation = json.dumps(self.conversation, ensure_ascii=False, separators=(",", ":"))
        response = json.dumps(self.response, ensure_ascii=False, separators=(",", ":"))
        size = len(conversation.encode()) + len(response.encode()) + len(self.id)
        return self.id, self.key_fingerprint, self.created_at, size, conversation, response

    @classmethod
    def of_row(cls, row: tuple) -> StoredResponse:
        """From (id, key_fingerprint, created_at, conversation, response)."""
        return cls(row[0], row[1], row[2], json.loads(row[3]), json.loads(row[4]))


class ResponseStore(Protocol):
    """The operations of a store. `key` is the caller's key fingerprint: another key's response is not
    found (get: None; delete: False)."""

    where: str  # for log lines and messages

    async def put(self, stored: StoredResponse) -> None: ...

    async def get(self, response_id: str, key: str | None) -> StoredResponse | None: ...

    async def delete(self, response_id: str, key: str | None) -> bool: ...

    async def close(self) -> None: ...


class MaintenanceClock:
    """When a store should next check its retention and size: every MAINTENANCE_EVERY_S seconds or
    MAINTENANCE_EVERY_PUTS puts, whichever comes first (so the size bound is overrun by at most that)."""

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
