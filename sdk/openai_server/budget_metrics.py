"""Budgets in /metrics: what they did to requests, and the file's reloads."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily

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
