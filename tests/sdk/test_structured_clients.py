"""The clients apps use, unchanged, against `tandem serve` on the embedded default: LangChain's
ChatOpenAI (bind_tools, with_structured_output), instructor (TOOLS and JSON_SCHEMA modes) and
pydantic-ai with an output_type all get typed results back, not prose."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"


class Weather(BaseModel):
    """Look up the current weather in a city."""

    city: str = Field(max_length=40)


class Person(BaseModel):
    name: str = Field(max_length=30)
    age: int = Field(ge=0, le=120)


ASK_WEATHER = "What's the weather like in Paris?"
ASK_PERSON = "Invent a person: give their name and age."


@pytest.mark.parametrize("model", [MODEL, "auto"])
def test_langchain_bind_tools_and_with_structured_output(server_url, model):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=f"{server_url}/v1", api_key="unused", model=model, max_tokens=80, seed=1, max_retries=0)
    message = llm.bind_tools([Weather], tool_choice="Weather").invoke(ASK_WEATHER)
    (call,) = message.tool_calls
    assert call["name"] == "Weather" and Weather.model_validate(call["args"])
    streamed = None
    for chunk in llm.bind_tools([Weather], tool_choice="required").stream(ASK_WEATHER):
        streamed = chunk if streamed is None else streamed + chunk
    assert [c["name"] for c in streamed.tool_calls] == ["Weather"]
    for method in ("function_calling", "json_schema"):
        person = llm.with_structured_output(Person, method=method).invoke(ASK_PERSON)
        assert isinstance(person, Person), method


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_modes(server_url, mode):
    import instructor
    import openai

    client = instructor.from_openai(
        openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0), mode=getattr(instructor.Mode, mode)
    )
    person = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": ASK_PERSON}],
        response_model=Person,
        max_tokens=200,
        seed=3,
        max_retries=0,
    )
    assert isinstance(person, Person) and person.name


def test_pydantic_ai_output_type(server_url):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    agent = Agent(
        OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=f"{server_url}/v1", api_key="unused")),
        output_type=Person,
    )
    result = agent.run_sync(ASK_PERSON, model_settings={"max_tokens": 80, "seed": 2})
    assert isinstance(result.output, Person)
