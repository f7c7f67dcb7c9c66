"""Every field of OpenAI's request bodies (read from the `openai` package's own type definitions,
message fields included) is honoured, refused with a 400 naming it, or accepted and listed as
ignored; unknown names are ignored with a warning, or refused under --strict-fields."""

from __future__ import annotations

import json
import typing

import httpx
import pytest
from openai.types import completion_create_params
from openai.types import chat as chat_types
from openai.types.chat import completion_create_params as chat_create_params
from openai.types.responses import response_create_params as responses_create_params

from sdk.protocol.engine import InvalidRequestError
from sdk.protocol.openai_schema import ChatCompletionRequest, CompletionRequest
from sdk.protocol.request_fields import (
    CHAT_ONLY_FIELDS,
    IGNORED_FIELDS,
    REFUSED_FIELDS,
    REFUSED_MESSAGE_FIELDS,
    RESPONSES_REFUSED_FIELDS,
)

MESSAGES = [{"role": "user", "content": "What is 2+2?"}]
# A value for every field of the openai package's request types that asks for something.
SAMPLES: dict[str, object] = {
    "audio": {"voice": "alloy", "format": "wav"},
    "frequency_penalty": 0.5,
    "function_call": "auto",
    "functions": [{"name": "f", "parameters": {}}],
    "logit_bias": {"5": 1.0},
    "logprobs": True,
    "max_completion_tokens": 4,
    "max_tokens": 4,
    "messages": MESSAGES,
    "metadata": {"k": "v"},
    "modalities": ["text", "audio"],
    "model": "m",
    "moderation": {"input": True},
    "n": 2,
    "parallel_tool_calls": True,
    "prediction": {"type": "content", "content": "4"},
    "presence_penalty": 0.5,
    "prompt_cache_key": "k",
    "prompt_cache_options": {},
    "prompt_cache_retention": "24h",
    "reasoning_effort": "low",
    "response_format": {"type": "json_object"},
    "safety_identifier": "s",
    "seed": 1,
    "service_tier": "auto",
    "stop": ["x"],
    "store": False,
    "stream": True,
    "stream_options": {"include_usage": True},
    "temperature": 0.5,
    "tool_choice": "auto",
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "top_logprobs": 2,
    "top_p": 0.9,
    "user": "u",
    "verbosity": "low",
    "web_search_options": {},
    # completions
    "prompt": "2+2=",
    "echo": True,
    "suffix": "!",
    "best_of": 3,
}
MESSAGE_SAMPLES = {
    "audio": {"id": "a"},
    "function_call": {"name": "f", "arguments": "{}"},
    "refusal": "no",
    "name": "bob",
    "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    "tool_call_id": "1",
}
MESSAGE_TYPES = (
    "ChatCompletionSystemMessageParam",
    "ChatCompletionUserMessageParam",
    "ChatCompletionDeveloperMessageParam",
    "ChatCompletionAssistantMessageParam",
    "ChatCompletionToolMessageParam",
    "ChatCompletionFunctionMessageParam",
)


def openai_fields(params_type) -> list[str]:
    return sorted(set(typing.get_type_hints(params_type)) | {"stream"})


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate_json(json.dumps({"model": "m", "messages": MESSAGES, **fields}))


def outcome(build) -> tuple[str, str | None]:
    """("refused", param) | ("ignored", names) | ("honoured", None) of one request's fields; `build`
    validates the body (the models' validators refuse), then the request becomes engine parameters."""
    try:
        request = build()
        ignored = request.ignored_fields
        if isinstance(request, CompletionRequest):
            request.sampling_params()
        else:
            request.sampling_params(num_prompt_tokens=5, max_model_len=64)
    except InvalidRequestError as exc:
        return "refused", exc.param
    return ("ignored", ",".join(ignored)) if ignored else ("honoured", None)


@pytest.mark.parametrize("name", openai_fields(chat_create_params.CompletionCreateParamsBase))
def test_every_chat_field_is_honoured_refused_or_ignored(name):
    assert name in SAMPLES, (
        f"the openai package has a new chat field {name!r}: classify it in sdk.protocol.request_fields"
    )
    extra = {"stream": True} if name == "stream_options" else {"logprobs": True} if name == "top_logprobs" else {}
    got = outcome(lambda: chat(**extra, **{name: SAMPLES[name]}))
    if name in IGNORED_FIELDS:
        assert got == ("ignored", name)
    elif name in ChatCompletionRequest.model_fields:  # tools and tool_choice: honoured here, refused on completions
        assert got == ("honoured", None)
    else:
        assert name in REFUSED_FIELDS, f"{name} is neither honoured, refused nor ignored"
        assert got == ("refused", name)


@pytest.mark.parametrize("name", openai_fields(completion_create_params.CompletionCreateParamsBase))
def test_every_completions_field_is_honoured_refused_or_ignored(name):
    assert name in SAMPLES, f"the openai package has a new completions field {name!r}: classify it"
    value = 2 if name == "logprobs" else SAMPLES[name]  # the legacy API's logprobs is a count
    body = {"model": "m", "prompt": "2+2=", name: value} | ({"stream": True} if name == "stream_options" else {})
    got = outcome(lambda: CompletionRequest.model_validate_json(json.dumps(body)))
    expected = {
        "echo": ("refused", "echo"),
        "suffix": ("refused", "suffix"),
        "best_of": ("refused", "best_of"),
        "user": ("ignored", "user"),
    }.get(name, ("honoured", None))
    assert name in CompletionRequest.model_fields and got == expected


@pytest.mark.parametrize("message_type", MESSAGE_TYPES)
def test_every_message_field_is_honoured_or_refused(message_type):
    for name in sorted(typing.get_type_hints(getattr(chat_types, message_type))):
        if name in ("role", "content"):
            continue
        assert name in MESSAGE_SAMPLES, f"the openai package has a new message field {name!r}: classify it"
        message = {"role": "assistant", "content": "4", name: MESSAGE_SAMPLES[name]}
        got = outcome(lambda: chat(messages=[*MESSAGES, message]))
        if name in REFUSED_MESSAGE_FIELDS:
            assert got == ("refused", f"messages[1].{name}"), name
        else:
            assert name in ("name", "tool_calls", "tool_call_id") and got == ("honoured", None), name


def test_values_that_ask_for_nothing_are_accepted():
    assert outcome(
        lambda: chat(tools=[], tool_choice="none", response_format={"type": "text"}, modalities=["text"], audio=None)
    ) == ("honoured", None)


def test_unknown_names_are_listed_or_refused_when_strict():
    request = chat(user="u", frobnicate=1, messages=[{"role": "user", "content": "hi", "mood": "calm"}])
    assert request.ignored_fields == request.check_fields() == ["user", "frobnicate", "messages[0].mood"]

    def strict(**fields) -> ChatCompletionRequest:  # what --strict-fields validates with
        body = json.dumps({"model": "m", "messages": MESSAGES, **fields})
        return ChatCompletionRequest.model_validate_json(body, context={"strict_fields": True})

    with pytest.raises(InvalidRequestError) as info:
        strict(user="u", frobnicate=1)
    assert info.value.param == "frobnicate"
    assert strict(user="u", metadata={"a": "b"}).ignored_fields == ["user", "metadata"]  # known, harmless


# -- over HTTP, on the session's `tandem serve` ----------------------------------------------------


@pytest.mark.slow
def test_the_server_refuses_names_and_lists_what_it_ignored(server_url):
    model = "smollm2-135m-instruct"
    refused = httpx.post(
        f"{server_url}/v1/completions", json={"model": "auto", "prompt": "2+2=", "tools": SAMPLES["tools"]}
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools"
    for name in (model, "auto"):
        body = {"model": name, "messages": MESSAGES, "max_tokens": 4, "user": "u", "frobnicate": 1}
        reply = httpx.post(f"{server_url}/v1/chat/completions", json=body, timeout=120).json()
        assert reply["tandem"]["ignored_fields"] == ["user", "frobnicate"], name
    plain = httpx.post(
        f"{server_url}/v1/chat/completions", json={"model": model, "messages": MESSAGES, "max_tokens": 2}, timeout=120
    )
    assert "tandem" not in plain.json()  # nothing to say
    with httpx.stream(
        "POST",
        f"{server_url}/v1/chat/completions",
        timeout=120,
        json={"model": model, "messages": MESSAGES, "max_tokens": 2, "stream": True, "store": True},
    ) as stream:
        first = json.loads(next(line for line in stream.iter_lines() if line.startswith("data: "))[6:])
    assert first["tandem"] == {"ignored_fields": ["store"]}


@pytest.mark.slow
def test_popular_clients_plain_chat_calls_are_not_refused(server_url):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=f"{server_url}/v1", api_key="unused", model="auto", max_tokens=8)
    assert llm.invoke("What is 2+2?").content
    assert "".join(chunk.content for chunk in llm.stream("What is 2+2?"))

    import instructor
    import openai

    client = instructor.from_openai(openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused"))
    reply = client.chat.completions.create(model="auto", messages=MESSAGES, max_tokens=8, response_model=None)
    assert reply.choices[0].message.content

    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    agent = Agent(OpenAIChatModel("auto", provider=OpenAIProvider(base_url=f"{server_url}/v1", api_key="unused")))
    assert agent.run_sync("What is 2+2?", model_settings={"max_tokens": 8}).output


def test_a_stray_messages_field_on_completions_is_just_an_unknown_field():
    request = CompletionRequest.model_validate_json(json.dumps({"model": "m", "prompt": "x", "messages": 1.5}))
    assert request.check_fields() == ["messages"]


# /v1/responses: its own view (sdk.protocol.request_fields.RESPONSES_*) over the same tables.
RESPONSES_SAMPLES: dict[str, object] = {
    "background": True,
    "context_management": [{"type": "compaction"}],
    "conversation": "conv_1",
    "include": ["message.output_text.logprobs"],
    "input": "What is 2+2?",
    "instructions": "Be brief.",
    "max_output_tokens": 8,
    "max_tool_calls": 2,
    "metadata": {"k": "v"},
    "model": "m",
    "moderation": {"input": True},
    "parallel_tool_calls": False,
    "previous_response_id": "resp_1",
    "prompt": {"id": "pmpt_1"},
    "prompt_cache_key": "k",
    "prompt_cache_options": {},
    "prompt_cache_retention": "24h",
    "reasoning": {"effort": "low"},
    "safety_identifier": "s",
    "service_tier": "auto",
    "store": False,
    "stream": True,
    "stream_options": {"include_obfuscation": True},
    "temperature": 0.5,
    "text": {"format": {"type": "json_object"}},
    "tool_choice": "auto",
    "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    "top_logprobs": 2,
    "top_p": 0.9,
    "truncation": "auto",
    "user": "u",
}
# Honoured by the Responses body itself (its own schema), not by the chat request it becomes.
RESPONSES_OWN = {"input", "instructions", "max_output_tokens", "metadata", "previous_response_id", "store", "text"}


def responses_outcome(fields: dict) -> tuple[str, str | None]:
    """As `outcome`, for a /v1/responses body: it becomes the chat request, which then runs as chat's."""
    from sdk.protocol.openai_schema.responses_api import ResponseCreateRequest

    body = ResponseCreateRequest.model_validate_json(json.dumps({"model": "m", "input": "2+2?", **fields}))
    return outcome(lambda: ChatCompletionRequest.model_validate(body.chat_payload()))


@pytest.mark.parametrize("name", openai_fields(responses_create_params.ResponseCreateParamsBase))
def test_every_responses_field_is_honoured_refused_or_ignored(name):
    assert name in RESPONSES_SAMPLES, (
        f"the openai package has a new Responses field {name!r}: classify it in sdk.protocol.request_fields"
    )
    got = responses_outcome({name: RESPONSES_SAMPLES[name]})
    if name in RESPONSES_OWN:
        assert got == ("honoured", None)
    elif name in RESPONSES_REFUSED_FIELDS:  # this endpoint's refusals, then chat's rules
        assert got == ("refused", name)
    elif name in IGNORED_FIELDS:
        assert got == ("ignored", name)
    elif name in ChatCompletionRequest.model_fields:
        assert got == ("honoured", None)
    else:
        assert name in REFUSED_FIELDS, f"{name} is neither honoured, refused nor ignored on /v1/responses"
        assert got == ("refused", name)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("include", []),
        ("truncation", "disabled"),
        ("background", False),
        ("stream_options", {"include_obfuscation": False}),
    ],
)
def test_responses_values_that_ask_for_nothing_are_accepted(name, value):
    assert responses_outcome({name: value}) == ("honoured", None)  # the Agents SDK sends include: [] every time


@pytest.mark.parametrize("name", sorted(CHAT_ONLY_FIELDS))
def test_chats_own_names_are_refused_on_responses_naming_what_to_send(name):
    got = responses_outcome({name: SAMPLES[name]})
    assert got == ("refused", name)
