"""Whether a database's tables are what their declarations say (sdk.state.declaration, sdk.state.tables).

    described = describe_postgres(conn, "tandem_responses")   # a psycopg connection (synchronous)
    described = describe_sqlite(conn, "responses")            # a sqlite3 connection
    differences(RESPONSES, described, POSTGRES)               # [] when they agree, else one line per mismatch

What is compared, for each backend: the columns in order, each one's type (by the type rule of
sdk.state.declaration: information_schema's data_type in PostgreSQL, the declared type in SQLite), whether it
may be NULL and its default; the primary key; each index's name and columns (an expression one's position
is compared, not its text: PostgreSQL rewrites it); each reference to another table's column; and SQLite's
WITHOUT ROWID. tests/state/test_declared_tables.py runs it on a throwaway PostgreSQL after migrations
v1..v5, and on the SQLite files the stores make.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sdk.state.declaration import POSTGRES, SQLITE, Dialect, Table

_SCHEMAS = ("public", "tandem_traffic")  # where the state database keeps tandem's tables


@dataclass
class Described:
    """One table as a database holds it, or as its declaration says it should."""

    columns: list[tuple[str, str, bool, str | None]]  # (name, type, NOT NULL, default) in order
    primary_key: tuple[str, ...]
    indexes: dict[str, tuple[str | None, ...]] = field(default_factory=dict)  # name -> columns (None: an expression)
    references: set[tuple[str, str, str]] = field(default_factory=set)  # (column, table, its column)
    without_rowid: bool = False


def expected(table: Table, dialect: Dialect) -> Described:
    """What `table` should look like in a database of `dialect`."""
    columns = []
    for column in table.columns:
        if dialect is SQLITE:  # a primary key may hold NULL in SQLite, except in a WITHOUT ROWID table
            keyed = table.without_rowid and column.name in table.primary_key
            kind, not_null = column.type.sqlite, column.not_null or keyed
        else:
            kind, not_null = column.type.data_type, column.not_null or column.name in table.primary_key
        default = column.default
        if dialect is POSTGRES and column.type.postgres == "BIGSERIAL":
            default = f"nextval('{table.postgres}_{column.name}_seq'::regclass)"
        columns.append((column.name, kind, not_null, default))
    indexes = {}
    for index in table.indexes:
        if dialect is SQLITE and not index.in_sqlite:
            continue
        written = index.postgres if dialect is POSTGRES and index.postgres else index.columns
        indexes[table.index_name(index, dialect)] = tuple(c if c.isidentifier() else None for c in written)
    references = {
        (column.name, column.references[0].name_in(dialect), column.references[1])
        for column in table.columns
        if column.references is not None
    }
    return Described(columns, table.primary_key, indexes, references, table.without_rowid and dialect is SQLITE)


def differences(table: Table, described: Described | None, dialect: Dialect) -> list[str]:
    """Each way the database's `described` table differs from `table`'s declaration ([] when none)."""
    name = table.name_in(dialect)
    if described is None:
        return [f"{name}: declared, but the database has no such table"]
    want = expected(table, dialect)
    found = []
    want_names, have_names = [c[0] for c in want.columns], [c[0] for c in described.columns]
    for missing in [c for c in want_names if c not in have_names]:
        found.append(f"{name}.{missing}: declared, but the database has no such column")
    for extra in [c for c in have_names if c not in want_names]:
        found.append(f"{name}.{extra}: in the database, but not declared")
    if [c for c in want_names if c in have_names] != [c for c in have_names if c in want_names]:
        found.append(f"{name}: columns in the order {have_names}, declared {want_names}")
    have_by_name = {c[0]: c for c in described.columns}
    for column, kind, not_null, default in want.columns:
        if column not in have_by_name:
            continue
        _, have_kind, have_not_null, have_default = have_by_name[column]
        if have_kind != kind:
            found.append(f"{name}.{column}: declared {kind}, the database has {have_kind}")
        if have_not_null != not_null:
            found.append(f"{name}.{column}: declared {_null(not_null)}, the database has it {_null(have_not_null)}")
        if have_default != default:
            found.append(f"{name}.{column}: declared default {default}, the database has {have_default}")
    for what in ("primary_key", "indexes", "references", "without_rowid"):
        if getattr(described, what) != getattr(want, what):
            found.append(f"{name}: {what} {getattr(described, what)!r}, declared {getattr(want, what)!r}")
    return found


def _null(not_null: bool) -> str:
    return "NOT NULL" if not_null else "nullable"


# -- PostgreSQL ---------------------------------------------------------------------------------------


def postgres_tables(conn) -> set[str]:
    """Every table in the schemas tandem uses, named as declarations name them (public's unqualified)."""
    rows = conn.execute(
        "SELECT table_schema, table_name FROM information_schema.tables "
        "WHERE table_schema = ANY(%s) AND table_type = 'BASE TABLE'",
        (list(_SCHEMAS),),
    ).fetchall()
    return {name if schema == "public" else f"{schema}.{name}" for schema, name in rows}


def describe_postgres(conn, qualified: str) -> Described | None:
    """The table `qualified` (schema.name, or a name in public) as the database holds it; None when absent."""
    schema, _, name = qualified.rpartition(".")
    schema = schema or "public"
    columns = conn.execute(
        "SELECT column_name, data_type, is_nullable = 'NO', column_default FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        (schema, name),
    ).fetchall()
    if not columns:
        return None
    relation = f"{schema}.{name}"
    keyed = conn.execute(
        "SELECT c.relname, i.indisprimary, array(SELECT a.attname FROM unnest(i.indkey::int2[]) WITH ORDINALITY "
        "AS k(attnum, n) LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum ORDER BY k.n) "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass",
        (relation,),
    ).fetchall()
    references = conn.execute(
        "SELECT a.attname, c.confrelid::regclass::text, f.attname FROM pg_constraint c "
        "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1] "
        "JOIN pg_attribute f ON f.attrelid = c.confrelid AND f.attnum = c.confkey[1] "
        "WHERE c.conrelid = %s::regclass AND c.contype = 'f' AND c.confdeltype = 'c'",
        (relation,),
    ).fetchall()
    primary = next((tuple(names) for _, is_primary, names in keyed if is_primary), ())
    return Described(
        [tuple(row) for row in columns],
        primary,
        {index: tuple(names) for index, is_primary, names in keyed if not is_primary},
        {tuple(row) for row in references},
    )


# -- SQLite -------------------------------------------------------------------------------------------


def describe_sqlite(conn, name: str) -> Described | None:
    """The table `name` of a SQLite file as it holds it; None when absent."""
    made = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
    if made is None:
        return None
    info = conn.execute(f"PRAGMA table_info({name})").fetchall()  # cid, name, type, notnull, default, pk
    columns = [(row[1], row[2].upper(), bool(row[3]), row[4]) for row in info]
    primary = tuple(row[1] for row in sorted((row for row in info if row[5]), key=lambda row: row[5]))
    indexes = {}
    for _, index, _, origin, _ in conn.execute(f"PRAGMA index_list({name})").fetchall():
        if origin == "c":  # made by CREATE INDEX (not a primary key's or a UNIQUE constraint's)
            ordered = sorted(conn.execute(f"PRAGMA index_info({index})").fetchall())
            indexes[index] = tuple(row[2] for row in ordered)
    references = {
        (row[3], row[2], row[4])
        for row in conn.execute(f"PRAGMA foreign_key_list({name})").fetchall()
        if row[6] == "CASCADE"
    }
    return Described(columns, primary, indexes, references, "WITHOUT ROWID" in made[0].upper())
