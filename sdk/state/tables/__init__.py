"""Every table tandem keeps, declared once (sdk.state.declaration), one module per stored concept:

- `replicas`: the state database's own (replicas' leases, the schema version);
- `budgets`: spend per (scope, period), in a SQLite file of the process or the state database, and the
  state database's reservations and landed settle batches (sdk.budgets);
- `limits`: the per-client limits replicas share: token buckets, slots in flight, failed keys (sdk.serving);
- `responses`: stored responses and the bytes each key holds (sdk.response_store);
- `traffic`: the traffic record (sdk.traffic), a SQLite file or the state database's `tandem_traffic` schema.

They live in sdk.state, below every store that uses them, because the state database's own code names
them: the lease sweeps what replicas hold in the budgets' and limits' tables (sdk.state.lease), and
migrations v1..v5 (sdk.state.schema) made their PostgreSQL twins, which tests/state/test_declared_tables.py
checks against these declarations. A table's next migration is written from its declaration
(`Table.ddl(POSTGRES)`), and the declaration changed with it."""

from __future__ import annotations

from sdk.state.tables import budgets, limits, replicas, responses, traffic

DECLARED = (*replicas.TABLES, *budgets.TABLES, *limits.TABLES, *responses.TABLES, *traffic.TABLES)
