"""This replica's lease in the state database, and the fence that keeps a cut-off replica from spending.

Every replica has a row in tandem_replicas whose `expires_at` (the database's clock) its heartbeat pushes
`lease_s` ahead every `lease_s / 3`. What a replica holds (budget reservations, slots in flight) counts only
while its lease runs; the heartbeat of any replica deletes what expired replicas still hold.

The fence: a replica that cannot renew its lease (the database away, frozen, read-only, or this replica
cut off from it) must not go on spending against reservations that the others will soon delete. It
measures its lease from the moment it *sent* its last successful renewal (no later than the database's
`now()` that set `expires_at`), and once FENCE_SHARE of the lease has passed it is fenced: it admits no
budgeted work and ends its budgeted streams at their next token (sdk.budgets), while the reservations still
stand. The rest of the lease (a quarter: 7.5 s of the default 30) is the margin for those streams to stop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sdk.state.tables.budgets import RESERVATIONS, SETTLED
from sdk.state.tables.limits import AUTH_FAILURES, IN_FLIGHT, IN_FLIGHT_REQUESTS, RATE_BUCKETS
from sdk.state.tables.replicas import REPLICAS

FENCE_SHARE = 0.75  # the part of the lease after the last renewal at which this replica fences itself
SETTLED_KEEP = "1 day"  # how long a landed settle batch's id is kept to recognise a retry of it (schema v5)


class Lease:
    """When this replica's lease was last renewed, and whether it is fenced."""

    def __init__(self, lease_s: float, clock: Callable[[], float] = time.monotonic):
        self.lease_s = float(lease_s)
        self.clock = clock
        self._renewed_at: float | None = None  # monotonic time the last successful renewal was sent

    @property
    def heartbeat_s(self) -> float:
        return self.lease_s / 3

    @property
    def renew_timeout_s(self) -> float:
        """A renewal that has not answered by then counts as failed (two in a row still leave the lease whole)."""
        return self.lease_s / 6

    def renewed(self, sent_at: float) -> None:
        self._renewed_at = sent_at

    @property
    def fenced(self) -> bool:
        """FENCE_SHARE of the lease has passed since the last renewal was sent (or none ever was)."""
        return self._renewed_at is None or self.clock() - self._renewed_at >= self.lease_s * FENCE_SHARE

    @property
    def age_s(self) -> float | None:
        return None if self._renewed_at is None else self.clock() - self._renewed_at


# What a replica holds, in the tables whose `replica` column names it: it counts only while that replica's
# lease runs, goes with its row when it closes (RELEASE), and any heartbeat deletes it once the lease is out.
HELD_BY_REPLICA = (RESERVATIONS, IN_FLIGHT, IN_FLIGHT_REQUESTS)

# Push this replica's lease forward; delete what replicas whose lease ran out still hold, and what has aged out.
EXPIRED = f"SELECT id FROM {REPLICAS.postgres} WHERE expires_at <= now()"
RENEW = (
    f"INSERT INTO {REPLICAS.postgres} (id, expires_at) VALUES (%s, now() + make_interval(secs => %s)) "
    "ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at"
)
SWEEP = (
    *(f"DELETE FROM {table.postgres} WHERE replica IN ({EXPIRED})" for table in HELD_BY_REPLICA),
    f"DELETE FROM {REPLICAS.postgres} WHERE expires_at <= now()",
    # Buckets that have refilled and failures forgotten: a fresh row would be the same.
    f"DELETE FROM {RATE_BUCKETS.postgres} WHERE full_at < extract(epoch FROM now())",
    f"DELETE FROM {AUTH_FAILURES.postgres} WHERE forget_at < extract(epoch FROM now())",
    f"DELETE FROM {SETTLED.postgres} WHERE landed_at < now() - interval '{SETTLED_KEEP}'",
)
# What a replica that closes gives up (its parameter: the replica's id); else its lease's end does it.
RELEASE = (
    *(f"DELETE FROM {table.postgres} WHERE replica = %s" for table in HELD_BY_REPLICA),
    f"DELETE FROM {REPLICAS.postgres} WHERE id = %s",
)
