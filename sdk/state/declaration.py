"""A stored table, declared once: its name in each backend, its named columns with a type each, its
primary key and indexes (the declarations themselves: sdk.state.tables, one module per concept).

From a declaration come the SQLite DDL a store runs when it opens its file, the PostgreSQL DDL a new
migration of sdk.state.schema is written from, the column lists of the statements both backends run,
and what sdk.state.schema_check compares a database with (tests/state/test_declared_tables.py checks
the state database that migrations v1..v5 make, and the SQLite files the stores make, against them).

The type rule: one logical type per column, written per backend as

    type        SQLite     PostgreSQL          information_schema.columns.data_type
    TEXT        TEXT       TEXT                text
    REAL        REAL       DOUBLE PRECISION    double precision
    INTEGER     INTEGER    INTEGER             integer
    BIGINT      INTEGER    BIGINT              bigint
    BLOB        BLOB       BYTEA               bytea
    TIMESTAMP   -          TIMESTAMPTZ         timestamp with time zone
    BIGSERIAL   -          BIGSERIAL           bigint (its default: the next value of its own sequence)

(SQLite keeps every integer in up to 8 bytes; PostgreSQL's sizes differ, so a declaration says which.)

Rows are read by column name, never by position: `named_rows(cursor)` maps any DB-API cursor's rows
(sqlite3's, psycopg's) through its description, and written with named placeholders (`insert`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Type(Enum):
    """A column's logical type: (SQLite, PostgreSQL, what PostgreSQL's information_schema calls it)."""

    TEXT = ("TEXT", "TEXT", "text")
    REAL = ("REAL", "DOUBLE PRECISION", "double precision")
    INTEGER = ("INTEGER", "INTEGER", "integer")
    BIGINT = ("INTEGER", "BIGINT", "bigint")
    BLOB = ("BLOB", "BYTEA", "bytea")
    TIMESTAMP = (None, "TIMESTAMPTZ", "timestamp with time zone")
    BIGSERIAL = (None, "BIGSERIAL", "bigint")

    def __init__(self, sqlite: str | None, postgres: str, data_type: str):
        self.sqlite = sqlite
        self.postgres = postgres
        self.data_type = data_type


@dataclass(frozen=True)
class Dialect:
    """What the two backends write differently in the statements they share."""

    name: str  # "sqlite" or "postgres"
    mark: str  # a positional parameter
    same_as: str  # equality that holds between two NULLs (a server without keys owns rows as NULL)

    def named(self, name: str) -> str:
        """A named parameter (`insert` and friends take a {column: value} row)."""
        return f":{name}" if self.name == "sqlite" else f"%({name})s"


SQLITE = Dialect("sqlite", "?", "IS")
POSTGRES = Dialect("postgres", "%s", "IS NOT DISTINCT FROM")


@dataclass(frozen=True)
class Column:
    name: str
    type: Type
    not_null: bool = False  # primary-key columns are NOT NULL in PostgreSQL whatever this says
    default: str | None = None  # an SQL expression (PostgreSQL's now())
    references: tuple[Table, str] | None = None  # (table, column): this row is deleted with the one it names


@dataclass(frozen=True)
class Index:
    suffix: str  # the index is named <table>_<suffix> (the table's name without its schema)
    columns: tuple[str, ...]
    # What PostgreSQL indexes instead, where its statements match an expression (coalesce(key, '')) that
    # SQLite's match with IS: a plain column name stays a name, anything else is an expression.
    postgres: tuple[str, ...] | None = None
    in_sqlite: bool = True  # False: the state database's only


@dataclass(frozen=True)
class Table:
    sqlite: str | None  # its name in a SQLite file of the process (None: only in the state database)
    postgres: str | None  # its name in the state database, schema-qualified outside public (None: SQLite only)
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    indexes: tuple[Index, ...] = ()
    without_rowid: bool = False  # SQLite keeps the rows in the primary key's b-tree
    column_names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        names = tuple(column.name for column in self.columns)
        object.__setattr__(self, "column_names", names)
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: a column is declared twice")
        named = set(self.primary_key).union(*(index.columns for index in self.indexes))
        if named - set(names):
            raise ValueError(f"{self.name}: key or index names undeclared columns {sorted(named - set(names))}")
        if self.sqlite and any(column.type.sqlite is None for column in self.columns):
            raise ValueError(f"{self.name}: a SQLite table cannot hold PostgreSQL-only types")

    @property
    def name(self) -> str:
        """The concept's name for messages: the SQLite name, else the PostgreSQL one."""
        return self.sqlite or self.postgres or "?"

    def name_in(self, dialect: Dialect) -> str:
        found = self.sqlite if dialect is SQLITE else self.postgres
        if found is None:
            raise ValueError(f"{self.name} has no {dialect.name} table")
        return found

    def index_name(self, index: Index, dialect: Dialect) -> str:
        return f"{self.name_in(dialect).rpartition('.')[2]}_{index.suffix}"

    # -- statements ---------------------------------------------------------------------------------

    def ddl(self, dialect: Dialect, *, if_not_exists: bool = False) -> list[str]:
        """CREATE TABLE and its CREATE INDEXes, as this backend takes them."""
        table = self.name_in(dialect)
        maybe = "IF NOT EXISTS " if if_not_exists else ""
        lines = [self._column_sql(column, dialect) for column in self.columns]
        if len(self.primary_key) > 1:
            lines.append(f"PRIMARY KEY ({', '.join(self.primary_key)})")
        rowid = " WITHOUT ROWID" if self.without_rowid and dialect is SQLITE else ""
        body = ",\n    ".join(lines)
        statements = [f"CREATE TABLE {maybe}{table} (\n    {body}\n){rowid}"]
        for index in self.indexes:
            if dialect is SQLITE and not index.in_sqlite:
                continue
            columns = index.postgres if dialect is POSTGRES and index.postgres else index.columns
            name = self.index_name(index, dialect)
            statements.append(f"CREATE INDEX {maybe}{name} ON {table} ({', '.join(columns)})")
        return statements

    def _column_sql(self, column: Column, dialect: Dialect) -> str:
        sql = f"{column.name} {column.type.sqlite if dialect is SQLITE else column.type.postgres}"
        if self.primary_key == (column.name,):
            sql += " PRIMARY KEY"
        if column.not_null:
            sql += " NOT NULL"
        if column.default is not None:
            sql += f" DEFAULT {column.default}"
        if column.references is not None:
            table, name = column.references
            sql += f" REFERENCES {table.name_in(dialect)} ({name}) ON DELETE CASCADE"
        return sql

    def select_list(self, names: tuple[str, ...] | None = None, prefix: str = "") -> str:
        """`a, b, c`: the columns named (all by default), each checked against the declaration."""
        return ", ".join(prefix + self._known(name) for name in (names or self.column_names))

    def insert(self, dialect: Dialect, names: tuple[str, ...] | None = None) -> str:
        """INSERT of the columns named (all by default), with named parameters: run it with a {column: value} row."""
        names = names or self.column_names
        marks = ", ".join(dialect.named(self._known(name)) for name in names)
        return f"INSERT INTO {self.name_in(dialect)} ({', '.join(names)}) VALUES ({marks})"

    def _known(self, name: str) -> str:
        if name not in self.column_names:
            raise ValueError(f"{self.name} has no column {name!r}")
        return name


def named_rows(cursor) -> Iterator[dict[str, Any]]:
    """A cursor's remaining rows, one at a time, as {column: value} (any DB-API cursor: sqlite3's, psycopg's;
    the names come from its description)."""
    names = [description[0] for description in cursor.description]
    for row in cursor:
        yield dict(zip(names, row))


def named_row(cursor) -> dict[str, Any] | None:
    """A cursor's next row as {column: value}, or None."""
    row = cursor.fetchone()
    return None if row is None else dict(zip((description[0] for description in cursor.description), row))
