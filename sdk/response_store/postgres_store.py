"""Stored responses in the state database the replicas share (`state_db`; sdk.response_store), so
a conversation continues on whichever replica its next request reaches.

Under the state database's failure policy (docs/cloud-at-scale.md): while it is away, a response
to store is deferred (written, in order, once it is back; lost only if the process ends first),
and reading one (`previous_response_id`, GET, DELETE) is a 503 `state_database_unavailable` with
Retry-After. Retention and size are checked by whichever replica's puts come due, over all rows."""

from __future__ import annotations

import logging

from sdk.protocol.errors import StateUnavailableError
from sdk.response_store.stored import SIZE_SLACK, MaintenanceClock, StoredResponse, StoreSettings

logger = logging.getLogger("tandem.responses")

_TRIM = """
DELETE FROM tandem_responses WHERE id IN (
    SELECT id FROM (
        SELECT id, sum(bytes) OVER (ORDER BY created_at DESC, id) AS kept FROM tandem_responses
    ) AS running WHERE kept > %s
)
"""


class PostgresResponseStore:
    def __init__(self, state, settings: StoreSettings = StoreSettings(), clock=None):
        self.state = state  # sdk.state.database.StateDatabase (migrated: tandem_responses exists)
        self.where = state.where
        self.settings = settings
        self.maintenance = clock or MaintenanceClock()

    async def put(self, stored: StoredResponse) -> None:
        columns = stored.columns()

        async def write() -> None:
            await self.state.call(
                "INSERT INTO tandem_responses VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING", columns
            )

        try:
            await write()
        except StateUnavailableError as exc:
            logger.warning("response %s is kept once %s is back: %s", stored.id, self.where, exc)
            self.state.defer(write)
            return
        if self.maintenance.due():
            await self._maintain()

    async def get(self, response_id: str, key: str | None) -> StoredResponse | None:
        rows = await self.state.call(
            "SELECT id, key_fingerprint, created_at, conversation, response FROM tandem_responses "
            "WHERE id = %s AND key_fingerprint IS NOT DISTINCT FROM %s AND created_at >= %s",
            (response_id, key, self.settings.oldest_kept()),
        )
        return StoredResponse.of_row(rows[0]) if rows else None

    async def delete(self, response_id: str, key: str | None) -> bool:
        async with self.state.connection() as conn:
            cursor = await conn.execute(
                "DELETE FROM tandem_responses WHERE id = %s AND key_fingerprint IS NOT DISTINCT FROM %s",
                (response_id, key),
            )
            return cursor.rowcount > 0

    async def close(self) -> None:
        """The state database is the server's to close."""

    async def _maintain(self) -> None:
        try:
            async with self.state.transaction() as conn:
                await conn.execute("DELETE FROM tandem_responses WHERE created_at < %s", (self.settings.oldest_kept(),))
                cursor = await conn.execute("SELECT coalesce(sum(bytes), 0) FROM tandem_responses")
                total = (await cursor.fetchone())[0]
                if total > self.settings.max_bytes:
                    await conn.execute(_TRIM, (int(self.settings.max_bytes * SIZE_SLACK),))
        except StateUnavailableError as exc:  # the next put that comes due tries again
            logger.warning("stored responses not trimmed: %s", exc)

    async def stored_bytes(self) -> int:
        rows = await self.state.call("SELECT coalesce(sum(bytes), 0) FROM tandem_responses")
        return int(rows[0][0])
