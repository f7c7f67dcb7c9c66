"""tools / tool_choice over HTTP on `tandem serve` (the embedded SmolLM2 and its embedded cloud
engine), with the official openai client: tool_calls whole and streamed (the client's stream
helper assembles them), the multi-turn tool loop, parallel_tool_calls, and the routed models."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
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
CONVERT = {
    "type": "function",
    "function": {
        "name": "convert_currency",
        "description": "Convert an amount of money from one currency to another",
        "parameters": {
            "type": "object",
            "properties": {
                "amount": {"type": "number"},
                "from_currency": {"type": "string", "maxLength": 3},
                "to_currency": {"type": "string", "maxLength": 3},
            },
            "required": ["amount", "from_currency", "to_currency"],
        },
    },
}
TOOLS = [WEATHER, CONVERT]
ASK = [{"role": "user", "content": "What's the weather like in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def client(server_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_a_required_call_comes_back_as_tool_calls(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=80, seed=1
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert (
        call.type == "function"
        and call.id.startswith("call_")
        and call.function.name in {"get_weather", "convert_currency"}
    )
    json.loads(call.function.arguments)  # valid JSON, fitting the function's parameters (the grammar)


def test_a_named_function_streams_and_the_client_assembles_it(client):
    with client.chat.completions.stream(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=80, seed=2
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)


def test_the_tool_loop_answers_from_the_tools_result(client):
    first = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=80, seed=3
    )
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {
            "role": "tool",
            "tool_call_id": call.id,
            "content": json.dumps({"city": "Paris", "sky": "sunny", "celsius": 24}),
        },
    ]
    second = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=60, temperature=0
    )
    choice = second.choices[0]
    assert choice.message.tool_calls is None and choice.message.content
    assert "24" in choice.message.content or "sunny" in choice.message.content.lower(), choice.message.content


def test_parallel_tool_calls_false_allows_one_call(client):
    reply = client.chat.completions.create(
        model=MODEL,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        messages=[{"role": "user", "content": "Weather in Paris and in Rome?"}],
        max_tokens=80,
        seed=4,
    )
    assert reply.choices[0].finish_reason == "tool_calls" and len(reply.choices[0].message.tool_calls) == 1


@pytest.mark.parametrize("model", ["auto", "cloud"])
def test_routed_models_call_tools_too(client, model):
    """ "auto": tool_choice auto goes to the cloud (the tool-call policy), required stays local;
    "cloud": the embedded cloud engine constrains with the same grammar."""
    for tool_choice, tier in (("required", "cloud" if model == "cloud" else "local"), (NAMED, None)):
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=ASK, tools=TOOLS, tool_choice=tool_choice, max_tokens=80, seed=5
        )
        reply = raw.parse()
        assert reply.choices[0].finish_reason == "tool_calls", reply.choices[0].message.content
        json.loads(reply.choices[0].message.tool_calls[0].function.arguments)
        if tier is not None:
            assert reply.model_extra["tandem"]["tier"] == tier
    reply = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=80, seed=6)
    assert reply.model_extra["tandem"]["tier"] == "cloud"  # tool_choice auto: the cloud's turn
    if model == "auto":
        assert reply.model_extra["tandem"]["reason"] == "tool_calls"


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"functions": [WEATHER["function"]]}, "functions"),
    ],
)
def test_bad_tool_requests_are_400s_naming_the_field(server_url, body, param):
    for model in (MODEL, "auto"):
        reply = httpx.post(
            f"{server_url}/v1/chat/completions", json={"model": model, "messages": ASK, **body}, timeout=60
        )
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text


def test_a_tool_result_with_personal_data_keeps_the_turn_on_the_device(client):
    """Privacy rules read the rendered conversation, tool arguments and results included: an email
    address in a tool's result keeps even a tool_choice auto turn (otherwise the cloud's) local."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny. Report sent to jane.doe@example.com"},
    ]
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=history, tools=TOOLS, max_tokens=30, seed=8
    )
    tandem = raw.parse().model_extra["tandem"]
    assert (tandem["tier"], tandem["reason"]) == ("local", "private") and tandem["privacy_reasons"], tandem
