"""Each tunable sampling field is declared once (sdk.protocol.sampling_params) and reaches every
place that reads a request's sampling from that declaration: a field added there with a proto
field of its name arrives at the engine through HTTP, gRPC and the OpenAI-HTTP cloud alike."""

from __future__ import annotations

import math

import pytest

from sdk.serving.grpc.convert import sampling_params as params_from_proto
from sdk.cloud.openai_wire import request_body
from sdk.protocol.engine import InvalidRequestError, SamplingParams
from sdk.protocol.openai_schema import ChatCompletionRequest
from sdk.engine_common.sampling_defaults import GGUF_KEYS, LAST_RESORT_SOURCES, OPENAI_DEFAULTS, SAMPLING_FIELDS
from sdk.protocol.sampling_params import TUNABLES
from sdk.protocol.wire import tandem_pb2 as pb
from sdk.protocol.wire.messages import sampling_message
from sdk.settings.fields import FIELDS

MESSAGES = [{"role": "user", "content": "hi"}]


def a_value_that_changes_something(name: str) -> float | int:
    """Inside the field's range and not its off value."""
    knob = TUNABLES[name]
    high = knob.high if math.isfinite(knob.high) else knob.low + 4
    value = knob.low + (high - knob.low) * 0.75
    return int(value) if knob.type is int else value


def test_the_declaration_names_and_types_every_tunable():
    assert list(TUNABLES) == [
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
    ]
    assert TUNABLES["top_k"].type is int and TUNABLES["temperature"].type is float
    for name, knob in TUNABLES.items():
        assert a_value_that_changes_something(name) != knob.off
        SamplingParams(**{name: knob.off})  # the off value is always allowed


def test_defaults_settings_and_the_schema_are_derived_from_it():
    assert SAMPLING_FIELDS == tuple(TUNABLES) and set(OPENAI_DEFAULTS) == set(TUNABLES) == set(LAST_RESORT_SOURCES)
    assert set(GGUF_KEYS.values()) == {name for name, knob in TUNABLES.items() if knob.gguf_key}
    for tier in ("local", "cloud"):
        assert {f.key for f in FIELDS.values() if f.section == f"{tier}.sampling"} == set(TUNABLES)
    schema = ChatCompletionRequest.model_json_schema()["properties"]
    for name, knob in TUNABLES.items():
        assert schema[name]["description"] == knob.doc


@pytest.mark.parametrize("name", list(TUNABLES))
def test_a_set_value_crosses_every_door_unchanged(name):
    value = a_value_that_changes_something(name)
    request = ChatCompletionRequest.model_validate({"messages": MESSAGES, name: value})
    params = request.sampling_params(num_prompt_tokens=4, max_model_len=64)
    assert getattr(params, name) == value
    others = [other for other in TUNABLES if other != name]
    assert all(getattr(params, other) is None for other in others)  # unset stays unset
    message = pb.GenerateRequest(text="hi")
    message.sampling.CopyFrom(sampling_message(params))
    received = params_from_proto(message, num_prompt_tokens=1, max_model_len=64)
    assert getattr(received, name) == pytest.approx(value) and all(getattr(received, o) is None for o in others)
    assert request_body(MESSAGES, params, "m")[name] == value


@pytest.mark.parametrize("name", list(TUNABLES))
def test_each_tunable_refuses_a_value_outside_its_range_naming_itself(name):
    knob = TUNABLES[name]
    below = knob.low - 1 if knob.low_inclusive else knob.low
    with pytest.raises(InvalidRequestError) as refused:
        SamplingParams(**{name: knob.type(below)})
    assert refused.value.param == name and name in str(refused.value)
    if knob.type is float:
        with pytest.raises(InvalidRequestError):
            SamplingParams(**{name: math.nan})


def test_vllm_clients_top_k_minus_one_means_off_and_top_k_off_is_not_sent_over_http():
    request = ChatCompletionRequest.model_validate({"messages": MESSAGES, "top_k": -1})
    params = request.sampling_params(num_prompt_tokens=4, max_model_len=64)
    assert params.top_k == 0
    assert "top_k" not in request_body(MESSAGES, params, "m")  # older vLLM refuses 0
