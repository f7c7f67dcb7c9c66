"""The cloud tier reached over any OpenAI-compatible HTTP API (vLLM, SGLang, OpenAI, tandem's own).

A `CloudBackend` (sdk.protocol.cloud_backend), like `sdk.cloud.grpc_client.CloudClient`:

    runner = CascadeRunner(local_engine, OpenAICloudClient("https://host/v1", api_key=KEY), CascadeConfig())

What differs from the gRPC client:
- Token ids cross only to a vLLM server (found by `discover`, sdk.cloud.vllm_wire): it continues
  after the local answer's `continuation_token_ids` through /v1/completions, and takes tool calls'
  Lark grammars. Any other server takes text and messages only (after `discover`,
  `supports_continuation` and `takes_grammars` are False). Every event's `token_id` is -1
  (`UNKNOWN_TOKEN_ID`): OpenAI's API does not send them.
- One event per content delta (usually one token). The last event carries finish_reason and
  the usage counts: it is held back until the stream ends, since OpenAI sends the usage in
  a chunk of its own after the finish chunk (sdk.cloud.openai_wire.ChunkStream).
- entropy/margin come from the top alternatives when logprobs were asked for, else 0.0.

Failures raise the CloudError classes of sdk.protocol.cloud_backend with the matching CloudStatus
(sdk.cloud.openai_wire.error_from_response), so router.failure_kinds and the cascade
treat both clients alike. The HTTP client is opened on first use; use one client per
event loop and close it (or use `async with`).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence

import httpx

from sdk.protocol.cloud_backend import (
    CloudBackend,
    CloudError,
    CloudInvalidArgumentError,
    CloudModel,
    CloudStatus,
    CloudTokenEvent,
    CloudUnavailableError,
    Prompt,
)
from sdk.protocol.engine import SamplingParams
from sdk.cloud.openai_wire import (
    UNKNOWN_TOKEN_ID,
    ChunkStream,
    chat_messages,
    deadline_error,
    error_from_response,
    error_from_transport,
    parse_data,
    request_body,
)
from sdk.cloud.sse import deadline_at, sse_data, until
from sdk.cloud.vllm_wire import (
    ServerTraits,
    completions_body,
    server_root,
    token_ids_of,
    tokenize_chat_body,
    tokenize_text_body,
    traits_from_version,
)

__all__ = ["OpenAICloudClient", "UNKNOWN_TOKEN_ID"]

CONNECT_TIMEOUT_S = 10.0  # per connection attempt; the whole call is bounded by timeout_s
DISCOVER_TIMEOUT_S = 5.0  # GET /version without a client deadline
_TIMEOUT_ERRORS = (TimeoutError, asyncio.TimeoutError)  # one class since 3.11
# What reading a chunk of the wrong shape raises ({"choices": "x"}, a number for a text, ...).
_SHAPE_ERRORS = (AttributeError, TypeError, ValueError, KeyError, IndexError)


class OpenAICloudClient(CloudBackend):
    """Talks to one OpenAI-compatible server.

    base_url: the API root, e.g. "https://host/v1" (requests go to {base_url}/chat/completions).
    api_key: sent as `Authorization: Bearer <key>`.
    timeout_s: the default deadline of each call (of a whole generate stream), None for none.
    """

    # vLLM applies a constraint from the first token it generates: after a local prefix it would start over.
    continues_constrained = False
    # generate() sends text as a chat turn; a /v1/completions request through the cascade is answered locally.
    takes_raw_prompts = False

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float | None = None):
        self.base_url = base_url.rstrip("/")
        self.root = server_root(self.base_url)
        self.traits: ServerTraits | None = None  # what discover() learnt; None: not yet
        self.timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http: httpx.AsyncClient | None = None
        self._default_model: str | None = None

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)  # reads wait for tokens: timeout_s bounds them
            self._http = httpx.AsyncClient(headers=self._headers, timeout=timeout)
        return self._http

    # Until discover() has run, both are True: a runner configured to continue can be built before the
    # server is up, and a request that needs either makes the cascade discover first (a server it cannot
    # reach then fails the call itself, which the breaker counts).
    @property
    def supports_continuation(self) -> bool:
        return self.traits is None or self.traits.takes_token_prompts

    @property
    def takes_grammars(self) -> bool:
        return self.traits is None or self.traits.takes_grammars

    async def discover(self, *, timeout_s: float | None = None) -> None:
        """GET {root}/version, once it answers: vLLM or a plain OpenAI-compatible server (sdk.cloud.vllm_wire).
        A server that cannot be reached raises the mapped CloudError and stays undiscovered (asked again next time)."""
        if self.traits is not None:
            return
        timeout_s = self._timeout(timeout_s) or DISCOVER_TIMEOUT_S
        with self._mapped_errors(timeout_s):
            response = await until(self.http.get(f"{self.root}/version"), deadline_at(timeout_s))
        self.traits = traits_from_version(response.status_code, response.content)

    async def tokenize(self, texts: Sequence[str], *, timeout_s: float | None = None) -> list[list[int]] | None:
        """The cloud tokenizer's ids for each text (POST {root}/tokenize), or None when the server has
        no /tokenize or cannot be asked now."""
        try:
            await self.discover(timeout_s=timeout_s)
        except CloudError:
            return None
        if not self.traits.takes_token_prompts:
            return None
        timeout_s = self._timeout(timeout_s)
        deadline = deadline_at(timeout_s)
        try:
            with self._mapped_errors(timeout_s):
                model = await self._first_model(deadline)
                return [await self._token_ids(tokenize_text_body(model, text), deadline) for text in texts]
        except CloudError:
            return None

    async def _token_ids(self, body: dict, deadline: float | None) -> list[int]:
        response = await until(self.http.post(f"{self.root}/tokenize", json=body), deadline)
        if response.status_code != 200:
            raise error_from_response(response.status_code, response.headers, response.content, self.root)
        try:
            return token_ids_of(response.json())
        except ValueError as error:
            raise CloudError(f"{self.root}/tokenize: {error}", CloudStatus.INTERNAL) from None

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        model: str = "",
        request_id: str = "",
        continuation_token_ids: Sequence[int] = (),
        priority: int = 0,
        timeout_s: float | None = None,
    ) -> AsyncIterator[CloudTokenEvent]:
        """Stream the answer to a prompt: text (one user message) or chat messages.

        model "" takes the first model the server lists. params None takes the server's
        defaults. priority is sent only when non-zero (a vLLM extension). Closing the
        iterator early closes the HTTP response, which aborts the request on the server.
        """
        messages = chat_messages(prompt)
        timeout_s = self._timeout(timeout_s)
        deadline = deadline_at(timeout_s)
        grammar = params is not None and params.structured is not None and params.structured.kind == "lark"
        if continuation_token_ids or grammar:  # what only vLLM takes: ask the server what it is (once)
            await self.discover(timeout_s=timeout_s)
        if continuation_token_ids and not self.traits.takes_token_prompts:
            raise CloudInvalidArgumentError(
                f"the cloud at {self.base_url} cannot continue from token ids (only a vLLM server can); "
                "use handoff = restart",
                CloudStatus.INVALID_ARGUMENT,
                param="handoff",
            )
        # JSON constraints go as response_format until the server is known: vLLM takes that too.
        vllm = self.traits is not None and self.traits.takes_grammars
        headers = {"X-Request-Id": request_id_header(request_id)} if request_id else {}
        with self._mapped_errors(timeout_s):
            model = model or await self._first_model(deadline)
            body, path = request_body(messages, params, model, priority, vllm=vllm), "/chat/completions"
            if continuation_token_ids:  # the cloud's own chat template, then the local answer's tokens
                prompt_ids = await self._token_ids(tokenize_chat_body(model, messages), deadline)
                body, path = completions_body(body, prompt_ids + list(continuation_token_ids)), "/completions"
            request = self.http.build_request("POST", f"{self.base_url}{path}", json=body, headers=headers)
            response = await until(self.http.send(request, stream=True), deadline)
            try:
                if response.status_code != 200:
                    content = await until(response.aread(), deadline)
                    raise error_from_response(response.status_code, response.headers, content, self.base_url)
                chunks = ChunkStream(request_id)
                async with contextlib.aclosing(sse_data(response, deadline)) as stream:
                    async for data in stream:
                        if data == "[DONE]":
                            break
                        event = _checked(chunks.feed, parse_data(data))
                        if event is not None:
                            yield event
                yield _checked(chunks.finish)
            finally:
                await response.aclose()  # mid-stream: drops the connection, so the server aborts

    async def list_models(self, timeout_s: float | None = None) -> list[CloudModel]:
        """GET {base_url}/models; max_model_len from the card's (vLLM/tandem) field, else 0; the
        vocabulary fingerprint from tandem's."""
        timeout_s = self._timeout(timeout_s)
        with self._mapped_errors(timeout_s):
            response = await self._get("/models", deadline_at(timeout_s))
        try:
            cards = response.json()["data"]
            return [
                CloudModel(
                    str(card["id"]), int(card.get("max_model_len") or 0), str(card.get("vocabulary_fingerprint") or "")
                )
                for card in cards
            ]
        except (ValueError, KeyError, TypeError):
            raise CloudUnavailableError(
                f"{self.base_url}/models did not answer with an OpenAI model list", CloudStatus.UNAVAILABLE
            ) from None

    async def health(self, timeout_s: float | None = None) -> str:
        """Returns "SERVING" when GET {base_url}/models answers 200; otherwise raises the mapped CloudError."""
        timeout_s = self._timeout(timeout_s)
        with self._mapped_errors(timeout_s):
            await self._get("/models", deadline_at(timeout_s))
        return "SERVING"

    async def _first_model(self, deadline: float | None) -> str:
        if self._default_model is None:
            response = await self._get("/models", deadline)
            try:
                # The first chat model: a card of type "embeddings" (tandem's, LM Studio's) cannot answer chat.
                cards = response.json()["data"]
                self._default_model = str(next(card["id"] for card in cards if card.get("type", "llm") != "embeddings"))
            except (ValueError, KeyError, StopIteration, TypeError, AttributeError):
                raise CloudUnavailableError(
                    f"{self.base_url}/models lists no model to send requests to", CloudStatus.UNAVAILABLE
                ) from None
        return self._default_model

    async def _get(self, path: str, deadline: float | None) -> httpx.Response:
        response = await until(self.http.get(f"{self.base_url}{path}"), deadline)
        if response.status_code != 200:
            raise error_from_response(response.status_code, response.headers, response.content, self.base_url)
        return response

    @contextlib.contextmanager
    def _mapped_errors(self, timeout_s: float | None):
        try:
            yield
        except httpx.TransportError as error:
            raise error_from_transport(error, self.base_url) from None
        except httpx.DecodingError as error:  # a body its Content-Encoding cannot decode
            raise CloudError(
                f"the cloud at {self.base_url} sent an undecodable body: {error}", CloudStatus.INTERNAL
            ) from None
        except _TIMEOUT_ERRORS:
            raise deadline_error(timeout_s) from None

    def _timeout(self, timeout_s: float | None) -> float | None:
        return self.timeout_s if timeout_s is None else timeout_s


def request_id_header(request_id: str) -> str:
    """X-Request-Id as a UUID: llama-cpp-python's server refuses any other value with a bare 400
    (vLLM takes anything). tandem's ids end in a uuid4's hex (chatcmpl-<32 hex>), which becomes
    that UUID, so logs on both sides still match; any other id maps to a stable uuid5 of itself."""
    tail = request_id.rsplit("-", 1)[-1]
    if len(tail) == 32:
        try:
            return str(uuid.UUID(hex=tail))
        except ValueError:
            pass
    return str(uuid.uuid5(uuid.NAMESPACE_URL, request_id))


def _checked(read, *args) -> CloudTokenEvent | None:
    """ChunkStream's event for a chunk; a chunk of the wrong shape is the cloud's error
    (INTERNAL, like malformed JSON), never a TypeError escaping to the caller."""
    try:
        event = read(*args)
        if event is not None and not (
            isinstance(event.text, str) and isinstance(event.finish_reason, (str, type(None)))
        ):
            raise TypeError(f"text {event.text!r}, finish_reason {event.finish_reason!r}")
        return event
    except CloudError:
        raise
    except _SHAPE_ERRORS as error:
        raise CloudError(f"the cloud sent a stream chunk of the wrong shape: {error}", CloudStatus.INTERNAL) from None
