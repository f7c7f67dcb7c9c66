"""Every stored table is declared once (sdk.state.tables), and what the databases hold is checked against
the declarations (sdk.state.schema_check): the state database that migrations v1..v5 make on a throwaway
PostgreSQL, the same tables made from the declarations alone (what a new migration would be written from),
and the SQLite files the stores make (the traffic record through its own shipped migration). A planted
difference, in a declaration or in a database, is named."""

from __future__ import annotations

import dataclasses
import sqlite3

import psycopg
import pytest

from sdk.state.declaration import POSTGRES, SQLITE, Column, Table, Type
from sdk.state.schema_check import describe_postgres, describe_sqlite, differences, postgres_tables
from sdk.state.tables import DECLARED
from sdk.state.tables.budgets import SPEND
from sdk.state.tables.responses import RESPONSES

IN_POSTGRES = [table for table in DECLARED if table.postgres]
IN_SQLITE = [table for table in DECLARED if table.sqlite]


@pytest.fixture
async def migrated_url(state_db_url) -> str:
    """A fresh database a replica migrated through every version of sdk.state.schema (then closed)."""
    from sdk.state.database import StateDatabase

    await (await StateDatabase(state_db_url).open()).close()
    return state_db_url


def _every_difference(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        found = [
            f"{name}: in the database, but not declared"
            for name in sorted(postgres_tables(conn) - {table.postgres for table in IN_POSTGRES})
        ]
        for table in IN_POSTGRES:
            found += differences(table, describe_postgres(conn, table.postgres), POSTGRES)
    return found


def test_the_migrated_state_database_is_what_the_tables_declare(migrated_url):
    assert _every_difference(migrated_url) == []


def test_the_declarations_make_the_tables_the_migrations_made(migrated_url, postgres_server):
    """The PostgreSQL DDL rendered from the declarations (what a new migration is written from) makes tables
    the database describes exactly as it describes the migrated ones, index definitions included."""
    rendered = postgres_server.new_database()
    with psycopg.connect(rendered, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA tandem_traffic")
        for table in IN_POSTGRES:
            for statement in table.ddl(POSTGRES):
                conn.execute(statement)
    assert _every_difference(rendered) == []

    def shapes(url: str) -> tuple[dict, set]:
        with psycopg.connect(url) as conn:
            tables = {table.postgres: describe_postgres(conn, table.postgres) for table in IN_POSTGRES}
            indexes = conn.execute(
                "SELECT schemaname, indexname, indexdef FROM pg_indexes "
                "WHERE schemaname IN ('public', 'tandem_traffic')"
            ).fetchall()
        return tables, set(indexes)

    assert shapes(rendered) == shapes(migrated_url)


def test_the_sqlite_files_the_stores_make_are_what_the_tables_declare(tmp_path):
    from sdk.budgets.ledger import SpendLedger
    from sdk.response_store.sqlite_store import SQLiteResponseStore
    from sdk.traffic import store as traffic_store

    SQLiteResponseStore(tmp_path / "responses.sqlite3")._conn.close()
    SpendLedger(tmp_path / "spend.sqlite3").start().close()
    traffic_store.connect(tmp_path / "traffic.sqlite3").close()  # the record's own migrations (sdk.traffic.schema)
    found = []
    for table in IN_SQLITE:
        made_by = {"responses": "responses", "response_owners": "responses", "spend": "spend"}.get(table.sqlite)
        conn = sqlite3.connect(tmp_path / f"{made_by or 'traffic'}.sqlite3")
        try:
            found += differences(table, describe_sqlite(conn, table.sqlite), SQLITE)
        finally:
            conn.close()
    assert found == []


def _changed(table: Table, name: str, **changes) -> Table:
    columns = tuple(dataclasses.replace(c, **changes) if c.name == name else c for c in table.columns)
    return dataclasses.replace(table, columns=columns)


def test_a_planted_difference_is_named(migrated_url, tmp_path):
    """A declaration that differs from the migrated database (a column's type, its nullability, a column
    more, one fewer, two swapped), and a database that differs from its declaration, each fail the check."""
    with psycopg.connect(migrated_url, autocommit=True) as conn:
        responses = describe_postgres(conn, "tandem_responses")
        assert differences(_changed(RESPONSES, "bytes", type=Type.BIGINT), responses, POSTGRES) == [
            "tandem_responses.bytes: declared bigint, the database has integer"
        ]
        assert differences(_changed(RESPONSES, "response", not_null=False), responses, POSTGRES) == [
            "tandem_responses.response: declared nullable, the database has it NOT NULL"
        ]
        more = dataclasses.replace(RESPONSES, columns=(*RESPONSES.columns, Column("region", Type.TEXT)))
        assert differences(more, responses, POSTGRES) == [
            "tandem_responses.region: declared, but the database has no such column"
        ]
        fewer = dataclasses.replace(RESPONSES, columns=RESPONSES.columns[:-1])
        assert differences(fewer, responses, POSTGRES) == [
            "tandem_responses.response: in the database, but not declared"
        ]
        first, second, *rest = RESPONSES.columns
        swapped = differences(dataclasses.replace(RESPONSES, columns=(second, first, *rest)), responses, POSTGRES)
        assert swapped and "in the order" in swapped[0]
        # The database changed under its declaration (as a hand-made migration would).
        conn.execute("ALTER TABLE tandem_spend ALTER COLUMN usd TYPE real")
        conn.execute("DROP INDEX tandem_responses_by_time")
    assert _every_difference(migrated_url) == [
        "tandem_spend.usd: declared double precision, the database has real",
        (
            "tandem_responses: indexes {'tandem_responses_by_owner': (None, 'created_at')}, declared "
            "{'tandem_responses_by_time': ('created_at',), 'tandem_responses_by_owner': (None, 'created_at')}"
        ),
    ]
    # The same in a SQLite file: a spend table an older hand wrote with a REAL token count.
    conn = sqlite3.connect(tmp_path / "spend.sqlite3")
    conn.execute(SPEND.ddl(SQLITE)[0].replace("cloud_tokens INTEGER", "cloud_tokens REAL"))
    assert differences(SPEND, describe_sqlite(conn, "spend"), SQLITE) == [
        "spend.cloud_tokens: declared INTEGER, the database has REAL"
    ]
    conn.close()


def test_a_declaration_refuses_what_no_backend_could_hold():
    with pytest.raises(ValueError, match="undeclared columns"):
        Table("t", None, (Column("a", Type.TEXT),), primary_key=("b",))
    with pytest.raises(ValueError, match="PostgreSQL-only"):
        Table("t", "t", (Column("at", Type.TIMESTAMP),), primary_key=())
    with pytest.raises(ValueError, match="no column"):
        SPEND.select_list(("scope", "cost"))
