"""/openapi.json with the real bodies, from the routes' declarations (sdk.openai_server.routes): the
handlers validate raw bodies themselves (strict types, OpenAI-shaped 400s), so FastAPI cannot see
their models; this adds each route's request body, its 200 (JSON, or SSE when `stream` is true) and
its error shape."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fastapi import FastAPI
from pydantic import BaseModel

from sdk.protocol.openai_schema import ErrorResponse

if TYPE_CHECKING:
    from sdk.openai_server.routes import Route

_ERRORS = {
    "400": "invalid request (the error names the field)",
    "401": "missing or wrong API key",
    "404": "unknown model",
    "413": "body too large",
    "429": "rate or in-flight limit",
    "503": "overloaded or still loading (Retry-After)",
}


def install_openapi(app: FastAPI, routes: Sequence[Route]) -> None:
    """Replace app.openapi with one that documents the mounted routes' bodies and answers (built once, then cached)."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = generate()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for route in routes:
                operation = schema["paths"][_openapi_path(route.path)][route.method.lower()]
                _declare_path_parameters(operation, route.path)
                if route.answer is not None:
                    _document(operation, route, components)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def _document(operation: dict, route: Route, components: dict) -> None:
    if route.body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _component(components, route.body, "validation")}},
        }
    ok = {"application/json": {"schema": _component(components, route.answer, "serialization")}}
    if route.body is not None and "stream" in route.body.model_fields:
        ok["text/event-stream"] = {
            "schema": {
                "type": "string",
                "description": route.stream_doc,
            }
        }
    operation["responses"] = {"200": {"description": "the answer", "content": ok}}
    error = {"application/json": {"schema": _component(components, ErrorResponse, "serialization")}}
    errors = {**_ERRORS, "404": route.not_found}
    operation["responses"].update({code: {"description": why, "content": error} for code, why in errors.items()})


def _declare_path_parameters(operation: dict, path: str) -> None:
    """Each `{name}` of the path as a required string parameter: the handlers read them from the request,
    so FastAPI, which only sees typed arguments, declares none (and a path with an undeclared one is invalid)."""
    names = re.findall(r"\{(\w+)(?::\w+)?\}", path)
    declared = {parameter["name"] for parameter in operation.get("parameters", []) if parameter.get("in") == "path"}
    operation.setdefault("parameters", []).extend(
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in names
        if name not in declared
    )
    if not operation["parameters"]:
        del operation["parameters"]


def _openapi_path(path: str) -> str:
    """The path as OpenAPI spells it: Starlette's converters dropped ("{model:path}" -> "{model}")."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", path)


def _component(components: dict, model: type[BaseModel], mode: str) -> dict:
    """Register `model` (and the models it uses) as components; a $ref to it."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}", mode=mode)
    components.update(schema.pop("$defs", {}))
    components[model.__name__] = schema
    return {"$ref": f"#/components/schemas/{model.__name__}"}
