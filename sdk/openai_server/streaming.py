"""Server-sent events the way OpenAI streams them, closed promptly when the client leaves.

Starlette only watches for a disconnect under older ASGI versions; under ASGI 2.4 it
notices one only when the next `send` fails, and it never closes the body iterator.
An abandoned stream would then keep its engine request (and KV blocks) until
garbage collection. This response always watches `receive` for the disconnect and
always closes its generator, whose `finally` closes the engine stream.

It also yields to the event loop after every event it writes. Events often come in bursts
that need no waiting (a step's batch, the cascade's held-back tokens released at once); a
client that resets its connection mid-burst makes a write fail, and the transport only tells
the server (connection_lost) on the loop's next turn, so without a turn in between every
further write of the burst went to a dead socket and asyncio logged `socket.send() raised
exception.` for each (58 in one soak run, thousands in tests/sdk/test_disconnect_writes.py).
"""

from __future__ import annotations

import asyncio
import json
from typing import AsyncGenerator, AsyncIterator, Callable, Sequence

import anyio
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from sdk.protocol.engine import TokenEvent
from sdk.protocol.openai_schema import Usage
from sdk.openai_server.errors import from_exception
from sdk.openai_server.generation import ChoiceState, usage_of

DONE = "data: [DONE]\n\n"


def sse(payload: BaseModel | dict) -> str:
    """One `data:` event carrying a JSON object."""
    if isinstance(payload, BaseModel):
        body = payload.model_dump_json()
    else:
        body = json.dumps(payload, separators=(",", ":"))
    return f"data: {body}\n\n"


# Stands in for the text while a chunk is rendered once; no model text holds NUL characters around it.
_TEXT_MARK = "\x00tandem-text\x00"


def sse_for_text(render: Callable[[str], BaseModel]) -> Callable[[str], str]:
    """`lambda text: sse(render(text))`, with the model built and serialised once instead of per token.

    A plain text delta is most of a stream's events, and building and dumping a pydantic chunk
    for each was Python work the event loop did per token on cores llama.cpp fills (the socket
    write that follows is most of what remains). The chunk is rendered once around a marker;
    each token's event is then the two halves around its JSON-encoded text (json.dumps escapes
    exactly as pydantic does for str: tests/sdk/test_sse_for_text.py). Falls back to the slow
    path if the marker is not found exactly once.
    """
    head, found, tail = sse(render(_TEXT_MARK)).partition(json.dumps(_TEXT_MARK))
    if not found or json.dumps(_TEXT_MARK) in tail:
        return lambda text: sse(render(text))
    return lambda text: head + json.dumps(text, ensure_ascii=False) + tail


class EventStreamResponse(StreamingResponse):
    """text/event-stream over an async generator of already formatted events."""

    def __init__(self, events: AsyncGenerator[str, None], headers: dict[str, str] | None = None):
        # no-cache and X-Accel-Buffering stop proxies from holding tokens back.
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
        )
        self._events = events

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for event in self.body_iterator:
            data = event if isinstance(event, (bytes, memoryview)) else event.encode(self.charset)
            await send({"type": "http.response.body", "body": data, "more_body": True})
            # A turn for connection_lost, so writes stop at a reset (docstring). asyncio's own bare
            # yield: anyio's sleep(0) looks its backend up first, on every token of every stream.
            await asyncio.sleep(0)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as task_group:

                async def stream_then_stop() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:
                        pass  # the client vanished while we were sending
                    task_group.cancel_scope.cancel()

                task_group.start_soon(stream_then_stop)
                await self.listen_for_disconnect(receive)
                task_group.cancel_scope.cancel()
        finally:
            await self._events.aclose()


async def sse_events(
    first: tuple[int, TokenEvent] | None,
    choices: AsyncIterator[tuple[int, TokenEvent]],
    num_choices: int,
    render_event: Callable[[int, TokenEvent, ChoiceState], BaseModel | str | list[BaseModel | str] | None],
    prelude: Sequence[BaseModel] = (),
    render_usage: Callable[[Usage], BaseModel] | None = None,
    num_prompt_tokens: int = 0,
) -> AsyncGenerator[str, None]:
    """The SSE body for merged choices: prelude, one chunk per event, usage, [DONE].

    `render_event` returns chunk models, or events already formatted (`sse_for_text`).

    `first` is the event already pulled before the response started (so request
    errors could still be a 4xx). An engine error after that becomes an error event,
    since the status line has been sent.
    """
    states = [ChoiceState() for _ in range(num_choices)]
    try:
        for chunk in prelude:
            yield sse(chunk)
        item = first
        while item is not None:
            index, event = item
            states[index].add(event, keep_event=False)
            chunks = render_event(index, event, states[index])
            for chunk in chunks if isinstance(chunks, list) else [chunks] if chunks is not None else []:
                yield chunk if isinstance(chunk, str) else sse(chunk)
            item = await anext(choices, None)
        if render_usage is not None:
            yield sse(render_usage(usage_of(num_prompt_tokens, states)))
    except Exception as exc:
        yield sse(from_exception(exc).body())
    finally:
        await choices.aclose()
    yield DONE
