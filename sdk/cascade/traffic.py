"""What a finished cascade request leaves for learning: a row in the traffic record and,
sometimes, a shadow call to the cloud (sdk.traffic). Nothing here runs unless `tandem serve`
turned them on ([traffic] record, shadow_fraction); neither can fail the request."""

from __future__ import annotations

import logging
import time

from typing import Protocol

from sdk.cascade.types import CascadeEvent
from sdk.protocol.engine import SamplingParams
from sdk.traffic.entry import TrafficEntry

logger = logging.getLogger("tandem.cascade")


class TrafficRecorder(Protocol):
    """What the runner writes a finished request to (sdk.traffic.record.TrafficRecord)."""

    def record(self, entry: TrafficEntry) -> None: ...


class ShadowSampling(Protocol):
    """What may shadow a local answer with a cloud call to label it (sdk.traffic.shadow.ShadowSampler)."""

    def consider(
        self,
        response_id: str,
        messages: list[dict],
        params: SamplingParams,
        prompt_text: str,
        local_answer: str,
        num_prompt_tokens: int,
    ) -> bool: ...


def after_request(request, final: CascadeEvent) -> None:
    """Record `request` (an sdk.cascade.request.CascadeRequest that just produced its final event)."""
    runner = request.runner
    if runner.traffic is None and runner.shadow is None:
        return
    try:
        flagged = bool(request.verdict.reasons)  # the private flag or a privacy rule: counted, never stored
        answer = "".join(request.answer_parts)
        if runner.traffic is not None:
            runner.traffic.record(_entry(request, final, flagged, answer))
        routing = final.routing
        if (
            runner.shadow is not None
            and not flagged
            and routing.tier == "local"
            and not routing.degraded
            and request.params.structured is None
            and final.finish_reason in ("stop", "length")
            and not request.prompt.is_raw  # the shadow judge compares chat answers
        ):
            runner.shadow.consider(
                request.request_id,
                request.cloud_prompt,
                request.params,
                request.context.prompt_text,
                answer,
                request.local.num_prompt_tokens,
            )
    except Exception:  # the answer is out; losing its row must not break anything
        logger.exception("could not record request %s", request.request_id)


def _entry(request, final: CascadeEvent, flagged: bool, answer: str) -> TrafficEntry:
    outputs, scorer = request.router_outputs, request.scorer
    embedding = embedder = None
    if outputs is not None and outputs.embedding is not None:
        embedding = outputs.embedding[0]
        embedder = f"{scorer.metadata['model_fingerprint']}|{scorer.metadata['embedder_precision']}"
    running = request.cascade.streaming.running if request.cascade.streaming is not None else None
    return TrafficEntry(
        response_id=request.request_id,
        key_fingerprint=request.key_fingerprint,
        model=request.model,
        routing=final.routing,
        finish_reason=final.finish_reason,
        latency_ms=(time.monotonic() - request.started) * 1000.0,
        prompt_text=request.context.prompt_text,
        flagged_private=flagged,
        answer_text=answer,
        router_score=None if outputs is None else float(outputs.score[0]),
        router_name=None if outputs is None else scorer.path,
        shape=None if outputs is None else outputs.shape[0],
        embedding=embedding,
        embedder=embedder,
        signals=running.features_dict() if running is not None and running.num_tokens else None,
    )
