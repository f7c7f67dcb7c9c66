"""Streaming OpenAI requests and their arrival schedule, timed for bench.serve.

Each request streams with `stream_options.include_usage`. To get fixed output lengths
it sends `ignore_eos: true` (vLLM's and tandem's extension) and `min_tokens` equal to
`max_tokens` (llama-cpp-python's server: it masks the end-of-sequence token until then);
servers ignore the field they do not know. The output length is the server's usage
when it sends one, else `max_tokens` when the stream stopped for length, else the
number of content chunks (most servers stream one token per chunk). A request fails
on an HTTP error, an error in the stream, a stream with no content, or one that ends
without a finish_reason (cut short).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlparse

import httpx

from bench.serve_datasets import SampleRequest
from bench.serve_metrics import RequestResult, gaps


@dataclass
class ClientConfig:
    """Where and how bench.serve sends its requests."""

    base_url: str  # http://host:port, with or without a trailing /v1
    model: str
    endpoint: str = "chat"  # chat | completions
    api_key: str | None = None
    temperature: float = 0.0  # greedy: the same work on every server and every run
    ignore_eos: bool = True  # ask for exactly max_tokens tokens
    timeout_s: float = 600.0  # per request

    @property
    def url(self) -> str:
        root = self.base_url.rstrip("/")
        root = root[: -len("/v1")] if root.endswith("/v1") else root
        return root + ("/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions")

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def make_payload(config: ClientConfig, sample: SampleRequest, max_tokens: int | None = None) -> dict:
    """The JSON body of one streamed request."""
    max_tokens = max_tokens or sample.output_len
    body: dict = {
        "model": config.model,
        "max_tokens": max_tokens,
        "temperature": config.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if config.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": sample.prompt}]
    else:
        body["prompt"] = sample.prompt
    if config.ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    return body


def _content(chunk: dict, endpoint: str) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    if endpoint == "chat":
        return (choices[0].get("delta") or {}).get("content") or ""
    return choices[0].get("text") or ""


async def send_request(
    client: httpx.AsyncClient,
    config: ClientConfig,
    sample: SampleRequest,
    start_offset_s: float = 0.0,
    max_tokens: int | None = None,
) -> RequestResult:
    """Stream one request and time it; never raises for a server or network failure."""
    max_tokens = max_tokens or sample.output_len
    result = RequestResult(ok=False, prompt_len=sample.prompt_len, start_s=start_offset_s)
    chunk_times: list[float] = []
    usage = None
    sent = time.perf_counter()
    try:
        async with client.stream(
            "POST", config.url, json=make_payload(config, sample, max_tokens), headers=config.headers
        ) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode("utf-8", errors="replace")
                result.error = f"HTTP {response.status_code}: {body[:300]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, SSE comments (pings)
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = f"error in stream: {json.dumps(chunk['error'])[:300]}"
                    return result
                if _content(chunk, config.endpoint):
                    chunk_times.append(time.perf_counter())
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    result.finish_reason = choice.get("finish_reason") or result.finish_reason
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:300]
        return result
    result.e2e_s = time.perf_counter() - sent
    if not chunk_times:
        result.error = f"the stream carried no content (finish_reason {result.finish_reason})"
        return result
    if result.finish_reason is None:  # e.g. llama_cpp.server's interrupt_requests cutting a stream short
        result.error = "the stream ended without a finish_reason (cut short)"
        return result
    result.ttft_s = chunk_times[0] - sent
    result.itl_s = gaps(chunk_times)
    if usage and usage.get("completion_tokens") is not None:
        result.output_len, result.output_len_source = int(usage["completion_tokens"]), "usage"
        result.prompt_len = int(usage.get("prompt_tokens") or result.prompt_len)
    elif result.finish_reason == "length":
        result.output_len, result.output_len_source = max_tokens, "length"
    else:
        result.output_len, result.output_len_source = len(chunk_times), "chunks"
    result.ok = True
    return result


def arrival_times(num: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send times in seconds from the start: all 0 for an infinite rate, else gamma-distributed gaps.

    Gaps have mean 1/rate and shape `burstiness` (1 = Poisson arrivals; < 1 burstier,
    > 1 more even), as in vLLM; the first request goes at 0.
    """
    if burstiness <= 0:
        raise ValueError(f"--burstiness must be > 0, got {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * num
    if request_rate <= 0:
        raise ValueError(f"--request-rate must be > 0 or inf, got {request_rate}")
    rng = random.Random(seed)
    scale = 1.0 / (request_rate * burstiness)
    times, now = [], 0.0
    for i in range(num):
        if i:
            now += rng.gammavariate(burstiness, scale)
        times.append(now)
    return times


def make_client(config: ClientConfig, max_connections: int) -> httpx.AsyncClient:
    """An HTTP client with a connection per concurrent request; loopback never goes through a proxy."""
    host = urlparse(config.url).hostname or ""
    loopback = host in ("localhost", "127.0.0.1", "::1") or host.startswith("127.")
    return httpx.AsyncClient(
        timeout=httpx.Timeout(config.timeout_s, connect=30.0),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        trust_env=not loopback,
    )


async def run_requests(
    config: ClientConfig,
    samples: list[SampleRequest],
    send_times_s: list[float],
    max_concurrency: int | None = None,
    on_done: Callable[[RequestResult], None] | None = None,
) -> tuple[list[RequestResult], float]:
    """Send every sample at its time (at most `max_concurrency` in flight); the results and the wall time."""
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {max_concurrency}")
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    async with make_client(config, max_concurrency or max(1, len(samples))) as client:
        start = time.perf_counter()

        async def one(sample: SampleRequest, send_at: float) -> RequestResult:
            await asyncio.sleep(max(0.0, start + send_at - time.perf_counter()))
            if limit is None:
                result = await send_request(client, config, sample, time.perf_counter() - start)
            else:
                async with limit:
                    result = await send_request(client, config, sample, time.perf_counter() - start)
            if on_done is not None:
                on_done(result)
            return result

        results = await asyncio.gather(*(one(s, t) for s, t in zip(samples, send_times_s)))
        return list(results), time.perf_counter() - start


async def warm_up(config: ClientConfig, sample: SampleRequest, max_tokens: int = 8) -> RequestResult:
    """One short request before the measured ones: checks the endpoint and warms the server."""
    async with make_client(config, 1) as client:
        return await send_request(client, config, sample, max_tokens=min(max_tokens, sample.output_len))
