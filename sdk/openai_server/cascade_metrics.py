"""The cascade's numbers for /metrics: routing outcomes, tokens and USD per tier, privacy,
and the cloud circuit breaker, under the server's `tandem:` prefix.

Like the engine's counters, they live in plain thread-safe objects the runner owns
(sdk.cascade.counts.RouteCounter, router.costs.CostLedger,
router.privacy_counters.PrivacyCounters) and become Prometheus samples only at scrape
time, so a runner embedded in an app without a server carries no Prometheus state.
Cloud share = the `tier="cloud"` rate of cascade_requests over all of them.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from router.circuit_breaker import BreakerState
from sdk.openai_server.metrics import PREFIX


class CascadeCollector:
    """Prometheus samples of one CascadeRunner, read at each scrape."""

    def __init__(self, runner):
        self.runner = runner

    def collect(self):
        routes = self.runner.routes.snapshot()
        family = CounterMetricFamily(
            PREFIX + "cascade_requests",
            "Routed requests by the tier that answered and whether the router escalated.",
            labels=["tier", "escalated"],
        )
        for tier in ("local", "cloud"):
            for escalated in (False, True):
                family.add_metric([tier, str(escalated).lower()], routes["routes"].get((tier, escalated), 0))
        yield family
        yield _labelled(
            "cascade_decisions", "Routed requests by the reason of the routing decision.", "reason", routes["reasons"]
        )
        yield _labelled(
            "cascade_degraded",
            "Requests the cloud should have answered and the local tier did, by cause.",
            "reason",
            routes["degraded"],
        )
        yield _labelled(
            "cascade_handoffs", "Escalations after local tokens, by hand-off mode.", "mode", routes["handoffs"]
        )
        totals = self.runner.ledger.totals()
        tokens = CounterMetricFamily(
            PREFIX + "cascade_tokens", "Tokens per tier (routed requests).", labels=["tier", "kind"]
        )
        cost = CounterMetricFamily(
            PREFIX + "cascade_cost_usd", "USD per tier at the configured prices.", labels=["tier"]
        )
        for tier, usage in totals.items():
            tokens.add_metric([tier, "prompt"], usage.prompt_tokens)
            tokens.add_metric([tier, "completion"], usage.completion_tokens)
            cost.add_metric([tier], usage.cost_usd)
        yield tokens
        yield cost
        privacy = self.runner.privacy_counters.snapshot()
        yield _labelled(
            "privacy_kept_local",
            "Requests that would have escalated and stayed on the device, by rule.",
            "reason",
            privacy.kept_local_by_reason,
        )
        yield CounterMetricFamily(
            PREFIX + "privacy_redacted_requests",
            "Requests escalated with placeholders.",
            value=privacy.num_requests_redacted,
        )
        yield CounterMetricFamily(
            PREFIX + "privacy_chars_withheld",
            "Characters of kept-local requests not sent.",
            value=privacy.num_chars_withheld,
        )
        state = self.runner.breaker.state
        breaker = GaugeMetricFamily(
            PREFIX + "cloud_circuit_state", "1 for the cloud circuit breaker's current state.", labels=["state"]
        )
        for candidate in BreakerState:
            breaker.add_metric([candidate.value], 1.0 if candidate is state else 0.0)
        yield breaker


def _labelled(name: str, doc: str, label: str, counts: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(PREFIX + name, doc, labels=[label])
    for value, count in sorted(counts.items()):
        family.add_metric([value], count)
    return family
