"""The soak's client: C workers stream the requests in index order and record each one's outcome.

Outcomes: completed (the stream ended with a finish_reason and [DONE]); cancelled_by_client
(the client closed the stream after its planned number of content chunks);
rejected_as_expected (an invalid request answered with the status it must get);
refused_by_budget (a 429 insufficient_quota: a hard budget reached, with --budget-usd-per-day); failed,
with a cause: `http_<status>:<error code or type>`, `stream_error:<code or type>`,
`no_finish_reason`, `stream_ended_without_done`, `client_timeout` (the per-request limit
passed: never a hang), `exception:<class>`, or `unexpected_status_<got>_wanted_<want>`.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Callable

import httpx

from bench.soak_workload import SoakRequest

OUTCOMES = ("completed", "cancelled_by_client", "rejected_as_expected", "refused_by_budget", "failed")


@dataclass
class SoakResult:
    """What happened to one request (times in seconds from the soak's start, latencies in seconds)."""

    index: int
    outcome: str = ""  # one of OUTCOMES; "" would be a lost request
    cause: str = ""  # why it failed
    http_status: int | None = None
    tier: str | None = None  # from the last chunk's `tandem` field (routed models)
    escalated: bool | None = None
    route_reason: str | None = None
    degraded_reason: str | None = None  # the cloud should have answered and the local tier did: why
    finish_reason: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    content_chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None  # the last chunk's tandem.cost.total_cost_usd (routed models)
    start_s: float = 0.0
    end_s: float = 0.0
    cancel_not_reached: bool = False  # a planned cancel whose stream finished first
    detail: str = field(default="", repr=False)  # the first 200 characters of an error


def _error_code(payload) -> str:
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        return str(error.get("code") or error.get("type") or "unknown")
    return "unknown"


async def _stream(client: httpx.AsyncClient, url: str, req: SoakRequest, result: SoakResult, sent: float) -> None:
    async with client.stream("POST", url, json=req.body) as response:
        result.http_status = response.status_code
        if response.status_code != 200:
            raw = await response.aread()
            try:
                code = _error_code(json.loads(raw))
            except ValueError:
                code = "unparsable_body"
            result.detail = raw.decode("utf-8", errors="replace")[:200]
            if response.status_code == req.expect_status:
                result.outcome = "rejected_as_expected"
            elif response.status_code == 429 and code == "insufficient_quota":
                result.outcome = "refused_by_budget"
            else:
                result.outcome = "failed"
                result.cause = f"http_{response.status_code}:{code}"
            return
        if req.expect_status != 200:
            result.outcome, result.cause = "failed", f"unexpected_status_200_wanted_{req.expect_status}"
            return
        done = False
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                result.outcome, result.cause = "failed", f"stream_error:{_error_code(chunk)}"
                result.detail = data[:200]
                return
            for choice in chunk.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    result.content_chunks += 1
                    if result.ttft_s is None:
                        result.ttft_s = time.perf_counter() - sent
                result.finish_reason = choice.get("finish_reason") or result.finish_reason
            if chunk.get("usage"):
                result.prompt_tokens = chunk["usage"].get("prompt_tokens")
                result.completion_tokens = chunk["usage"].get("completion_tokens")
            if chunk.get("tandem"):
                result.tier = chunk["tandem"].get("tier")
                result.escalated = chunk["tandem"].get("escalated")
                result.route_reason = chunk["tandem"].get("reason")
                result.cost_usd = (chunk["tandem"].get("cost") or {}).get("total_cost_usd", result.cost_usd)
                if chunk["tandem"].get("degraded"):
                    result.degraded_reason = chunk["tandem"].get("degraded_reason") or "unknown"
            if req.cancel_after_chunks and result.content_chunks >= req.cancel_after_chunks:
                result.outcome = "cancelled_by_client"
                return  # leaving the block closes the connection: the server sees a disconnect
    if not done:
        result.outcome, result.cause = "failed", "stream_ended_without_done"
    elif result.finish_reason is None:
        result.outcome, result.cause = "failed", "no_finish_reason"
    else:
        result.outcome = "completed"
        result.cancel_not_reached = req.cancel_after_chunks > 0


async def send_soak_request(
    client: httpx.AsyncClient, url: str, req: SoakRequest, t0: float, timeout_s: float
) -> SoakResult:
    """Run one request to its end; never raises (except cancellation of the soak itself)."""
    result = SoakResult(req.index, start_s=time.perf_counter() - t0)
    sent = time.perf_counter()
    try:
        await asyncio.wait_for(_stream(client, url, req, result, sent), timeout_s)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        result.outcome, result.cause = "failed", "client_timeout"
        result.detail = (
            f"after {timeout_s:.0f}s, {result.content_chunks} content chunks received"
            if result.http_status
            else f"after {timeout_s:.0f}s, before the response headers"
        )
    except Exception as exc:  # noqa: BLE001 - every other failure is a finding, not a crash
        result.outcome, result.cause = "failed", f"exception:{type(exc).__name__}"
        result.detail = str(exc)[:200]
    result.e2e_s = time.perf_counter() - sent
    result.end_s = time.perf_counter() - t0
    if not result.outcome:  # _stream always sets one; guard so a bug shows up as a cause, not a lost request
        result.outcome, result.cause = "failed", "no_outcome_recorded"
    return result


async def run_soak(
    base_url: str,
    requests: list[SoakRequest],
    concurrency: int,
    timeout_s: float,
    on_done: Callable[[SoakResult, int], None] | None = None,
) -> tuple[list[SoakResult | None], float]:
    """Closed loop: `concurrency` workers take requests in index order. Returns one slot per
    request (None = lost: never recorded) and the wall time. `on_done(result, num_done)`
    runs after each request."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/v1/chat/completions"
    results: list[SoakResult | None] = [None] * len(requests)
    queue: asyncio.Queue[SoakRequest] = asyncio.Queue()
    for req in requests:
        queue.put_nowait(req)
    num_done = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s, connect=30.0), limits=limits, trust_env=False
    ) as client:
        t0 = time.perf_counter()

        async def worker() -> None:
            nonlocal num_done
            while True:
                try:
                    req = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                result = await send_soak_request(client, url, req, t0, timeout_s)
                results[req.index] = result
                num_done += 1
                if on_done is not None:
                    on_done(result, num_done)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return results, time.perf_counter() - t0
