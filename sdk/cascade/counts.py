"""Counts of how the cascade routed its requests (tier, reason, degradation, hand-off);
the server exports them with the cost ledger and privacy counters (openai_server.cascade_metrics)."""

from __future__ import annotations

import threading
from collections import Counter

from sdk.cascade.types import RoutingInfo


class RouteCounter:
    """How finished requests were routed; the runner records every request once."""

    def __init__(self):
        self._lock = threading.Lock()
        self._routes: Counter[tuple[str, bool]] = Counter()  # (answering tier, escalated)
        self._reasons: Counter[str] = Counter()  # the deciding reason
        self._degraded: Counter[str] = Counter()  # degraded_reason
        self._handoffs: Counter[str] = Counter()  # restart / continue

    def record(self, info: RoutingInfo) -> None:
        with self._lock:
            self._routes[(info.tier, info.escalated)] += 1
            self._reasons[info.reason] += 1
            if info.degraded_reason:
                self._degraded[info.degraded_reason] += 1
            if info.handoff:
                self._handoffs[info.handoff] += 1

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "routes": dict(self._routes),
                "reasons": dict(self._reasons),
                "degraded": dict(self._degraded),
                "handoffs": dict(self._handoffs),
            }
