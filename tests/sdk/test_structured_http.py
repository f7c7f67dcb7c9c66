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
    schema = {
        "name": "colour",
        "schema": {
            "type": "object",
            "properties": {"colour": {"enum": ["red", "green", "blue"]}},
            "required": ["colour"],
            "additionalProperties": False,
        },
    }
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            stream=True,
            max_tokens=40,
            seed=2,
            response_format={"type": "json_schema", "json_schema": schema},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert json.loads(text)["colour"] in {"red", "green", "blue"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_completions_take_response_format_too(client):
    reply = client.completions.create(
        model=MODEL,
        prompt="A person as JSON: ",
        max_tokens=60,
        seed=3,
        extra_body={
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": Person.model_json_schema()},
            }
        },
    )
    assert reply.choices[0].finish_reason == "stop"
    Person.model_validate_json(reply.choices[0].text)


@pytest.mark.parametrize("model", ["auto", "cloud"])
def test_routed_models_constrain_on_whichever_tier_answers(client, model):
    """ "cloud": the embedded cloud engine masks with the same grammar module; "auto": the local
    answer, or the cloud's after an escalation (either way the answer fits)."""
    for stream in (False, True):
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=ASK,
            max_tokens=60,
            seed=4,
            stream=stream,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": Person.model_json_schema()}},
        )
        reply = raw.parse()
        if stream:
            chunks = list(reply)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            tandem = chunks[-1].model_extra["tandem"]
        else:
            text, finish, tandem = (
                reply.choices[0].message.content,
                [reply.choices[0].finish_reason],
                reply.model_extra["tandem"],
            )
        assert finish == ["stop"], text
        Person.model_validate_json(text)
        if model == "cloud":
            assert tandem["tier"] == "cloud"


def test_a_schema_llguidance_cannot_take_is_a_400(server_url):
    format_ = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"$ref": "#/nowhere"}}}
    reply = httpx.post(
        f"{server_url}/v1/chat/completions",
        json={"model": MODEL, "messages": ASK, "response_format": format_},
        timeout=60,
    )
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "response_format", reply.text


def test_a_local_answer_cut_off_by_max_tokens_escalates_as_invalid_structure(client):
    """Six tokens cannot hold the object: the local answer cannot parse, so the cascade hands it to
    the cloud before any byte reached the client (restart mode holds the tokens until decided)."""
    raw = client.chat.completions.with_raw_response.create(
        model="auto",
        messages=ASK,
        max_tokens=6,
        seed=7,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": Person.model_json_schema()}},
    )
    tandem = raw.parse().model_extra["tandem"]
    assert (tandem["escalated"], tandem["reason"], tandem["tier"]) == (True, "invalid_structure", "cloud"), tandem


# Issue 41's four prompts (SmolLM2 ran each to max_tokens adding keys), then four written like them.
LOOSE_PROMPTS = [
    "A JSON object describing a cat.",
    "Return {} with one key.",
    "JSON: today's plan",
    "List two fruits as JSON.",
    "Describe a dog as a JSON object.",
    "A book's details, as JSON.",
    "JSON for a weather report.",
    "Your favourite city as a JSON object.",
]
RECORD = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "year": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["title", "year", "tags"],
}


@pytest.mark.parametrize("model", [MODEL, "auto", "cloud"])
def test_loose_json_prompts_close_valid_within_max_tokens(client, model):
    """Each answer parses and ends with "stop" inside max_tokens, on either tier and through the
    cascade (no invalid_structure escalation: the local answer closed)."""
    for prompt in LOOSE_PROMPTS:
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=80,
            temperature=0,
            response_format={"type": "json_object"},
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "stop" and reply.usage.completion_tokens <= 80, (prompt, choice.message.content)
        assert isinstance(json.loads(choice.message.content), dict)
        assert choice.model_extra["stop_reason"] in (None, "closed_within_max_tokens")
        assert (reply.model_extra.get("tandem") or {}).get("reason") != "invalid_structure"  # routed models only
    schema = {"type": "json_schema", "json_schema": {"name": "record", "schema": RECORD, "strict": True}}
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a film as JSON."}],
        max_tokens=48,
        temperature=0,
        response_format=schema,
    )
    assert reply.choices[0].finish_reason == "stop" and set(json.loads(reply.choices[0].message.content)) == set(
        RECORD["required"]
    )


def test_opting_out_cuts_at_max_tokens_as_before(client):
    """close_within_max_tokens false: the grammar alone, as OpenAI's API (the answer may be cut and
    repeat keys); the closed answer is that answer up to where its closing path began."""
    ask = dict(
        model=MODEL,
        messages=[{"role": "user", "content": LOOSE_PROMPTS[0]}],
        max_tokens=80,
        temperature=0,
        response_format={"type": "json_object"},
    )
    cut = client.chat.completions.create(**ask, extra_body={"close_within_max_tokens": False})
    closed = client.chat.completions.create(**ask)
    assert (cut.choices[0].finish_reason, cut.usage.completion_tokens) == ("length", 80)
    assert (closed.choices[0].finish_reason, closed.choices[0].model_extra["stop_reason"]) == (
        "stop",
        "closed_within_max_tokens",
    )
    text, whole = closed.choices[0].message.content, cut.choices[0].message.content
    common = next((i for i, (a, b) in enumerate(zip(text, whole)) if a != b), min(len(text), len(whole)))
    assert common >= len(text) - 24, (text, whole)  # the model's own text, then at most a short closing path


def test_a_budget_too_small_for_the_schema_still_ends_at_length(client):
    """Six tokens cannot hold {"title": "", "year": 0, "tags": []}: nothing is forced, the answer is
    cut as before and says so (no false claim of completeness)."""
    schema = {"type": "json_schema", "json_schema": {"name": "record", "schema": RECORD}}
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a film as JSON."}],
        max_tokens=6,
        temperature=0,
        response_format=schema,
    )
    assert reply.choices[0].finish_reason == "length" and reply.choices[0].model_extra["stop_reason"] is None
