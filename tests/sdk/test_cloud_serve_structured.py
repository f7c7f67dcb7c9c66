"""`tandem cloud serve` on the embedded SmolLM2 (the PyTorch cloud engine hosted as an API): the
official openai client gets schema-valid JSON from `parse` and tool calls, whole and streamed."""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel, Field

from tests.conftest import free_port, running_server

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "What's the weather like in Paris?"}]


class Person(BaseModel):
    name: str = Field(max_length=30)
    age: int = Field(ge=0, le=120)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    args = [
        "cloud",
        "serve",
        "--grpc-port",
        str(free_port()),
        "--max-model-len",
        "512",
        "--kv-cache-gb",
        "0.2",
        "--log-level",
        "warning",
    ]
    with running_server(
        args, tmp_path_factory.mktemp("cloud-serve-structured") / "server.log", "tandem cloud serve"
    ) as (_, url):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_parse_returns_a_valid_object(client):
    model = client.models.list().data[0].id
    reply = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Invent a person with a name and an age."}],
        response_format=Person,
        max_tokens=60,
        seed=1,
    )
    assert reply.choices[0].finish_reason == "stop" and isinstance(reply.choices[0].message.parsed, Person)


def test_tool_calls_whole_and_streamed(client):
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=60, seed=2
    )
    (call,) = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    with client.chat.completions.stream(
        model=model, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=60, seed=3
    ) as stream:
        final = stream.get_final_completion()
    assert (
        final.choices[0].finish_reason == "tool_calls"
        and final.choices[0].message.tool_calls[0].function.name == "get_weather"
    )


def test_loose_json_prompts_close_valid_within_max_tokens(client):
    """Issue 41's prompts (and the local test's own) on the hosted cloud engine: each answer parses
    and ends with "stop" inside max_tokens; the request's opt-out cuts at max_tokens as before."""
    from tests.sdk.test_structured_http import LOOSE_PROMPTS

    model = client.models.list().data[0].id
    for prompt in LOOSE_PROMPTS:
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=80,
            temperature=0,
            response_format={"type": "json_object"},
        )
        assert reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens <= 80, reply.choices[
            0
        ].message.content
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    cut = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": LOOSE_PROMPTS[0]}],
        max_tokens=80,
        temperature=0,
        response_format={"type": "json_object"},
        extra_body={"close_within_max_tokens": False},
    )
    assert (cut.choices[0].finish_reason, cut.usage.completion_tokens) == ("length", 80)
