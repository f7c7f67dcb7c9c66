"""Speculative decoding under a grammar mask stays exact: drafts are cut to the prefix the grammar
accepts, each verified row is masked by the grammar's state after the draft tokens before it, and
the matcher walks back after verifying. Greedy output is token-for-token the output without
drafts, on a tiny random model with a byte-level vocabulary (so it can spell JSON)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from cloud_engine.llm import LLM
from cloud_engine.spec_decode import SpeculativeConfig
from sdk.protocol.engine import SamplingParams, StructuredOutput
from tests.cloud_engine.tiny_models import llama_config, save_byte_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "size": {"enum": ["small", "medium", "large"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 999},
        "tags": {"type": "array", "maxItems": 3, "items": {"enum": ["aa", "bb", "cc"]}},
    },
    "required": ["colour", "size", "count", "tags"],
    "additionalProperties": False,
}
pytestmark = pytest.mark.slow  # ~45 s: three engines per test on 2 cores

EXAMPLE = '{"colour": "red", "size": "large", "count": 12, "tags": ["aa", "bb"]}'


@pytest.fixture(scope="module")
def byte_model_dir(tmp_path_factory) -> str:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    config = llama_config()
    config.initializer_range = 0.5  # a varied model (the default init just repeats the last token)
    path = tmp_path_factory.mktemp("spec-bytes")
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    save_byte_tokenizer(path)
    return str(path)


def run(model_dir: str, params: list[SamplingParams], spec: SpeculativeConfig | None = None):
    config = {
        "dtype": "float32",
        "block_size": 4,
        "kv_cache_gb": 0.002,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 64,
        "max_model_len": 256,
    }
    if spec is not None:
        config["speculative"] = spec
    llm = LLM(model_dir, **config)
    # The prompt holds a valid answer, so prompt lookup finds drafts the grammar accepts.
    prompts = [[1, *llm.engine.tokenize(f"{EXAMPLE} {i}", add_special=False)] for i in range(len(params))]
    outputs = llm.generate(prompts, params)
    assert llm.engine.kv_manager.num_used_blocks == 0
    return llm, outputs


def constrained(**fields) -> SamplingParams:
    return SamplingParams(max_tokens=150, structured=StructuredOutput("json_schema", json.dumps(SCHEMA)), **fields)


@pytest.mark.parametrize(
    "spec",
    [
        SpeculativeConfig(method="ngram", ngram_min=1, num_speculative_tokens=4, adaptive=False),
        "identical draft model",
    ],
)
def test_greedy_structured_output_is_the_same_with_drafts(byte_model_dir, spec):
    if spec == "identical draft model":
        spec = SpeculativeConfig(method="draft", draft_model=byte_model_dir, num_speculative_tokens=4, adaptive=False)
    params = [constrained(temperature=0.0) for _ in range(3)]
    _, reference = run(byte_model_dir, params)
    llm, outputs = run(byte_model_dir, params, spec)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in reference]
    stats = llm.engine.speculator.stats
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0, "drafts were proposed and some accepted"
    for output in outputs:
        assert output.finish_reason == "stop", output.text
        jsonschema.validate(json.loads(output.text), SCHEMA)


def test_sampled_structured_answers_with_drafts_fit_and_mark_forced_tokens(byte_model_dir):
    spec = SpeculativeConfig(method="draft", draft_model=byte_model_dir, num_speculative_tokens=4, adaptive=False)
    llm, outputs = run(byte_model_dir, [constrained(temperature=0.8, seed=s) for s in range(4)], spec)
    assert llm.engine.speculator.stats.num_accepted_tokens > 0
    for output in outputs:
        assert output.finish_reason == "stop", output.text
        jsonschema.validate(json.loads(output.text), SCHEMA)
        # Forced tokens (a key's letters, punctuation) are marked, including those emitted in a verified run.
        assert any(e.forced for e in output.events) and not all(e.forced for e in output.events)
