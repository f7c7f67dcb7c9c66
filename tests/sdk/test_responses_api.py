"""POST /v1/responses (OpenAI's Responses API): the body read into the chat request tandem runs,
refusals naming the field, the answer and its stream of semantic events through the official
`openai` client, on a fake engine (fast), then on a real `tandem serve`: the local model's own
name and `auto`, a function tool round trip, `parse` with a pydantic model, a cut at
max_output_tokens."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from pydantic import BaseModel

from tests.app_helpers import make_app
from sdk.protocol.engine import InvalidRequestError
from sdk.protocol.openai_schema import ChatCompletionRequest
from sdk.protocol.openai_schema.responses_api import ResponseCreateRequest
from tests.sdk.test_openai_server import FakeEngine

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def chat_of(body: dict) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(ResponseCreateRequest.model_validate(body).chat_payload())


def test_input_items_become_the_chat_conversation():
    chat = chat_of(
        {
            "model": "auto",
            "instructions": "You are terse.",
            "input": [
                {"role": "developer", "content": "Answer in French."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Il fait beau."}]},
            ],
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "max_output_tokens": 20,
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}},
            "include": [],
            "truncation": "disabled",
            "top_k": 5,
        }
    )
    roles = [(m.role, m.content if isinstance(m.content, str) else None) for m in chat.messages]
    assert roles == [
        ("system", "You are terse."),
        ("system", "Answer in French."),  # developer is the system prompt's newer name
        ("user", "Weather in Paris?"),
        ("assistant", None),
        ("tool", "sunny"),
        ("assistant", "Il fait beau."),
    ]
    assert chat.messages[3].tool_calls[0].function.name == "get_weather" and chat.messages[4].tool_call_id == "c1"
    tools = chat.tool_request()
    assert [f.name for f in tools.functions] == ["get_weather"] and tools.required
    assert chat.max_tokens == 20 and chat.top_k == 5  # tandem's extensions pass on as on chat
    assert chat.response_format.json_schema.name == "w" and chat.response_format.json_schema.strict


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "reasoning": {"effort": "low"}}, "reasoning"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "include": ["file_search_call.results"]}, "include"),
        ({"input": "x", "truncation": "auto"}, "truncation"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": "x", "messages": [{"role": "user", "content": "x"}]}, "messages"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0]"),
        ({"input": []}, "input"),
    ],
)
def test_what_tandem_cannot_give_is_refused_naming_it(body, param):
    with pytest.raises(InvalidRequestError) as refused:
        chat_of(body)
    assert refused.value.param == param


def fake_client(engine: FakeEngine) -> tuple[openai.AsyncOpenAI, httpx.AsyncClient]:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=make_app(engine)), base_url="http://test")
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0), http


async def test_an_answer_and_its_stream_through_the_openai_client():
    client, http = fake_client(FakeEngine(words=("Hello", " world", "!")))
    whole = await client.responses.create(model="fake", input="Hi", instructions="Be brief.", metadata={"k": "v"})
    assert whole.object == "response" and whole.output_text == "Hello world!"
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"  # the fake's finish
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (3, 3)
    assert whole.instructions == "Be brief." and whole.metadata == {"k": "v"}
    kinds, deltas = [], []
    async with client.responses.stream(model="fake", input=[{"role": "user", "content": "Hi"}]) as stream:
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
    assert deltas == ["Hello", " world", "!"]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    raw = await http.post("/v1/responses", json={"model": "fake", "input": "Hi", "stream": True})
    events = [block for block in raw.text.split("\n\n") if block]
    numbers = [json.loads(block.split("data: ", 1)[1])["sequence_number"] for block in events]
    assert numbers == list(range(len(events))) and all(block.startswith("event: ") for block in events)


async def test_a_refusal_is_openai_error_json():
    client, http = fake_client(FakeEngine())
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="fake", input="x", reasoning={"effort": "low"})
    assert refused.value.body["param"] == "reasoning" and "do not reason" in refused.value.body["message"]
    missing = await http.post("/v1/responses", json={"model": "nope", "input": "x"})
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    stored = await http.post("/v1/responses", json={"model": "fake", "input": "x", "previous_response_id": "resp_1"})
    assert stored.status_code == 400 and stored.json()["error"]["param"] == "previous_response_id"


# ---------------------------------------------------------------------------------------------- a real server


class Colour(BaseModel):
    name: str
    warm: bool


@pytest.fixture(scope="module")
def client(server_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "auto"])
def test_a_real_answer_stream_and_parse(client, model):
    whole = client.responses.create(model=model, input="What is 2+2? Answer with a number.", max_output_tokens=16)
    assert whole.output_text.strip() and whole.usage.output_tokens >= 1
    assert whole.status in ("completed", "incomplete")
    with client.responses.stream(model=model, input="Name a colour.", max_output_tokens=8) as stream:
        streamed = "".join(event.delta for event in stream if event.type == "response.output_text.delta")
    assert streamed.strip()
    parsed = client.responses.parse(
        model=model, input="Describe the colour red as JSON.", text_format=Colour, max_output_tokens=64
    )
    assert isinstance(parsed.output_parsed, Colour)  # the schema's grammar held the answer to it
    if model == "auto":
        assert whole.model_extra["tandem"]["tier"] in ("local", "cloud")


@pytest.mark.slow
def test_a_streamed_escalation_says_the_cloud_answered(client):
    """auto:1 escalates every request: the cascade's stream, rendered as the Responses events, ends with the
    whole response, whose `tandem` names the tier that answered; a private one stays on the device, unstored."""
    with client.responses.stream(model="auto:1", input="Name a colour.", max_output_tokens=8) as stream:
        events = list(stream)
    final = events[-1].response
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert final.model_extra["tandem"]["tier"] == "cloud" and final.model_extra["tandem"]["escalated"]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == final.output_text
    kept = client.responses.create(
        model="auto:1", input="Name a colour.", max_output_tokens=8, extra_body={"private": True}
    )
    assert kept.model_extra["tandem"]["tier"] == "local" and not kept.store
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)


@pytest.mark.slow
def test_a_real_function_tool_round_trip(client):
    asked = client.responses.create(
        model="smollm2-135m-instruct",
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64,
    )
    [call] = [item for item in asked.output if item.type == "function_call"]
    assert call.name == "get_weather" and "city" in json.loads(call.arguments)
    answered = client.responses.create(
        model="smollm2-135m-instruct",
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24 C"},
        ],
        tools=[WEATHER_TOOL],
        max_output_tokens=32,
    )
    assert answered.output_text.strip() or any(item.type == "function_call" for item in answered.output)


@pytest.mark.slow
def test_a_real_conversation_continues_by_previous_response_id(client):
    """Two turns by previous_response_id on the real model, the stored response read and deleted, and a
    cut at max_output_tokens stored as incomplete."""
    first = client.responses.create(
        model="smollm2-135m-instruct", input="My name is Ada. Say hello to me.", max_output_tokens=24
    )
    second = client.responses.create(
        model="auto", input="What is my name?", previous_response_id=first.id, max_output_tokens=24
    )
    assert second.previous_response_id == first.id and second.output_text.strip()
    assert second.usage.input_tokens > first.usage.input_tokens  # the first turn is in the second's prompt
    cut = client.responses.create(model="smollm2-135m-instruct", input="Count to fifty.", max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert client.responses.retrieve(cut.id).status == "incomplete"
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


@pytest.mark.slow
async def test_an_agents_sdk_agent_runs_to_its_final_output(server_url):
    """The Agents SDK's default model (the Responses API) given a tandem model name, tracing off: an agent with
    one function tool calls it through tandem and finishes, and an agent without tools answers in text.

    The tool agent stops on its first tool call (`stop_on_first_tool`, its output the final one): given the
    tool's result, SmolLM2-135M calls the tool again rather than answer (seen: three turns of the same call),
    which is the model's choice, not the protocol's; the second agent covers a final answer in text."""
    from agents import Agent, ModelSettings, RunConfig, Runner, function_tool
    from agents.models.openai_provider import OpenAIProvider

    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"It is sunny and 24 C in {city}."

    client = openai.AsyncOpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=120)
    run_config = RunConfig(
        model_provider=OpenAIProvider(openai_client=client, use_responses=True), tracing_disabled=True
    )
    weather = Agent(
        name="weather",
        instructions="You answer questions about the weather with the get_weather tool.",
        tools=[get_weather],
        model="smollm2-135m-instruct",
        model_settings=ModelSettings(tool_choice="get_weather", max_tokens=64),
        tool_use_behavior="stop_on_first_tool",
    )
    result = await Runner.run(weather, "What is the weather in Paris?", max_turns=2, run_config=run_config)
    assert asked and result.final_output == f"It is sunny and 24 C in {asked[0]}."
    assert result.raw_responses[0].response_id.startswith("resp_")  # tandem's response, read by the SDK
    # Greedy, with room to finish: the SDK refuses an answer cut at max_output_tokens (status incomplete).
    settings = ModelSettings(max_tokens=160, temperature=0.0)
    plain = Agent(
        name="plain",
        instructions="Answer in one short sentence.",
        model="smollm2-135m-instruct",
        model_settings=settings,
    )
    answered = await Runner.run(plain, "What colour is the sky on a clear day?", max_turns=1, run_config=run_config)
    assert isinstance(answered.final_output, str) and answered.final_output.strip()


async def test_item_fields_are_listed_when_ignored_and_refused_under_strict_fields():
    """Replayed output items carry their id and status (the Agents SDK sends them): they ask for nothing. Any
    other item field is listed in tandem.ignored_fields, or refused under --strict-fields."""
    items = [
        {"type": "message", "role": "user", "content": "Hi", "id": "msg_1", "status": "completed"},
        {"role": "user", "content": "Hello", "colour": "red"},
    ]
    _, http = fake_client(FakeEngine())
    answered = await http.post("/v1/responses", json={"model": "fake", "input": items})
    assert answered.status_code == 200 and answered.json()["tandem"]["ignored_fields"] == ["input[1].colour"]
    strict = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=make_app(FakeEngine(), strict_fields=True)), base_url="http://test"
    )
    refused = await strict.post("/v1/responses", json={"model": "fake", "input": items})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input[1].colour"
    replayed = await strict.post("/v1/responses", json={"model": "fake", "input": items[:1]})
    assert replayed.status_code == 200
