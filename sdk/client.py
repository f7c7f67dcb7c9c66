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
from sdk.cascade_openai import routed_completion, routed_stream
from sdk.client_types import TandemChatCompletion, TandemChatCompletionChunk, build_request

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
        call = routed_stream if stream else routed_completion
        return await call(
            self._runner, message_dicts, params, model=model, private=private, response_id=response_id, created=created
        )


class _AsyncChat:
    def __init__(self, runner: CascadeRunner):
        self.completions = AsyncCompletions(runner)


class AsyncClient:
    """client.chat.completions.create(...) over a CascadeRunner, in the caller's event loop."""

    def __init__(self, runner: CascadeRunner):
        self.runner = runner
        self.chat = _AsyncChat(runner)


from sdk.client_sync import Client  # noqa: E402  (the sync twin builds on AsyncClient)
