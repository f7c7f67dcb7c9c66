"""The statements both stores of responses run, written once over the declared tables
(sdk.state.tables.responses) and rendered for each backend: what differs between them is only the
placeholder and how an owner that may be NULL is matched (sdk.state.declaration.Dialect). Storing a
response differs more: SQLite trims a key's rows in Python within one write transaction
(sdk.response_store.sqlite_store), the state database in one function call (`tandem_keep_response`)."""

from __future__ import annotations

from dataclasses import dataclass

from sdk.response_store.stored import READ_COLUMNS
from sdk.state.declaration import POSTGRES, SQLITE, Dialect
from sdk.state.tables.responses import RESPONSE_OWNERS, RESPONSES


@dataclass(frozen=True)
class ResponseStatements:
    get: str  # (id, key, oldest kept): READ_COLUMNS of a response its key may read, unless expired
    delete: str  # (id, key)
    expire: str  # (oldest kept): what is past the retention
    forget_empty_owners: str  # the counts of keys that hold nothing any more
    owner_bytes: str  # (owner): the bytes one key's rows hold ('' for a server without keys)
    total_bytes: str  # the bytes all rows hold


def statements(dialect: Dialect) -> ResponseStatements:
    responses, owners = RESPONSES.name_in(dialect), RESPONSE_OWNERS.name_in(dialect)
    mark, same = dialect.mark, dialect.same_as
    return ResponseStatements(
        get=f"SELECT {RESPONSES.select_list(READ_COLUMNS)} FROM {responses} "
        f"WHERE id = {mark} AND key_fingerprint {same} {mark} AND created_at >= {mark}",
        delete=f"DELETE FROM {responses} WHERE id = {mark} AND key_fingerprint {same} {mark}",
        expire=f"DELETE FROM {responses} WHERE created_at < {mark}",
        forget_empty_owners=f"DELETE FROM {owners} WHERE bytes <= 0",
        owner_bytes=f"SELECT coalesce(max(bytes), 0) FROM {owners} WHERE owner = {mark}",
        total_bytes=f"SELECT coalesce(sum(bytes), 0) FROM {owners}",
    )


IN_SQLITE = statements(SQLITE)
IN_POSTGRES = statements(POSTGRES)
