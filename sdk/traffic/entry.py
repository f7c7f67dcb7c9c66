"""One routed request as the traffic record receives it (`TrafficEntry`), and the row it
becomes (`entry_row`): router features, routing, signals, cost, latency; text only when
the record keeps text."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from router.prompt_router.prompt_shape import SHAPE_VERSION, shape_features
from sdk.traffic import store


@dataclass
class TrafficEntry:
    """One routed request, as the cascade saw it (text held in memory until the writer has it)."""

    response_id: str
    key_fingerprint: str | None
    model: str
    routing: object  # sdk.cascade.types.RoutingInfo
    finish_reason: str | None
    latency_ms: float
    prompt_text: str
    flagged_private: bool  # the private flag or a privacy rule matched: counted, never stored
    answer_text: str | None = None
    router_score: float | None = None
    router_name: str | None = None
    shape: np.ndarray | None = None  # from the router, when it ran
    embedding: np.ndarray | None = None  # from the router, when it has an embedder
    embedder: str | None = None  # what made `embedding`
    signals: dict | None = None  # the local answer's confidence features at its end
    created_at: float = field(default_factory=time.time)


def entry_row(entry: TrafficEntry, embedding: np.ndarray | None, embedder: str | None, keep_text: bool) -> dict:
    """The `requests` row of `entry` (sdk.traffic.schema), with the prompt's MiniLM vector if any."""
    routing = entry.routing
    cost = getattr(routing, "cost", {}) or {}
    shape = entry.shape if entry.shape is not None else shape_features([entry.prompt_text])[0]
    return {
        "id": entry.response_id,
        "created_at": entry.created_at,
        "key_fingerprint": entry.key_fingerprint,
        "model": entry.model,
        "tier": routing.tier,
        "escalated": int(routing.escalated),
        "reason": str(routing.reason),
        "decided_by": routing.decided_by,
        "degraded_reason": routing.degraded_reason,
        "confidence": routing.confidence,
        "decided_at_token": routing.decided_at_token,
        "finish_reason": entry.finish_reason,
        "router_score": entry.router_score,
        "router": entry.router_name,
        "latency_ms": entry.latency_ms,
        "local_prompt_tokens": cost.get("local", {}).get("prompt_tokens"),
        "local_completion_tokens": cost.get("local", {}).get("completion_tokens"),
        "cloud_prompt_tokens": cost.get("cloud", {}).get("prompt_tokens"),
        "cloud_completion_tokens": cost.get("cloud", {}).get("completion_tokens"),
        "cost_usd": cost.get("total_cost_usd"),
        "signals": entry.signals,
        "shape": store.to_blob(shape),
        "shape_version": SHAPE_VERSION,
        "embedding": store.to_blob(embedding),
        "embedder": embedder if embedding is not None else None,
        "prompt_text": entry.prompt_text if keep_text else None,
        "answer_text": entry.answer_text if keep_text else None,
    }
