"""response_format over HTTP on `tandem serve`'s local model, with the official openai client:
`chat.completions.parse` with a pydantic model, streaming, /v1/completions, and the routed
models (the embedded cloud engine constrains with the same grammar module)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from pydantic import BaseModel

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "Give the name and the age of a fictional person as JSON."}]


class Person(BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def client(server_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_parse_with_a_pydantic_model_gets_a_parsed_object(client):
    completion = client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Person, max_tokens=60, seed=1)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Person) and choice.message.parsed.name


def test_a_streamed_json_schema_answer_assembles_into_valid_json(client):
    schema = {"name": "colour", "schema": {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
                                           "required": ["colour"], "additionalProperties": False}}  # fmt: skip
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, stream=True, max_tokens=40, seed=2,
                                                 response_format={"type": "json_schema", "json_schema": schema}))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert json.loads(text)["colour"] in {"red", "green", "blue"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_completions_take_response_format_too(client):
    reply = client.completions.create(model=MODEL, prompt="A person as JSON: ", max_tokens=60, seed=3,
                                      extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                          "name": "p", "schema": Person.model_json_schema()}}})  # fmt: skip
    assert reply.choices[0].finish_reason == "stop"
    Person.model_validate_json(reply.choices[0].text)


@pytest.mark.parametrize("model", ["auto", "cloud"])
def test_routed_models_constrain_on_whichever_tier_answers(client, model):
    """"cloud": the embedded cloud engine masks with the same grammar module; "auto": the local
    answer, or the cloud's after an escalation (either way the answer fits)."""
    for stream in (False, True):
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=ASK, max_tokens=60, seed=4, stream=stream,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": Person.model_json_schema()}},
        )  # fmt: skip
        reply = raw.parse()
        if stream:
            chunks = list(reply)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            tandem = chunks[-1].model_extra["tandem"]
        else:
            text, finish, tandem = reply.choices[0].message.content, [reply.choices[0].finish_reason], reply.model_extra["tandem"]
        assert finish == ["stop"], text
        Person.model_validate_json(text)
        if model == "cloud":
            assert tandem["tier"] == "cloud"


def test_a_schema_llguidance_cannot_take_is_a_400(server_url):
    format_ = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"$ref": "#/nowhere"}}}
    reply = httpx.post(f"{server_url}/v1/chat/completions", json={"model": MODEL, "messages": ASK, "response_format": format_},
                       timeout=60)  # fmt: skip
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "response_format", reply.text


def test_a_local_answer_cut_off_by_max_tokens_escalates_as_invalid_structure(client):
    """Six tokens cannot hold the object: the local answer cannot parse, so the cascade hands it to
    the cloud before any byte reached the client (restart mode holds the tokens until decided)."""
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=ASK, max_tokens=6, seed=7,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": Person.model_json_schema()}},
    )  # fmt: skip
    tandem = raw.parse().model_extra["tandem"]
    assert (tandem["escalated"], tandem["reason"], tandem["tier"]) == (True, "invalid_structure", "cloud"), tandem
