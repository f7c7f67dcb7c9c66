"""sdk.AsyncClient over HTTP: the same create() against a `tandem serve` endpoint (an app
whose runtime runs as a service, e.g. on another process or an Android service).

Responses are parsed into the same TandemChatCompletion / chunk objects as in-process,
with the stream shaped the same way (the last chunk carries finish_reason, usage and
`tandem`), and errors are the typed ones sdk.cloud.openai_client raises for an OpenAI
server (CloudInvalidArgumentError is an InvalidRequestError, ...)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx

from sdk.cascade.responses import TandemChatCompletion, TandemChatCompletionChunk
from sdk.cloud.openai_client import CONNECT_TIMEOUT_S
from sdk.cloud.sse import sse_data
from sdk.cloud.openai_wire import _error_info, error_from_response, error_from_transport, parse_data
from sdk.protocol.openai_schema.embeddings import EmbeddingRequest, EmbeddingResponse
from sdk.protocol.openai_schema.feedback import FeedbackRequest, FeedbackResponse
from sdk.traffic.record import FeedbackError


class HttpBackend:
    """POSTs chat completions to `base_url` (e.g. "http://127.0.0.1:8000/v1")."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float | None = 600.0):
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S))

    async def close(self) -> None:
        await self.http.aclose()

    async def feedback(self, request: FeedbackRequest) -> FeedbackResponse:
        return await _feedback(self.http, self.base_url, request)

    async def embeddings(self, request: EmbeddingRequest) -> EmbeddingResponse:
        body = request.model_dump(exclude_none=True, exclude_defaults=True) | {"input": request.input}
        try:
            response = await self.http.post(f"{self.base_url}/embeddings", json=body)
        except httpx.TransportError as error:
            raise error_from_transport(error, self.base_url) from None
        if response.status_code != 200:
            raise error_from_response(response.status_code, response.headers, response.content, self.base_url)
        return EmbeddingResponse.model_validate_json(response.content)

    async def create(self, model: str, messages: list, stream: bool, private: bool, fields: dict):
        body = {"model": model, "messages": messages, **{k: v for k, v in fields.items() if v is not None}}
        if private:
            body["private"] = True
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        request = self.http.build_request("POST", f"{self.base_url}/chat/completions", json=body)
        try:
            response = await self.http.send(request, stream=True)
        except httpx.TransportError as error:
            raise error_from_transport(error, self.base_url) from None
        try:
            if response.status_code != 200:
                raise error_from_response(response.status_code, response.headers, await response.aread(), self.base_url)
            if not stream:
                return TandemChatCompletion.model_validate_json(await response.aread())
        except BaseException:
            await response.aclose()
            raise
        return _chunks(response, self.base_url)


async def _feedback(http: httpx.AsyncClient, base_url: str, request: FeedbackRequest) -> FeedbackResponse:
    try:
        response = await http.post(
            f"{base_url}/feedback",
            content=request.model_dump_json(exclude_none=True),
            headers={"Content-Type": "application/json"},
        )
    except httpx.TransportError as error:
        raise error_from_transport(error, base_url) from None
    if response.status_code in (403, 404):  # the answers feedback itself gives: the same error as in-process
        raise FeedbackError(response.status_code, str(_error_info(response.content).get("message") or response.text))
    if response.status_code != 200:
        raise error_from_response(response.status_code, response.headers, response.content, base_url)
    return FeedbackResponse.model_validate_json(response.content)


async def _chunks(response: httpx.Response, base_url: str) -> AsyncIterator[TandemChatCompletionChunk]:
    """The stream's chunks, with the usage chunk folded into the finish chunk before it."""
    pending: TandemChatCompletionChunk | None = None  # the finish chunk, waiting for usage
    try:
        async with contextlib.aclosing(sse_data(response, None)) as events:
            async for data in events:
                if data == "[DONE]":
                    break
                payload = parse_data(data)
                if "error" in payload:  # the server failed after the stream began
                    raise error_from_response(500, {}, data.encode(), base_url)
                chunk = TandemChatCompletionChunk.model_validate(payload)
                if not chunk.choices:  # OpenAI's usage chunk
                    if pending is not None:
                        pending.usage, chunk = chunk.usage, pending
                        pending = None
                    yield chunk
                elif chunk.choices[0].finish_reason is not None:
                    pending = chunk
                else:
                    yield chunk
        if pending is not None:
            yield pending
    except httpx.TransportError as error:
        raise error_from_transport(error, base_url) from None
    finally:
        await response.aclose()  # early close: the server sees the disconnect and cancels
