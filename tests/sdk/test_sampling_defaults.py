"""Per-model sampling defaults (sdk.engine_common.sampling_defaults): the resolution order, what the
model files declare, and unset fields surviving the wire to the tier that resolves them."""

from __future__ import annotations

import json

import pytest

from sdk.serving.grpc import convert
from sdk.cloud.openai_wire import request_body
from sdk.protocol.engine import SamplingParams
from sdk.protocol.wire.messages import request_message
from sdk.engine_common.model_files import default_model_path
from sdk.protocol.openai_schema import ChatCompletionRequest
from sdk.engine_common.sampling_defaults import (
    OPENAI_SAMPLING,
    check_sampling_config,
    model_sampling_metadata,
    resolve_sampling_defaults,
)


def write_gguf(path, **sampling) -> str:
    """A GGUF holding only metadata (no tensors): all the sampling lookup reads."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    # Arrays and strings before the sampling keys, as in real files: the header reader skips them by offset.
    writer.add_token_list(["<s>", "hello", "Ġworld", "✓✓"])
    writer.add_array("tokenizer.ggml.token_type", [1, 1, 1, 1])
    writer.add_string("general.name", "tiny")
    for key, value in sampling.items():
        (writer.add_uint32 if isinstance(value, int) else writer.add_float32)(f"general.sampling.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_the_embedded_default_samples_as_its_model_card_says():
    defaults = resolve_sampling_defaults({}, default_model_path())
    assert defaults.values == {
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
    }
    assert defaults.sources["temperature"] == defaults.sources["top_p"] == "built-in: the SmolLM2-Instruct model card"
    assert (
        defaults.sources["top_k"] == "off (no other default)"
        and defaults.sources["presence_penalty"] == "OpenAI's default"
    )


def test_request_beats_config_beats_model_metadata_beats_builtin_beats_openai(tmp_path):
    # A SmolLM2-Instruct file name (built-in: 0.2 / 0.9) whose header declares its own temperature and top_k.
    path = write_gguf(tmp_path / "SmolLM2-360M-Instruct.Q8_0.gguf", temp=0.6, top_k=20, penalty_repeat=1.1)
    defaults = resolve_sampling_defaults({"top_k": 5}, path, "config: file x.toml")
    assert defaults.values == {
        "temperature": pytest.approx(0.6),
        "top_p": 0.9,
        "top_k": 5,
        "min_p": 0.0,
        "repetition_penalty": pytest.approx(1.1),
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
    }
    assert defaults.sources["temperature"] == "model: GGUF general.sampling.temp"
    assert defaults.sources["repetition_penalty"] == "model: GGUF general.sampling.penalty_repeat"
    assert defaults.sources["top_p"] == "built-in: the SmolLM2-Instruct model card"
    assert defaults.sources["top_k"] == "config: file x.toml"
    resolved = defaults.apply(SamplingParams(max_tokens=4, top_p=0.5))
    assert (resolved.temperature, resolved.top_p, resolved.top_k) == (pytest.approx(0.6), 0.5, 5)
    explicit = OPENAI_SAMPLING.apply(SamplingParams(max_tokens=4, temperature=0.0))
    assert defaults.apply(explicit) is explicit  # nothing unset: the request's own values, untouched


def test_an_unknown_model_gets_openais_defaults(tmp_path):
    defaults = resolve_sampling_defaults(None, write_gguf(tmp_path / "other-model.gguf"))
    assert defaults.values == OPENAI_SAMPLING.values
    assert set(defaults.sources.values()) == {"OpenAI's default", "off (no other default)"}
    assert resolve_sampling_defaults(None, None).values == defaults.values


def test_generation_config_beside_a_checkpoint_is_read_like_vllm(tmp_path):
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"do_sample": False, "temperature": 0.7, "top_p": 0.8, "top_k": -1, "bos_token_id": 1})
    )
    values, sources = model_sampling_metadata(str(tmp_path))
    assert values == {"temperature": 0.7, "top_p": 0.8, "top_k": 0}  # top_k <= 0: off
    assert set(sources.values()) == {"model: generation_config.json"}
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 5.0}))
    with pytest.raises(ValueError, match="temperature must be in"):
        resolve_sampling_defaults({}, str(tmp_path))


def test_configured_defaults_are_checked_by_name():
    check_sampling_config({"temperature": 0.3, "top_p": None})
    with pytest.raises(ValueError, match=r"unknown sampling keys \['temprature'\]"):
        check_sampling_config({"temprature": 0.3})
    with pytest.raises(ValueError, match="sampling.top_p"):
        check_sampling_config({"top_p": 0.0})


def test_unresolved_params_cannot_be_sampled():
    with pytest.raises(ValueError, match="fill in its defaults"):
        SamplingParams(max_tokens=1, temperature=0.5).is_greedy
    assert OPENAI_SAMPLING.apply(SamplingParams(max_tokens=1, top_k=1)).is_greedy


def test_a_request_that_leaves_fields_out_leaves_them_unset():
    request = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "top_k": -1})
    params = request.sampling_params(num_prompt_tokens=3, max_model_len=64)
    assert (params.temperature, params.top_p, params.top_k) == (None, None, 0)  # -1: off, explicitly


def test_unset_survives_grpc_and_set_values_arrive_as_sent():
    for sent in (
        SamplingParams(max_tokens=4),
        SamplingParams(max_tokens=4, temperature=0.0, top_p=1.0, top_k=0),
        SamplingParams(max_tokens=4, repetition_stop=False),
        SamplingParams(max_tokens=4, repetition_stop=True),
    ):
        message = request_message([1, 2, 3], sent, request_id="r")
        received = convert.sampling_params(message, num_prompt_tokens=3, max_model_len=64)
        fields = ("temperature", "top_p", "top_k", "repetition_stop")
        assert [getattr(received, f) for f in fields] == [getattr(sent, f) for f in fields]


def test_unset_is_not_sent_to_an_openai_compatible_cloud():
    body = request_body([], SamplingParams(max_tokens=4, top_p=0.9), "m")
    assert "temperature" not in body and "top_k" not in body and "repetition_stop" not in body and body["top_p"] == 0.9
    assert request_body([], SamplingParams(max_tokens=4, repetition_stop=False), "m")["repetition_stop"] is False
