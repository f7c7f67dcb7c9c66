"""/openapi.json describes the real request and response bodies, and agrees with the validation:
every body the document allows validates (no mismatch), and a property-based fuzzer driven by the
document finds no 5xx on a live server (bounded: small max_tokens, a fixed number of examples)."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.app_helpers import make_app
from sdk.protocol.engine import EngineProtocol, EngineStats, InvalidRequestError
from sdk.protocol.openai_schema import ChatCompletionRequest, CompletionRequest
from sdk.protocol.openai_schema.responses_api import ResponseCreateRequest
from tests.schema_strategies import from_schema


class _IdleEngine(EngineProtocol):
    model_name, max_model_len, is_ready = "m", 64, True

    def stats(self) -> EngineStats:
        return EngineStats(*([0] * 8))


SPEC = make_app(_IdleEngine()).openapi()


def body_schema(path: str) -> dict:
    """The request body schema of `path`, with the components its $refs point into."""
    ref = SPEC["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return {**ref, "components": SPEC["components"]}


def test_every_endpoint_documents_its_bodies():
    for path in ("/v1/chat/completions", "/v1/completions"):
        operation = SPEC["paths"][path]["post"]
        assert operation["requestBody"]["required"] is True
        assert set(operation["responses"]) >= {"200", "400", "404", "503"}
        assert "text/event-stream" in operation["responses"]["200"]["content"]
    chat = SPEC["components"]["schemas"]["ChatCompletionRequest"]
    assert {"messages", "model", "temperature", "logit_bias", "min_tokens"} <= set(chat["properties"])
    assert "messages" in chat["required"]
    assert "tandem" in SPEC["components"]["schemas"]["ChatCompletionResponse"]["properties"]
    refusals = SPEC["components"]["schemas"]["CompletionRequest"]["x-tandem-refusals"]
    assert {"echo", "suffix", "best_of", "stream_options"} <= set(refusals)


def test_the_document_lists_the_declared_routes_the_server_mounted():
    from sdk.openai_server.routes import ROUTES

    plain = {route.path.replace(":path", "") for route in ROUTES if route.needs is None}
    assert plain <= set(SPEC["paths"]) and "/v1/feedback" not in SPEC["paths"]  # no cascade: no feedback route
    assert "/v1/budget" not in SPEC["paths"] and "/v1/embeddings" not in SPEC["paths"]
    for route in ROUTES:
        if route.needs is None and route.answer is not None:
            operation = SPEC["paths"][route.path.replace(":path", "")][route.method.lower()]
            assert operation["summary"] == route.summary and "200" in operation["responses"]
            assert ("requestBody" in operation) == (route.body is not None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_whatever_the_document_allows_validates(data):
    bodies = (
        ("/v1/chat/completions", ChatCompletionRequest),
        ("/v1/completions", CompletionRequest),
        ("/v1/responses", ResponseCreateRequest),
    )
    for path, model in bodies:
        body = data.draw(from_schema(body_schema(path)), label=path)
        try:
            model.model_validate_json(
                json.dumps(body)
            )  # a ValidationError is a mismatch between document and validation
        except InvalidRequestError as refused:
            # A validator's refusal is no mismatch when the document states its rule.
            assert refused.param in SPEC["components"]["schemas"][model.__name__]["x-tandem-refusals"], refused


def _bounded(body: dict, model: str) -> dict:
    """A generated chat body made cheap to answer: the served model, 2 tokens, one choice."""
    body = {**body, "model": model, "max_tokens": 2}
    body.pop("max_completion_tokens", None)
    body["n"] = 1
    return body


@pytest.mark.slow
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(body=from_schema(body_schema("/v1/chat/completions")), model=st.sampled_from(["smollm2-135m-instruct", "auto"]))
def test_the_document_driven_fuzzer_finds_no_5xx(server_url, body, model):
    reply = httpx.post(f"{server_url}/v1/chat/completions", json=_bounded(body, model), timeout=120)
    assert reply.status_code < 500, reply.text[:1000]
    if reply.status_code != 200:
        error = reply.json()["error"]
        assert error["message"] and error["type"], error


@pytest.mark.slow
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(body=from_schema(body_schema("/v1/responses")), model=st.sampled_from(["smollm2-135m-instruct", "auto"]))
def test_the_document_driven_fuzzer_finds_no_5xx_on_responses(server_url, body, model):
    bounded = {**body, "model": model, "max_output_tokens": 2}
    reply = httpx.post(f"{server_url}/v1/responses", json=bounded, timeout=120)
    assert reply.status_code < 500, reply.text[:1000]
    if reply.status_code != 200:
        error = reply.json()["error"]
        assert error["message"] and error["type"], error


def test_every_path_parameter_is_declared():
    """An undeclared `{name}` makes the document invalid (an outside fuzzer stops at it): GET and DELETE
    /v1/responses/{response_id} and /v1/models/{model} each declare theirs, required, a string."""
    import re

    for path, operations in SPEC["paths"].items():
        names = re.findall(r"\{(\w+)\}", path)
        for method, operation in operations.items():
            declared = {p["name"]: p for p in operation.get("parameters", []) if p["in"] == "path"}
            assert set(declared) == set(names), (method, path, declared)
            assert all(p["required"] and p["schema"]["type"] == "string" for p in declared.values())
    assert [p["name"] for p in SPEC["paths"]["/v1/responses/{response_id}"]["delete"]["parameters"]] == ["response_id"]


def test_the_documented_bounds_of_a_stored_response():
    """metadata, user and text.format.name state OpenAI's bounds in the document (what the validator refuses)."""
    body = SPEC["components"]["schemas"]["ResponseCreateRequest"]["properties"]
    metadata = body["metadata"]
    assert (metadata["maxProperties"], metadata["propertyNames"]["maxLength"]) == (16, 64)
    assert metadata["additionalProperties"]["maxLength"] == 512 and body["user"]["maxLength"] == 64


def test_schemathesis_finds_no_schema_error_in_the_document(tmp_path):
    """schemathesis (an outside fuzzer) over /openapi.json of a server with stored responses: no schema
    error (it reads every operation's parameters and bodies) and no 5xx on a few examples each."""
    import os
    import subprocess
    import sys

    from sdk.response_store.sqlite_store import SQLiteResponseStore
    from tests.conftest import served_in_thread
    from tests.sdk.test_openai_server import FakeEngine

    app = make_app(FakeEngine(), response_store=SQLiteResponseStore(tmp_path / "responses.sqlite3"))
    with served_in_thread(app) as url:
        command = [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json", "--checks"]
        command += ["not_a_server_error", "--max-examples", "5", "--seed", "1", "--suppress-health-check", "all"]
        env = os.environ | {"NO_COLOR": "1"}
        # Run where its files (.schemathesis/) land in the test's directory, not the checkout.
        ran = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    report = ran.stdout + ran.stderr
    assert "Schema Error" not in report and "Tested: 11" in report, report[-4000:]
    assert ran.returncode == 0, report[-4000:]
