"""The OpenAI-shaped API apps embed: chat completions over the in-process cascade.

    client = AsyncClient(CascadeRunner(local_engine, CloudClient("host:port")))  # in this process
    client = AsyncClient(base_url="http://127.0.0.1:8000/v1")  # or a `tandem serve` endpoint
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


class InProcessBackend:
    """The cascade runner in this process."""

    def __init__(self, runner: CascadeRunner):
        self.runner = runner

    async def close(self) -> None:
        if self.runner.cloud is not None:
            await self.runner.cloud.close()

    async def create(self, model: str, messages: list, stream: bool, private: bool, fields: dict):
        message_dicts, params = build_request(self.runner.local, model, messages, private, fields)
        response_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        call = routed_stream if stream else routed_completion
        return await call(
            self.runner, message_dicts, params, model=model, private=private, response_id=response_id, created=created
        )


class AsyncCompletions:
    def __init__(self, backend):
        self._backend = backend

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
        return await self._backend.create(model, messages, stream, private, fields)


class _AsyncChat:
    def __init__(self, backend):
        self.completions = AsyncCompletions(backend)


class AsyncClient:
    """client.chat.completions.create(...) in the caller's event loop, over a CascadeRunner in
    this process, or over HTTP to a `tandem serve` endpoint (base_url, api_key)."""

    def __init__(self, runner: CascadeRunner | None = None, *, base_url: str | None = None, api_key: str | None = None,
                 timeout_s: float | None = 600.0):  # fmt: skip
        if (runner is None) == (base_url is None):
            raise ValueError("AsyncClient needs either a CascadeRunner or a base_url (one of them)")
        if runner is not None:
            self.runner = runner
            self._backend = InProcessBackend(runner)
        else:
            from sdk.client_http import HttpBackend  # httpx only when talking to an endpoint

            self.runner = None
            self._backend = HttpBackend(base_url, api_key, timeout_s)
        self.chat = _AsyncChat(self._backend)

    async def close(self) -> None:
        """Close the cloud channel (in-process) or the HTTP connections."""
        await self._backend.close()


from sdk.client_sync import Client  # noqa: E402  (the sync twin builds on AsyncClient)
