"""POST /v1/embeddings (tandem serve): OpenAI's embeddings over all-MiniLM-L6-v2 (sdk.embeddings)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from sdk.openai_server.errors import OpenAIError, from_exception
from sdk.openai_server.serving import ServerState, parse_body
from sdk.protocol.engine import InvalidRequestError
from sdk.protocol.openai_schema.embeddings import EmbeddingRequest, EmbeddingResponse


async def create_embeddings(request: Request) -> Response:
    state: ServerState = request.app.state.tandem
    try:
        body = await parse_body(request, EmbeddingRequest)
        service = state.embeddings
        if service is None:
            raise OpenAIError(
                404, "this server has no embedding model (tandem serve has one: all-MiniLM-L6-v2)", code="not_found"
            )
        model = body.model or service.model_id
        if model != service.model_id:
            if model in state.model_names:
                raise InvalidRequestError(
                    f"{model!r} is a chat model; embeddings come from {service.model_id!r}", "model"
                )
            raise OpenAIError(
                404,
                f"The model `{model}` does not exist; embeddings come from `{service.model_id}`.",
                param="model",
                code="model_not_found",
            )
        result = await service.embed(body.texts, bool(body.truncate))
    except Exception as exc:
        return from_exception(exc).response()
    answer = EmbeddingResponse.of(
        result.vectors, result.num_tokens, model, body.encoding_format or "float", body.ignored_fields
    )
    return Response(answer.model_dump_json(exclude_none=True), media_type="application/json")
