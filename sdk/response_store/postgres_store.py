"""Stored responses in the state database the replicas share (`state_db`; sdk.response_store), so
a conversation continues on whichever replica its next request reaches.

Under the state database's failure policy (docs/cloud-at-scale.md): while it is away, a response
to store is deferred (written, in order, once it is back; lost only if the process ends first),
and reading one (`previous_response_id`, GET, DELETE) is a 503 `state_database_unavailable` with
Retry-After. Each put is one call of the schema's `tandem_keep_response` (sdk.state.schema, v5):
it trims its own key's oldest rows to the key's share and to what the other keys leave of the
whole store. Retention is applied by whichever replica's puts come due, over all rows."""

from __future__ import annotations

import logging

from sdk.protocol.errors import StateUnavailableError
from sdk.response_store.statements import IN_POSTGRES as SQL
from sdk.response_store.stored import MaintenanceClock, StoredResponse, StoreSettings

logger = logging.getLogger("tandem.responses")

# The advisory lock of the statements that touch many keys' rows at once (retention, owner migrations): one
# at a time, so their row-by-row updates of the per-key counts never deadlock each other.
RESPONSES_LOCK = 7_301_154_912

# Schema v5's function: it stores the row (its columns by position, in the declared order the schema check holds)
# and trims the key's oldest; the row goes in by column name.
_KEEP = (
    "SELECT tandem_keep_response(%(id)s, %(key_fingerprint)s, %(created_at)s, %(bytes)s::integer, %(conversation)s, "
    "%(response)s, %(max_per_key)s::bigint, %(max_bytes)s::bigint)"
)


class PostgresResponseStore:
    def __init__(self, state, settings: StoreSettings = StoreSettings(), clock=None):
        self.state = state  # sdk.state.database.StateDatabase (migrated: tandem_responses exists)
        self.where = state.where
        self.settings = settings
        self.maintenance = clock or MaintenanceClock()

    async def put(self, stored: StoredResponse) -> bool:
        row = stored.to_row()
        if row["bytes"] > self.settings.max_row_bytes:
            return False
        params = {**row, "max_per_key": self.settings.max_bytes_per_key, "max_bytes": self.settings.max_bytes}

        async def write() -> bool:
            rows = await self.state.call(_KEEP, params)
            return bool(rows[0][0])

        async def write_later() -> None:
            if not await write():
                logger.warning(
                    "response %s was not kept after all: its key's older responses free too little", stored.id
                )

        try:
            kept = await write()
        except StateUnavailableError as exc:
            # Kept once the database is back (its bounds checked then): the answer says store: true meanwhile.
            logger.warning("response %s is kept once %s is back: %s", stored.id, self.where, exc)
            # A stored response is the one write that may be dropped, when the deferred writes are full.
            return self.state.defer(write_later, droppable=True)
        if self.maintenance.due():
            await self._expire()
        return kept

    async def get(self, response_id: str, key: str | None) -> StoredResponse | None:
        rows = await self.state.call(SQL.get, (response_id, key, self.settings.oldest_kept()), by_name=True)
        return StoredResponse.from_row(rows[0]) if rows else None

    async def delete(self, response_id: str, key: str | None) -> bool:
        async def delete(conn) -> bool:
            cursor = await conn.execute(SQL.delete, (response_id, key))
            return cursor.rowcount > 0

        return await self.state.run(delete)

    async def close(self) -> None:
        """The state database is the server's to close."""

    async def _expire(self) -> None:
        async def expire(conn) -> None:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (RESPONSES_LOCK,))
                await conn.execute(SQL.expire, (self.settings.oldest_kept(),))
                await conn.execute(SQL.forget_empty_owners)

        try:
            await self.state.run(expire)
        except StateUnavailableError as exc:  # the next put that comes due tries again
            logger.warning("expired stored responses not deleted: %s", exc)

    async def stored_bytes(self, key: str | None = None, *, every_key: bool = True) -> int:
        """The bytes all rows hold; with `every_key=False`, the bytes of `key`'s rows."""
        if every_key:
            rows = await self.state.call(SQL.total_bytes)
        else:
            rows = await self.state.call(SQL.owner_bytes, (key or "",))
        return int(rows[0][0])
