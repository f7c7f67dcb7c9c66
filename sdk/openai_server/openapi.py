"""/openapi.json with the real bodies: the handlers validate raw bodies themselves (strict types,
OpenAI-shaped 400s), so FastAPI cannot see their models; this adds each endpoint's request body,
its 200 (JSON, or SSE when `stream` is true) and its error shape from the one schema."""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel

from sdk.protocol.openai_schema import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelList,
)
from sdk.protocol.openai_schema.embeddings import EmbeddingRequest, EmbeddingResponse
from sdk.protocol.openai_schema.feedback import FeedbackRequest, FeedbackResponse
from sdk.protocol.openai_schema.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse

# path -> (method, request body model or None, response model)
DOCUMENTED: dict[str, tuple[str, type[BaseModel] | None, type[BaseModel]]] = {
    "/v1/chat/completions": ("post", ChatCompletionRequest, ChatCompletionResponse),
    "/v1/completions": ("post", CompletionRequest, CompletionResponse),
    "/v1/models": ("get", None, ModelList),
    "/v1/feedback": ("post", FeedbackRequest, FeedbackResponse),  # with a cascade only
    "/v1/embeddings": ("post", EmbeddingRequest, EmbeddingResponse),  # tandem serve
    "/tokenize": ("post", TokenizeRequest, TokenizeResponse),
    "/detokenize": ("post", DetokenizeRequest, DetokenizeResponse),
}
_ERRORS = {"400": "invalid request (the error names the field)", "401": "missing or wrong API key",
           "404": "unknown model", "413": "body too large", "429": "rate or in-flight limit",
           "503": "overloaded or still loading (Retry-After)"}  # fmt: skip


def install_openapi(app: FastAPI) -> None:
    """Replace app.openapi with one that documents DOCUMENTED's bodies (built once, then cached)."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = generate()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for path, (method, request_model, response_model) in DOCUMENTED.items():
                if path not in schema["paths"]:
                    continue  # a route this app does not have (feedback without a cascade)
                operation = schema["paths"][path][method]
                if request_model is not None:
                    operation["requestBody"] = {"required": True, "content": {"application/json": {
                        "schema": _component(components, request_model, "validation")}}}  # fmt: skip
                ok = {"application/json": {"schema": _component(components, response_model, "serialization")}}
                if request_model is not None and "stream" in request_model.model_fields:
                    ok["text/event-stream"] = {"schema": {"type": "string", "description": (
                        "with stream: true, server-sent events: one chunk object per `data:` line "
                        "(the response shape with deltas), then `data: [DONE]`")}}  # fmt: skip
                operation["responses"] = {"200": {"description": "the answer", "content": ok}}
                error = {"application/json": {"schema": _component(components, ErrorResponse, "serialization")}}
                operation["responses"].update({code: {"description": why, "content": error} for code, why in _ERRORS.items()})
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def _component(components: dict, model: type[BaseModel], mode: str) -> dict:
    """Register `model` (and the models it uses) as components; a $ref to it."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}", mode=mode)
    components.update(schema.pop("$defs", {}))
    components[model.__name__] = schema
    return {"$ref": f"#/components/schemas/{model.__name__}"}
