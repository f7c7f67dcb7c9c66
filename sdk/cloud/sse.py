"""Deadlines and server-sent events over httpx, for the HTTP clients (sdk.cloud.openai_client, sdk.client.http)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx


def deadline_at(timeout_s: float | None) -> float | None:
    return None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s


async def until(awaitable, deadline: float | None):
    """Await before an absolute loop-time deadline (TimeoutError after it). Only awaits inside
    the generator are bounded this way, never its yields: a timeout spanning a yield would
    cancel the consumer's code instead. The deadline is absolute, so the consumer's time counts."""
    if deadline is None:
        return await awaitable
    if hasattr(asyncio, "timeout_at"):  # 3.11+
        async with asyncio.timeout_at(deadline):
            return await awaitable
    return await asyncio.wait_for(awaitable, max(0.0, deadline - asyncio.get_running_loop().time()))


async def sse_data(response: httpx.Response, deadline: float | None) -> AsyncIterator[str]:
    """The `data` of each server-sent event, read incrementally (comments and other fields skipped)."""
    lines = response.aiter_lines()
    data: list[str] = []
    try:
        while True:
            try:
                line = await until(anext(lines), deadline)
            except StopAsyncIteration:
                break
            if not line:
                if data:
                    yield "\n".join(data)
                    data = []
            elif line.startswith("data:"):
                data.append(line[6:] if line.startswith("data: ") else line[5:])
        if data:  # the last event without its blank line
            yield "\n".join(data)
    finally:
        await lines.aclose()
