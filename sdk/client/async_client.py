"""The OpenAI-shaped API apps embed: chat completions over the in-process cascade.

    client = AsyncClient(CascadeRunner(local_engine, CloudClient("host:port")))  # in this process
    client = AsyncClient(base_url="http://127.0.0.1:8000/v1")  # or a `tandem serve` endpoint
    reply = await client.chat.completions.create(model="auto:0.35", messages=[...])
    reply.choices[0].message.content, reply.tandem["tier"]
    async for chunk in await client.chat.completions.create(model="local", messages=[...], stream=True):
        ...

Responses are the HTTP server's own pydantic models (sdk.protocol.openai_schema) plus a `tandem`
field, so code written against the `openai` package reads them unchanged. `Client` is the
synchronous twin (sdk.client.sync_client).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError

from router.decision import parse_model_choice
from sdk.cascade.openai import prepare_routed, routed_completion, routed_stream
from sdk.cascade.responses import TandemChatCompletion, TandemChatCompletionChunk
from sdk.cascade.runner import CascadeRunner
from sdk.openai_server.errors import from_validation_errors
from sdk.protocol.engine import InvalidRequestError
from sdk.protocol.openai_schema import ChatCompletionRequest
from sdk.protocol.openai_schema.embeddings import EmbeddingRequest, EmbeddingResponse
from sdk.protocol.openai_schema.feedback import FeedbackRequest, FeedbackResponse
from sdk.traffic.record import FeedbackError

__all__ = ["AsyncClient", "FeedbackError", "FeedbackResponse", "TandemChatCompletion", "TandemChatCompletionChunk"]


def build_request(model: str, messages: list, private: bool, fields: dict[str, Any]) -> ChatCompletionRequest:
    """Validate the arguments the way the server validates a body (fields it would refuse are
    refused here too); InvalidRequestError names the param."""
    if not isinstance(model, str):
        raise InvalidRequestError(f"model must be a string, got {type(model).__name__}", "model")
    parse_model_choice(model)  # raised here, not on the first event: a bad model fails create() itself
    if not isinstance(private, bool):
        raise InvalidRequestError(f"private must be a boolean, got {type(private).__name__}", "private")
    body = {"model": model, "messages": messages, **{k: v for k, v in fields.items() if v is not None}}
    try:
        # Through JSON, exactly like an HTTP body: strict types, no silent coercion.
        request = ChatCompletionRequest.model_validate_json(json.dumps(body))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ValidationError):
            error = from_validation_errors(exc.errors(include_url=False))
            raise InvalidRequestError(error.info.message, error.info.param) from None
        raise InvalidRequestError(f"arguments must be JSON values: {exc}", "messages") from None
    return request  # its validators refused what tandem does not do: a clear error, not prose


def build_embedding_request(fields: dict[str, Any]) -> EmbeddingRequest:
    """Validated like the server's POST /v1/embeddings body; InvalidRequestError names the param."""
    try:
        return EmbeddingRequest.model_validate_json(json.dumps({k: v for k, v in fields.items() if v is not None}))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ValidationError):
            error = from_validation_errors(exc.errors(include_url=False))
            raise InvalidRequestError(error.info.message, error.info.param or "input") from None
        raise InvalidRequestError(f"arguments must be JSON values: {exc}", "input") from None


def build_feedback(response_id: str, score: float | None, thumbs: str | None) -> FeedbackRequest:
    """Validated like the server's POST /v1/feedback body; InvalidRequestError names the param."""
    try:
        return FeedbackRequest.model_validate_json(json.dumps({"id": response_id, "score": score, "thumbs": thumbs}))
    except ValidationError as exc:
        error = from_validation_errors(exc.errors(include_url=False))
        raise InvalidRequestError(error.info.message, error.info.param or "id") from None


class InProcessBackend:
    """The cascade runner in this process."""

    def __init__(self, runner: CascadeRunner):
        self.runner = runner
        self._embeddings = None  # sdk.embeddings.service.EmbeddingService, made on first use

    async def close(self) -> None:
        if self.runner.cloud is not None:
            await self.runner.cloud.close()

    async def create(self, model: str, messages: list, stream: bool, private: bool, fields: dict):
        chat = await prepare_routed(self.runner, build_request(model, messages, private, fields), model)
        response_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        call = routed_stream if stream else routed_completion
        return await call(self.runner, chat, model=model, private=private, response_id=response_id, created=created)

    async def embeddings(self, request: EmbeddingRequest) -> EmbeddingResponse:
        if self._embeddings is None:
            from sdk.embeddings.service import EmbeddingService

            self._embeddings = EmbeddingService(threads=1)
        model = request.model or self._embeddings.model_id
        if model != self._embeddings.model_id:
            raise InvalidRequestError(f"embeddings come from {self._embeddings.model_id!r}, not {model!r}", "model")
        result = await self._embeddings.embed(request.texts, bool(request.truncate))
        return EmbeddingResponse.of(
            result.vectors, result.num_tokens, model, request.encoding_format or "float", request.ignored_fields
        )

    async def feedback(self, request: FeedbackRequest) -> FeedbackResponse:
        record = self.runner.traffic
        if record is None:
            raise FeedbackError(
                404, "feedback needs the runner's traffic record (sdk.traffic: [traffic] record = true)"
            )
        outcome = await asyncio.to_thread(
            record.feedback, request.id, None, request.value, "thumbs" if request.thumbs else "score"
        )
        return FeedbackResponse(id=request.id, score=request.value, **outcome)


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
        tools: list[dict] | None = None,
        tool_choice: str | dict | None = None,
        parallel_tool_calls: bool | None = None,
        response_format: dict | None = None,
        **unsupported,
    ) -> TandemChatCompletion | AsyncIterator[TandemChatCompletionChunk]:
        """One chat completion; with stream=True, an async iterator of chunks (module docstring).
        With tools, the message carries `tool_calls` (finish_reason "tool_calls"); streamed, a
        chunk's `delta.tool_calls` carries each call whole."""
        if unsupported:
            # A typo or an OpenAI option we do not honour must not be dropped silently.
            raise TypeError(f"create() got unsupported argument(s): {', '.join(sorted(unsupported))}")
        fields = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed,
            "stop": stop,
            "tools": tools,
            "tool_choice": tool_choice,
            "parallel_tool_calls": parallel_tool_calls,
            "response_format": response_format,
        }
        return await self._backend.create(model, messages, stream, private, fields)


class _AsyncChat:
    def __init__(self, backend):
        self.completions = AsyncCompletions(backend)


class AsyncEmbeddings:
    def __init__(self, backend):
        self._backend = backend

    async def create(
        self,
        *,
        input: str | list[str],
        model: str | None = None,
        encoding_format: str | None = None,
        dimensions: int | None = None,
        user: str | None = None,
        truncate: bool | None = None,
        **unsupported,
    ) -> EmbeddingResponse:
        """OpenAI's embeddings.create over all-MiniLM-L6-v2 (in-process, or the endpoint's
        POST /v1/embeddings): 384 floats per text, or base64 with encoding_format="base64"."""
        if unsupported:
            raise TypeError(f"create() got unsupported argument(s): {', '.join(sorted(unsupported))}")
        request = build_embedding_request(
            {
                "input": input,
                "model": model,
                "encoding_format": encoding_format,
                "dimensions": dimensions,
                "user": user,
                "truncate": truncate,
            }
        )
        return await self._backend.embeddings(request)


class AsyncClient:
    """client.chat.completions.create(...) in the caller's event loop, over a CascadeRunner in
    this process, or over HTTP to a `tandem serve` endpoint (base_url, api_key)."""

    def __init__(
        self,
        runner: CascadeRunner | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float | None = 600.0,
    ):
        if (runner is None) == (base_url is None):
            raise ValueError("AsyncClient needs either a CascadeRunner or a base_url (one of them)")
        if runner is not None:
            self.runner = runner
            self._backend = InProcessBackend(runner)
        else:
            from sdk.client.http import HttpBackend  # httpx only when talking to an endpoint

            self.runner = None
            self._backend = HttpBackend(base_url, api_key, timeout_s)
        self.chat = _AsyncChat(self._backend)
        self.embeddings = AsyncEmbeddings(self._backend)

    async def feedback(
        self, response_id: str, *, score: float | None = None, thumbs: str | None = None
    ) -> FeedbackResponse:
        """Say how right a routed answer was: `score` in [0, 1] or `thumbs` "up"/"down" for the
        `id` of a chat completion this client received (POST /v1/feedback over HTTP). It labels
        the tier that answered, for the router to learn from. FeedbackError (status 404) for an id
        never recorded, (403) for another key's response; a privacy-flagged response comes back
        with recorded=False."""
        return await self._backend.feedback(build_feedback(response_id, score, thumbs))

    async def close(self) -> None:
        """Close the cloud channel (in-process) or the HTTP connections."""
        await self._backend.close()
