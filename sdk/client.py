"""The OpenAI-shaped API apps embed: chat completions over the in-process cascade.

    client = AsyncClient(CascadeRunner(local_engine, CloudClient("host:port")))
    reply = await client.chat.completions.create(model="auto:0.35", messages=[...])
    reply.choices[0].message.content, reply.tandem["tier"]
    async for chunk in await client.chat.completions.create(model="local", messages=[...], stream=True):
        ...

Responses are the HTTP server's own pydantic models (sdk.openai_schema) plus a `tandem`
field, so code written against the `openai` package reads them unchanged. `Client` is the
synchronous twin (sdk.client_sync).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from sdk.cascade import CascadeRunner
from sdk.cascade_types import CascadeEvent, collect
from sdk.client_types import (
    TandemChatCompletion,
    TandemChatCompletionChunk,
    build_request,
    tandem_field,
    usage_of,
)
from sdk.openai_schema import ChatChoice, ChatChunkChoice, ChatResponseMessage, DeltaMessage

__all__ = ["AsyncClient", "Client", "TandemChatCompletion", "TandemChatCompletionChunk"]


class AsyncCompletions:
    def __init__(self, runner: CascadeRunner):
        self._runner = runner

    async def create(
        self,
        *,
        model: str = "auto",
        messages: list,
        stream: bool = False,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | list[str] | None = None,
        private: bool = False,
        **unsupported,
    ) -> TandemChatCompletion | AsyncIterator[TandemChatCompletionChunk]:
        """One chat completion; with stream=True, an async iterator of chunks (module docstring)."""
        if unsupported:
            # A typo or an OpenAI option we do not honour must not be dropped silently.
            raise TypeError(f"create() got unsupported argument(s): {', '.join(sorted(unsupported))}")
        fields = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "seed": seed, "stop": stop}
        message_dicts, params = build_request(self._runner.local, model, messages, private, fields)
        response_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        events = self._runner.generate(message_dicts, params, model=model, private=private, request_id=response_id)
        if not stream:
            result = await collect(events)
            return TandemChatCompletion(
                id=response_id,
                created=created,
                model=model,
                choices=[ChatChoice(index=0, message=ChatResponseMessage(content=result.text), finish_reason=result.finish_reason)],
                usage=usage_of(result.routing, len(result.token_ids)),
                tandem=tandem_field(result.routing),
            )
        # Pull the first event now so a refused request raises from create(), as the server
        # answers it with a 400 before any chunk goes out.
        first = await anext(events, None)
        return _chunks(events, first, response_id, created, model)


async def _chunks(
    events: AsyncIterator[CascadeEvent], first: CascadeEvent | None, response_id: str, created: int, model: str
) -> AsyncIterator[TandemChatCompletionChunk]:
    def chunk(delta: DeltaMessage, finish_reason=None, **extra) -> TandemChatCompletionChunk:
        choice = ChatChunkChoice(index=0, delta=delta, finish_reason=finish_reason)
        return TandemChatCompletionChunk(id=response_id, created=created, model=model, choices=[choice], **extra)

    num_tokens = 0
    try:
        yield chunk(DeltaMessage(role="assistant", content=""))  # OpenAI opens with the role
        if first is None:
            raise RuntimeError("the cascade stream ended without its final routing event")
        event = first
        while True:
            if event.routing is not None:
                routing = event.routing
                yield chunk(
                    DeltaMessage(), event.finish_reason,  # collect() ignores the final event's text too
                    usage=usage_of(routing, num_tokens), tandem=tandem_field(routing),
                )
                return
            num_tokens += 1
            if event.text:  # tokens whose text is held back (partial characters) need no chunk
                yield chunk(DeltaMessage(content=event.text))
            event = await anext(events, None)
            if event is None:
                raise RuntimeError("the cascade stream ended without its final routing event")
    finally:
        await events.aclose()  # an app that stops reading early cancels the generation


class _AsyncChat:
    def __init__(self, runner: CascadeRunner):
        self.completions = AsyncCompletions(runner)


class AsyncClient:
    """client.chat.completions.create(...) over a CascadeRunner, in the caller's event loop."""

    def __init__(self, runner: CascadeRunner):
        self.runner = runner
        self.chat = _AsyncChat(runner)


from sdk.client_sync import Client  # noqa: E402  (the sync twin builds on AsyncClient)
