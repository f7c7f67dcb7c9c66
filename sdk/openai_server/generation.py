"""Running one OpenAI request as n engine requests, and cancelling them when the client leaves.

Cancellation is the point of this module: an engine request whose client is gone
holds KV blocks and a decode slot until someone closes its event stream (the
engine's `generate` posts an abort from its `finally`). Every path here either
consumes a stream to its last event or closes it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Sequence, TypeVar

from starlette.requests import Request

from sdk.protocol.engine import EngineProtocol, GenerationRequest, TokenEvent, output_tokens_after
from sdk.protocol.openai_schema import CompletionTokensDetails, Usage
from sdk.openai_server.metrics import ServerMetrics

T = TypeVar("T")

DISCONNECT_POLL_S = 0.25  # how soon a vanished non-streaming client frees its blocks
_END = object()  # a choice's stream ended


class ClientDisconnected(Exception):
    """The HTTP client went away before its answer was ready."""


@dataclass
class ChoiceState:
    """What one choice has produced so far."""

    text_parts: list[str] = field(default_factory=list)
    events: list[TokenEvent] = field(default_factory=list)  # kept only when logprobs were asked for
    num_output_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: str | None = None  # "repetition" when the engine stopped a loop
    num_draft_tokens: int = 0  # speculative decoding totals, from the latest event
    num_accepted_tokens: int = 0

    def add(self, event: TokenEvent, keep_event: bool) -> None:
        self.text_parts.append(event.text)
        if keep_event:
            self.events.append(event)
        self.num_output_tokens = output_tokens_after(event, self.num_output_tokens)
        self.num_draft_tokens, self.num_accepted_tokens = event.num_draft_tokens, event.num_accepted_tokens
        if event.finish_reason is not None:
            self.finish_reason, self.stop_reason = event.finish_reason, event.stop_reason

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


async def merge_choices(
    engine: EngineProtocol, requests: Sequence[GenerationRequest], metrics: ServerMetrics, arrival_time: float
) -> AsyncIterator[tuple[int, TokenEvent]]:
    """(choice index, event) pairs from every choice as they arrive.

    Raises the first error any choice raises. Closing or cancelling the iterator
    cancels every choice still running, which aborts it in the engine.
    """
    if len(requests) == 1:  # one choice: its events pass straight through, without a task and queue per token
        events = _timed_events(engine, requests[0], metrics, arrival_time)
        try:
            async for event in events:
                yield 0, event
        finally:
            await events.aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, request: GenerationRequest) -> None:
        events = _timed_events(engine, request, metrics, arrival_time)
        try:
            async for event in events:
                queue.put_nowait((index, event))
            queue.put_nowait((index, _END))
        except Exception as exc:
            queue.put_nowait((index, exc))
        finally:
            await events.aclose()

    tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(requests)]
    try:
        num_open = len(tasks)
        while num_open:
            index, item = await queue.get()
            if item is _END:
                num_open -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()  # synchronous: the abort is posted even if we are cancelled again below
        await asyncio.gather(*tasks, return_exceptions=True)


async def _timed_events(
    engine: EngineProtocol, request: GenerationRequest, metrics: ServerMetrics, arrival_time: float
) -> AsyncIterator[TokenEvent]:
    """One choice's events from the engine, each (and an error, and the end) told to the server's timers."""
    timer = metrics.timer(arrival_time)
    events = engine.generate(request)
    try:
        async for event in events:
            timer.on_event(event)
            yield event
    except Exception:
        timer.on_error()
        raise
    finally:
        timer.on_close()
        await events.aclose()


async def collect_choices(
    choices: AsyncIterator[tuple[int, TokenEvent]], num_choices: int, keep_events: bool
) -> list[ChoiceState]:
    """Drain a merged stream into one state per choice."""
    states = [ChoiceState() for _ in range(num_choices)]
    try:
        async for index, event in choices:
            states[index].add(event, keep_events)
    finally:
        await choices.aclose()
    for state in states:
        if state.finish_reason is None:
            state.finish_reason = "abort"  # the engine ended the stream without a last event
    return states


async def cancel_on_disconnect(request: Request, awaitable: Awaitable[T], poll_s: float = DISCONNECT_POLL_S) -> T:
    """Await `awaitable`, cancelling it (and raising ClientDisconnected) if the client leaves first."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientDisconnected()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def usage_of(num_prompt_tokens: int, states: Sequence[ChoiceState]) -> Usage:
    """OpenAI counts the prompt once however many choices share it."""
    completion = sum(s.num_output_tokens for s in states)
    drafted = sum(s.num_draft_tokens for s in states)
    details = None
    if drafted:  # speculative decoding, reported as OpenAI reports Predicted Outputs
        accepted = sum(s.num_accepted_tokens for s in states)
        details = CompletionTokensDetails(
            accepted_prediction_tokens=accepted, rejected_prediction_tokens=drafted - accepted
        )
    return Usage(
        prompt_tokens=num_prompt_tokens,
        completion_tokens=completion,
        total_tokens=num_prompt_tokens + completion,
        completion_tokens_details=details,
    )
