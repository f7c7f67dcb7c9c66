"""Budgets in /metrics: what they did to requests, and the file's reloads; and the state database
the replicas share (sdk.state), whether it is reachable."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from sdk.openai_server.metrics import PREFIX


class BudgetCollector:
    def __init__(self, budgets):
        self.budgets = budgets  # sdk.budgets.manager.BudgetManager

    def collect(self):
        counts = self.budgets.counts
        family = CounterMetricFamily(
            PREFIX + "budget_requests",
            "Requests a budget changed: refused (429), kept local, warned (soft).",
            labels=["outcome"],
        )
        for outcome, value in (
            ("refused", counts.refused),
            ("kept_local", counts.kept_local),
            ("warned", counts.soft_warnings),
        ):
            family.add_metric([outcome], value)
        yield family
        by_limit = CounterMetricFamily(
            PREFIX + "budget_limit_hits", "Requests that found a budget reached, by scope and limit.", labels=["limit"]
        )
        for name, value in sorted(counts.by_limit.items()):
            by_limit.add_metric([name], value)
        yield by_limit
        reloads = CounterMetricFamily(
            PREFIX + "budget_file_reloads", "Reloads of the budgets file.", labels=["outcome"]
        )
        reloads.add_metric(["ok"], counts.reloads)
        reloads.add_metric(["failed"], counts.failed_reloads)
        yield reloads
        ledger = self.budgets.ledger
        pending = GaugeMetricFamily(
            PREFIX + "budget_settles_pending",
            "Requests whose spend is settled here but not yet in the books the decisions read (with state_db: "
            "not yet written to it; their reservations keep holding meanwhile).",
        )
        pending.add_metric([], ledger.pending_settles)
        yield pending
        replayed = CounterMetricFamily(
            PREFIX + "budget_settle_batches_replayed",
            "Settle batches sent again after they had landed (a lost reply): recognised, not counted twice.",
        )
        replayed.add_metric([], ledger.num_batches_replayed)
        yield replayed


class StateDatabaseCollector:
    def __init__(self, db):
        self.db = db  # sdk.state.database.StateDatabase

    def collect(self):
        up = GaugeMetricFamily(
            PREFIX + "state_db_up",
            "1 while the state database the replicas share is reachable; 0 while budgeted requests get 503.",
        )
        up.add_metric([], 1 if self.db.available else 0)
        yield up
        outages = CounterMetricFamily(
            PREFIX + "state_db_outages", "Times the state database became unreachable while serving."
        )
        outages.add_metric([], self.db.outages)
        yield outages
        pending = GaugeMetricFamily(
            PREFIX + "state_db_pending_writes",
            "Writes (settle batches, returned in-flight slots, stored responses) waiting for the state database.",
        )
        pending.add_metric([], self.db.pending_writes)
        yield pending
        oldest = GaugeMetricFamily(
            PREFIX + "state_db_oldest_pending_write_seconds",
            "How long the oldest write still waiting for the state database has waited (0: none waits).",
        )
        oldest.add_metric([], self.db.writes.oldest_age_s)
        yield oldest
        retries = CounterMetricFamily(
            PREFIX + "state_db_write_retries", "Failed tries of deferred writes, each tried again after a pause."
        )
        retries.add_metric([], self.db.writes.num_retries)
        yield retries
        dropped = CounterMetricFamily(
            PREFIX + "state_db_dropped_writes",
            "Droppable writes (stored responses) not made because state_db_max_pending_writes were waiting.",
        )
        dropped.add_metric([], self.db.writes.num_dropped)
        yield dropped
        fenced = GaugeMetricFamily(
            PREFIX + "state_db_fenced",
            "1 while this replica could not renew its lease in time: it takes no budgeted work and ends its "
            "budgeted streams.",
        )
        fenced.add_metric([], 1 if self.db.fenced else 0)
        yield fenced
