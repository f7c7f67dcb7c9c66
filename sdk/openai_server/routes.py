"""Every route of the OpenAI-compatible app, declared once: path, method, handler, summary, its typed
body and answer, and what the server must have for it to be mounted. `create_app` mounts them and
/openapi.json documents each from its declaration (sdk.openai_server.openapi).

The handlers read and validate raw bodies themselves (off the event loop when large), so a bad body
gets OpenAI's 400 naming the field, never FastAPI's 422: FastAPI never sees `body`, only the docs do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from fastapi import FastAPI
from pydantic import BaseModel

from sdk.openai_server.budget import get_budget
from sdk.openai_server.chat import create_chat_completion
from sdk.openai_server.completions import create_completion
from sdk.openai_server.embeddings import create_embeddings
from sdk.openai_server.feedback import create_feedback
from sdk.openai_server.health import health, metrics
from sdk.openai_server.model_cards import get_model, list_models
from sdk.openai_server.responses_api import create_response
from sdk.openai_server.serving import ServerState
from sdk.openai_server.stored_responses import delete_response, get_response
from sdk.openai_server.tokenize import create_detokenize, create_tokenize
from sdk.protocol.openai_schema import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
)
from sdk.protocol.openai_schema.embeddings import EmbeddingRequest, EmbeddingResponse
from sdk.protocol.openai_schema.feedback import FeedbackRequest, FeedbackResponse
from sdk.protocol.openai_schema.response_objects import ResponseDeleted, ResponseObject
from sdk.protocol.openai_schema.responses_api import ResponseCreateRequest
from sdk.protocol.openai_schema.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse

Needs = Literal["cascade", "budgets", "embeddings"]


@dataclass(frozen=True)
class Route:
    path: str
    method: Literal["GET", "POST", "DELETE"]
    handler: Callable
    summary: str
    body: type[BaseModel] | None = None  # the JSON request body (documented; the handler validates it)
    answer: type[BaseModel] | None = None  # the 200's JSON (SSE too when the body has `stream`); with the error shapes
    needs: Needs | None = None  # mounted only on a server that has it
    not_found: str = "unknown model"  # what its 404 means (the document says it)
    stream_doc: str = (  # what a 200 with `stream: true` is (the document says it)
        "with stream: true, server-sent events: one chunk object per `data:` line (the response shape with deltas), "
        "then `data: [DONE]`"
    )

    def mounted(self, state: ServerState) -> bool:
        if self.needs == "cascade":
            return state.cascade is not None
        if self.needs == "budgets":
            return state.budgets is not None
        if self.needs == "embeddings":
            return state.embeddings is not None
        return True


ROUTES: tuple[Route, ...] = (
    Route(
        "/v1/chat/completions",
        "POST",
        create_chat_completion,
        "Create a chat completion",
        ChatCompletionRequest,
        ChatCompletionResponse,
    ),
    Route("/v1/completions", "POST", create_completion, "Create a completion", CompletionRequest, CompletionResponse),
    Route(
        "/v1/responses",
        "POST",
        create_response,
        "Create a model response (OpenAI's Responses API)",
        ResponseCreateRequest,
        ResponseObject,
        not_found="unknown model, or no stored response with the previous_response_id for this API key",
        stream_doc="with stream: true, the Responses API's semantic events, each an `event:` line and a `data:` object "
        "with its sequence_number: response.created first, then each output item added, its deltas and done, and "
        "response.completed (response.incomplete when max_output_tokens cut it)",
    ),
    Route(
        "/v1/responses/{response_id}",
        "GET",
        get_response,
        "A stored response (store: true), as it was answered",
        answer=ResponseObject,
        not_found="no stored response with this id for this API key",
    ),
    Route(
        "/v1/responses/{response_id}",
        "DELETE",
        delete_response,
        "Delete a stored response",
        answer=ResponseDeleted,
        not_found="no stored response with this id for this API key",
    ),
    Route(
        "/tokenize",
        "POST",
        create_tokenize,
        "Text or chat messages to token ids (vLLM's shape)",
        TokenizeRequest,
        TokenizeResponse,
    ),
    Route(
        "/detokenize",
        "POST",
        create_detokenize,
        "Token ids to text (vLLM's shape)",
        DetokenizeRequest,
        DetokenizeResponse,
    ),
    Route(
        "/v1/budget", "GET", get_budget, "What the caller's key (and ?user=) has left of its budgets", needs="budgets"
    ),
    Route(
        "/v1/embeddings",
        "POST",
        create_embeddings,
        "Create embeddings",
        EmbeddingRequest,
        EmbeddingResponse,
        needs="embeddings",
    ),
    Route(
        "/v1/feedback",
        "POST",
        create_feedback,
        "Say how right a routed answer was (labels for the router)",
        FeedbackRequest,
        FeedbackResponse,
        needs="cascade",
    ),
    Route("/health", "GET", health, "200 once the model is loaded, 503 before"),
    Route("/v1/models", "GET", list_models, "The models this server answers to", answer=ModelList),
    Route("/v1/models/{model:path}", "GET", get_model, "One served model", answer=ModelCard),
    Route("/metrics", "GET", metrics, "Prometheus metrics"),
)


def mount_routes(app: FastAPI, state: ServerState) -> tuple[Route, ...]:
    """Add the routes this server has to `app`; the ones mounted."""
    mounted = tuple(route for route in ROUTES if route.mounted(state))
    for route in mounted:
        app.add_api_route(route.path, route.handler, methods=[route.method], summary=route.summary)
    return mounted
