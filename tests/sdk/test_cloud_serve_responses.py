"""The Responses API on `tandem cloud serve` with a chat model (the embedded SmolLM2-135M-Instruct, its
template read from the GGUF), through the official `openai` client and two API keys: create, stream,
`parse` with a pydantic model, a function tool, previous_response_id over two turns, GET/DELETE, and
another key's 404. (tests/sdk/test_cloud_serve_cli.py covers a checkpoint without a chat template.)"""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel

from tests.conftest import free_port, running_server

pytestmark = pytest.mark.slow

KEY_A, KEY_B = "sk-cloud-responses-a-0123", "sk-cloud-responses-b-0123"
MODEL = "smollm2-135m-instruct"


class Colour(BaseModel):
    name: str
    warm: bool


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cloud-serve-responses")
    (folder / "keys").write_text(f"{KEY_A}\n{KEY_B}\n")
    args = [
        "cloud",
        "serve",
        "--model-name",
        MODEL,
        "--max-model-len",
        "512",
        "--kv-cache-gb",
        "0.05",
        "--threads",
        "1",
        "--grpc-port",
        str(free_port()),
        "--api-key-file",
        str(folder / "keys"),
        "--log-level",
        "warning",
    ]
    with running_server(args, folder / "server.log", name="tandem cloud serve") as (_, url):
        yield url


def client(base_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=120)


def test_create_stream_and_parse(base_url):
    mine = client(base_url, KEY_A)
    whole = mine.responses.create(model=MODEL, input="What is 2+2? Answer with a number.", max_output_tokens=16)
    assert whole.output_text.strip() and whole.usage.output_tokens >= 1 and whole.store
    with mine.responses.stream(model=MODEL, input="Name a colour.", max_output_tokens=8) as stream:
        events = list(stream)
    streamed = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    # Cut at 8 tokens or not, the last event carries the whole response (the client's get_final_response
    # reads only response.completed, so the test reads the event itself).
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert streamed.strip() and events[-1].response.output_text == streamed
    parsed = mine.responses.parse(
        model=MODEL, input="Describe the colour red as JSON.", text_format=Colour, max_output_tokens=64
    )
    assert isinstance(parsed.output_parsed, Colour)


def test_a_function_tool(base_url):
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    asked = client(base_url, KEY_A).responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[tool],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64,
    )
    [call] = [item for item in asked.output if item.type == "function_call"]
    assert call.name == "get_weather" and "city" in json.loads(call.arguments)


def test_stored_conversations_are_the_keys_own(base_url):
    mine, theirs = client(base_url, KEY_A), client(base_url, KEY_B)
    first = mine.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=16)
    second = mine.responses.create(
        model=MODEL, input="What is my name?", previous_response_id=first.id, max_output_tokens=16
    )
    assert second.usage.input_tokens > first.usage.input_tokens  # the first turn is in the second's prompt
    with pytest.raises(openai.NotFoundError):
        theirs.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.create(model=MODEL, input="x", previous_response_id=first.id)
    assert mine.responses.retrieve(second.id).output_text == second.output_text
    mine.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        mine.responses.retrieve(second.id)
