"""Small factories for the traffic tests: routing infos, entries, an embedder that needs no model."""

from __future__ import annotations

import hashlib

import numpy as np

from sdk.cascade.types import RoutingInfo
from sdk.traffic.entry import TrafficEntry
from sdk.traffic.record import TrafficConfig, TrafficRecord


class HashEmbedder:
    """A deterministic unit vector per text (code above the embedder: the record only stores it)."""

    fingerprint = "hash-embedder|test"

    def __call__(self, texts):
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
            row = np.random.default_rng(seed).normal(size=384)
            rows.append(row / np.linalg.norm(row))
        return np.array(rows, np.float32)


def routing(tier: str = "local", escalated: bool = False, reason: str = "confident") -> RoutingInfo:
    cost = {tier: {"prompt_tokens": 12, "completion_tokens": 5, "cost_usd": 0.0}, "total_cost_usd": 0.0}
    return RoutingInfo(tier=tier, escalated=escalated, reason=reason, confidence=0.8, decided_by="streaming", cost=cost)


def entry(
    response_id: str, key: str | None = "fp-a", tier: str = "local", private: bool = False, text: str = "What is 2+2?"
) -> TrafficEntry:
    return TrafficEntry(
        response_id=response_id,
        key_fingerprint=key,
        model="auto",
        routing=routing(tier),
        finish_reason="stop",
        latency_ms=12.5,
        prompt_text=text,
        flagged_private=private,
        answer_text="4",
    )


def open_record(path, **config) -> TrafficRecord:
    return TrafficRecord(TrafficConfig(str(path), **config), embedder_factory=HashEmbedder).start()
