"""Stored responses of POST /v1/responses (`store: true`, OpenAI's default): what lets
`previous_response_id` continue a conversation, and GET / DELETE /v1/responses/{id} reach it.

A stored response is the response object as answered and the conversation it ends (the chat
messages before it, this request's input, and its answer; never the instructions, which OpenAI
does not carry over), under the API key that made it: another key's is not found. Privacy-flagged
requests (the `private` flag, or a privacy rule that matched) are never stored.

Where: a SQLite file of the process (`responses_path`, default $TANDEM_DATA_DIR/responses.sqlite3:
sdk.response_store.sqlite_store), or the state database the replicas share when `state_db` is set
(sdk.response_store.postgres_store), so a conversation can continue on any replica. Both keep a
retention and size bounds, checked on every put: rows past `responses_retention_days` go; past
`responses_max_mb_per_key` (a key's share) or `responses_max_mb` (the whole store) the storing key's
oldest go, never another key's; a response larger than `responses_max_row_mb` is not kept.
"""

from __future__ import annotations

from sdk.response_store.stored import ResponseStore, StoredResponse, StoreSettings

__all__ = ["ResponseStore", "StoredResponse", "StoreSettings", "open_response_store"]


def open_response_store(listener, state=None) -> ResponseStore | None:
    """The store a server's listener settings name ([server] or [cloud_server]): None with
    `store_responses = false`; the state database's tables when `state` (its StateDatabase) is given,
    else the SQLite file."""
    if not listener.store_responses:
        return None
    settings = StoreSettings(
        listener.responses_retention_days,
        listener.responses_max_mb,
        listener.responses_max_mb_per_key,
        listener.responses_max_row_mb,
    )
    if state is not None:
        if listener.responses_path:
            raise ValueError(
                "responses_path and state_db both say where stored responses go: with state_db the replicas share "
                "them in that database; unset responses_path"
            )
        from sdk.response_store.postgres_store import PostgresResponseStore

        return PostgresResponseStore(state, settings)
    from sdk.data_dir import data_path
    from sdk.response_store.sqlite_store import SQLiteResponseStore

    return SQLiteResponseStore(listener.responses_path or data_path("responses.sqlite3"), settings)
