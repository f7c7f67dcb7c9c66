"""The embedded SmolLM2-135M-Instruct GGUF through our loader against transformers' GGUF loader.

Both dequantize the same Q4_1 file to float32, so logits agree closely and greedy
decoding agrees token for token; transformers undoes llama.cpp's Q/K permutation with
its own code, which makes it an independent check of ours on a real converted file.
"""

from __future__ import annotations

import os

import pytest
import torch

from cloud_engine.loader import load_model
from sdk.engine_common.model_files import default_model_path
from tests.cloud_engine.paged_helpers import PagedBatchBuilder, make_kv_caches

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
NUM_GREEDY_STEPS = 20


@pytest.fixture(scope="module")
def ours():
    return load_model(None, dtype=torch.float32)


@pytest.fixture(scope="module")
def reference():
    """(transformers model, transformers tokenizer) from the same GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(default_model_path())
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return model, tokenizer


def test_identity_and_special_tokens(ours):
    assert ours.name == "smollm2-135m-instruct"
    assert ours.config.architecture == "llama" and ours.config.tie_word_embeddings
    assert ours.config.num_attention_heads == 9 and ours.config.num_key_value_heads == 3
    im_end = ours.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in ours.eos_token_ids and ours.bos_token_id not in ours.eos_token_ids
    assert not ours.add_bos
    assert "<|im_start|>" in ours.chat_template


def test_chat_prompt_tokenizes_like_transformers(ours, reference):
    _, hf_tokenizer = reference
    expected = hf_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    ids = ours.encode_chat(MESSAGES)
    assert ids == expected
    assert ours.tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    # Raw prompts keep special-token text as text.
    assert ours.tokenizer.convert_tokens_to_ids("<|im_start|>") not in ours.encode("<|im_start|>", parse_special=False)


def test_prefill_logits_and_greedy_decode_match_transformers(ours, reference):
    hf_model, _ = reference
    prompt = ours.encode_chat(MESSAGES)
    model = ours.model
    model.bind_kv_caches(make_kv_caches(ours.config, num_blocks=32, block_size=16))
    builder = PagedBatchBuilder(32, 16, seed=7)
    builder.add_sequence("chat", prompt + [0] * NUM_GREEDY_STEPS)  # placeholders, overwritten as we decode
    tokens = list(prompt)
    with torch.inference_mode():
        batch = builder.step({"chat": len(prompt)})
        prefill_logits = model.compute_logits(model(batch.input_ids, batch.positions, batch.metadata))
        expected = hf_model(torch.tensor([prompt])).logits[0]
        torch.testing.assert_close(prefill_logits, expected, atol=2e-3, rtol=1e-4)

        next_token = int(prefill_logits[-1].argmax())
        for _ in range(NUM_GREEDY_STEPS - 1):
            tokens.append(next_token)
            builder.tokens["chat"][len(tokens) - 1] = next_token
            batch = builder.step({"chat": 1})
            next_token = int(model.compute_logits(model(batch.input_ids, batch.positions, batch.metadata))[-1].argmax())
        tokens.append(next_token)

        hf_model.generation_config.eos_token_id = None  # like our loop: argmax every step, EOS included
        generated = hf_model.generate(
            torch.tensor([prompt]), max_new_tokens=NUM_GREEDY_STEPS, do_sample=False, pad_token_id=0
        )
        reference_tokens = generated[0].tolist()
    assert tokens == reference_tokens
    assert "Paris" in ours.tokenizer.decode(tokens[len(prompt) :])


def test_both_engines_fingerprint_the_embedded_vocabulary_alike(ours):
    """The cascade lets logit_bias cross tiers only when these agree (sdk.protocol.vocabulary)."""
    from cloud_engine.loader.tokenizer import tokenizer_vocabulary
    from sdk.protocol.vocabulary import same_vocabulary, vocabulary_fingerprint
    from tests.local_runtime.conftest import make_engine

    cloud_side = vocabulary_fingerprint(tokenizer_vocabulary(ours.tokenizer))
    local = make_engine(kv_cache_tokens=256, max_num_seqs=1, max_num_batched_tokens=64, max_model_len=128)
    try:
        assert cloud_side == local.vocabulary_fingerprint and cloud_side.startswith("49152:")
    finally:
        local.close()
    # One token string changed (its id now means something else) is another vocabulary.
    changed = tokenizer_vocabulary(ours.tokenizer)
    changed[1000] += "x"
    assert not same_vocabulary(cloud_side, vocabulary_fingerprint(changed)) and not same_vocabulary("", "")


def test_the_cloud_engine_constrains_response_format_too():
    """The cloud sampler masks with the same grammar module as the local one: an answer that ends
    on its own parses and fits its schema, greedy and sampled."""
    import json

    import jsonschema

    from cloud_engine.llm import LLM
    from sdk.protocol.engine import SamplingParams, StructuredOutput

    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    llm = LLM(None, dtype="float32", max_num_seqs=4, kv_cache_gb=0.1, max_model_len=256)
    prompt = llm.engine.apply_chat_template([{"role": "user", "content": "Give the name and age of a person as JSON."}])
    constraint = StructuredOutput("json_schema", json.dumps(schema))
    params = [
        SamplingParams(max_tokens=60, temperature=t, top_p=0.95, seed=s, structured=constraint)
        for t, s in ((0.0, 0), (0.7, 1), (0.7, 2))
    ]
    outputs = llm.generate([prompt] * len(params), params)
    assert [o.finish_reason for o in outputs] == ["stop"] * len(params), [o.text for o in outputs]
    for output in outputs:
        jsonschema.validate(json.loads(output.text), schema)
