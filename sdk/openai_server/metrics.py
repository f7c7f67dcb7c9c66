"""Prometheus metrics with vLLM's names under a `tandem:` prefix.

Engine counters and gauges are read from `engine.stats()` at scrape time (a custom
collector), so the engine keeps no Prometheus objects; latency histograms are
measured here, per request, as the server sees its tokens leave the engine. Each app
gets its own registry so several apps in one process (tests, the cascade) never clash.
"""

from __future__ import annotations

import time
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from sdk.protocol.engine import EngineError, EngineProtocol, TokenEvent

PREFIX = "tandem:"

# vLLM's buckets: latencies from a few ms (ITL on a GPU) to minutes (E2E on a phone).
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0)


# Why a request was refused: no or a wrong API key (401), over its rate limit (429),
# engine queue full (503).
REJECTION_REASONS = ("unauthenticated", "rate_limited", "overloaded")
KEY_LABEL_DIGITS = 16  # of a key's id in a per-key metric's `key` label (budgets.toml takes such a prefix)


class EngineStatsCollector:
    """Turns one `engine.stats()` snapshot into gauges and counters on every scrape.
    `subsystem` goes between the prefix and each name, for a second engine in one server
    (tandem serve's embedded cloud engine: `tandem:cloud_engine_kv_blocks_used`)."""

    def __init__(self, engine: EngineProtocol, subsystem: str = ""):
        self.engine = engine
        self.prefix = PREFIX + subsystem

    def collect(self):
        if not self.engine.is_ready:
            return  # still loading: no numbers rather than made-up zeros
        try:
            stats = self.engine.stats()
        except EngineError:
            return
        gauges = [
            ("num_requests_running", "Requests decoding in the engine now.", stats.num_running),
            ("num_requests_waiting", "Requests queued for admission.", stats.num_waiting),
            ("kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).", stats.kv_usage),
            (
                "kv_blocks_used",
                "KV blocks held by requests (cached prefixes nobody holds, which can be reclaimed, are not counted).",
                stats.num_kv_blocks_used,
            ),
            ("kv_blocks_total", "KV blocks in the pool.", stats.num_kv_blocks_total),
        ]
        if stats.kv_cache_bytes_total:  # engines that say what their pool takes
            gauges += [
                ("kv_cache_bytes", "Bytes of the KV pool, scales included.", stats.kv_cache_bytes_total),
                ("kv_cache_tokens", "Tokens the KV pool holds.", stats.kv_cache_tokens_total),
            ]
        for name, doc, value in gauges:
            yield GaugeMetricFamily(self.prefix + name, doc, value=value)
        counters = [
            ("prompt_tokens", "Prompt tokens processed.", stats.num_prompt_tokens_total),
            ("generation_tokens", "Tokens generated.", stats.num_generation_tokens_total),
            ("num_preemptions", "Requests preempted for lack of KV blocks.", stats.num_preemptions_total),
            (
                "num_requests_aborted",
                "Requests stopped before their last token (client gone, cancelled, timed out).",
                stats.num_requests_aborted_total,
            ),
            (
                "prefix_cache_queries",
                "Tokens looked up in the prefix cache (vLLM's prefix_cache_queries).",
                stats.num_prefix_cache_query_tokens_total,
            ),
            (
                "prefix_cache_hits",
                "Prompt tokens served from the prefix cache (vLLM's prefix_cache_hits).",
                stats.num_prefix_cache_hit_tokens_total,
            ),
            (
                "spec_decode_num_drafts",
                "Speculative drafts verified (vLLM's spec_decode_num_drafts).",
                stats.num_spec_drafts_total,
            ),
            ("spec_decode_num_draft_tokens", "Draft tokens verified.", stats.num_spec_draft_tokens_total),
            (
                "spec_decode_num_accepted_tokens",
                "Draft tokens accepted (acceptance rate = accepted / draft tokens).",
                stats.num_spec_accepted_tokens_total,
            ),
        ]
        for name, doc, value in counters:
            # The family adds `_total` to the sample name, as Prometheus counters require.
            yield CounterMetricFamily(self.prefix + name, doc, value=value)
        per_position = CounterMetricFamily(
            self.prefix + "spec_decode_num_accepted_tokens_per_pos",
            "Drafts whose token at this position was accepted.",
            labels=["position"],
        )
        for position, count in enumerate(stats.spec_accepted_tokens_per_position):
            per_position.add_metric([str(position)], count)
        yield per_position
        yield from _caller_draft_counters(self.prefix, stats)


def _caller_draft_counters(prefix: str, stats):
    """Callers' drafts (GenerateWithDrafts) per API key, beside the engine-wide spec_decode counters (which
    count the engine's own drafts too). `key`: the first KEY_LABEL_DIGITS hex digits of the key's id ("none"
    without keys): enough to tell the configured keys apart, and nothing of the key itself."""
    for name, doc, by_key in (
        (
            "spec_decode_caller_draft_tokens",
            "Draft tokens a key's GenerateWithDrafts drafts had verified (billed at the input price).",
            stats.caller_draft_tokens_by_key,
        ),
        (
            "spec_decode_caller_accepted_tokens",
            "Of those, draft tokens the target accepted.",
            stats.caller_accepted_tokens_by_key,
        ),
    ):
        by_label: dict[str, int] = {}
        for key, count in by_key.items():  # summed: two ids sharing a prefix must not make a sample twice
            label = key[:KEY_LABEL_DIGITS] or "none"
            by_label[label] = by_label.get(label, 0) + count
        family = CounterMetricFamily(prefix + name, doc, labels=["key"])
        for label, count in sorted(by_label.items()):
            family.add_metric([label], count)
        yield family


class ServerMetrics:
    """The registry of one app and the per-request measurements the server makes."""

    def __init__(self, engine: EngineProtocol):
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(EngineStatsCollector(engine))
        self.time_to_first_token = Histogram(
            PREFIX + "time_to_first_token_seconds",
            "Time from request arrival to its first token.",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.inter_token_latency = Histogram(
            PREFIX + "inter_token_latency_seconds",
            "Time between consecutive tokens of a request.",
            buckets=ITL_BUCKETS,
            registry=self.registry,
        )
        self.e2e_request_latency = Histogram(
            PREFIX + "e2e_request_latency_seconds",
            "Time from request arrival to its last token.",
            buckets=E2E_BUCKETS,
            registry=self.registry,
        )
        self.request_success = Counter(
            PREFIX + "request_success",
            "Requests that finished, by finish reason.",
            ["finished_reason"],
            registry=self.registry,
        )
        self.http_rejections = Counter(
            PREFIX + "http_rejections",
            "Requests refused before reaching the model, by reason.",
            ["reason"],
            registry=self.registry,
        )
        for reason in REJECTION_REASONS:
            self.http_rejections.labels(reason)  # exported at 0 from the start, so rate() works at once

    def count_rejection(self, reason: str) -> None:
        self.http_rejections.labels(reason).inc()

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def timer(self, arrival_time: float) -> "RequestTimer":
        return RequestTimer(self, arrival_time)


class RequestTimer:
    """Times one engine stream's tokens as they reach the server."""

    def __init__(self, metrics: ServerMetrics, arrival_time: float, clock: Callable[[], float] = time.monotonic):
        self.metrics = metrics
        self.arrival_time = arrival_time
        self.clock = clock
        self.last_time: float | None = None
        self.finished = False

    def on_event(self, event: TokenEvent) -> None:
        now = self.clock()
        if self.last_time is None:
            self.metrics.time_to_first_token.observe(now - self.arrival_time)
        else:
            self.metrics.inter_token_latency.observe(now - self.last_time)
        self.last_time = now
        if event.finish_reason is not None:
            self.finished = True
            self.metrics.e2e_request_latency.observe(now - self.arrival_time)
            self.metrics.request_success.labels(event.finish_reason).inc()

    def on_error(self) -> None:
        """The engine refused or failed the request: not a finished request, so not counted."""
        self.finished = True

    def on_close(self) -> None:
        """The stream ended without a last event: the client left or the engine aborted it."""
        if not self.finished:
            self.finished = True
            self.metrics.request_success.labels("abort").inc()
