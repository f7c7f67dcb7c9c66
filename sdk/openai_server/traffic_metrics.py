"""The traffic record's numbers for /metrics (sdk.traffic), read at scrape time like the cascade's."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from sdk.openai_server.metrics import PREFIX


class TrafficCollector:
    def __init__(self, learning):
        self.learning = learning  # sdk.traffic.learning.Learning: read at scrape time (the retrain starts later)

    def collect(self):
        record, shadow, retrainer = self.learning.record, self.learning.shadow, self.learning.retrainer
        rows = CounterMetricFamily(
            PREFIX + "traffic_rows",
            "Routed requests the traffic record handled, by what happened to them.",
            labels=["outcome"],
        )
        for outcome, value in (
            ("stored", record.num_recorded),
            ("privacy_flagged", record.num_flagged),
            ("dropped", record.num_dropped),
        ):
            rows.add_metric([outcome], value)
        yield rows
        yield CounterMetricFamily(
            PREFIX + "traffic_labels", "Labels written (feedback and shadow judgments).", value=record.num_labels
        )
        if shadow is not None:
            counts = shadow.counts
            samples = CounterMetricFamily(
                PREFIX + "shadow_samples", "Shadow calls to the cloud tier, by outcome.", labels=["outcome"]
            )
            for outcome in ("started", "judged", "skipped_budget", "skipped_busy", "failed"):
                samples.add_metric([outcome], getattr(counts, outcome))
            yield samples
            yield GaugeMetricFamily(
                PREFIX + "shadow_budget_remaining_tokens",
                "Cloud tokens shadow calls may still use today.",
                value=shadow.budget.remaining,
            )
        if retrainer is not None:
            retrains = CounterMetricFamily(
                PREFIX + "router_retrains",
                "Background router retrains, by outcome (adopted: a router another replica swapped in, with state_db).",
                labels=["outcome"],
            )
            for outcome in ("swapped", "kept", "skipped", "failed", "adopted"):
                retrains.add_metric([outcome], retrainer.outcomes.get(outcome, 0))
            yield retrains
