"""GGUF loading on tiny files written the way llama.cpp's converter writes them (tests/cloud_engine/gguf_writer.py,
an independent statement of the format), then checked against HF."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cloud_engine.loader import build_model
from cloud_engine.loader.gguf import read_gguf_checkpoint, unpermute_rope_rows
from tests.cloud_engine.gguf_writer import converter_permute, write_gguf
from tests.cloud_engine.paged_helpers import PagedBatchBuilder, make_kv_caches
from tests.cloud_engine.tiny_models import (
    gemma3_config,
    llama_config,
    mixtral_config,
    phi3_config,
    qwen2_config,
    qwen3_config,
    qwen3_moe_config,
    random_tokens,
)


def test_unpermute_inverts_the_converter_permutation():
    weight = np.random.default_rng(0).standard_normal((3 * 8, 5)).astype(np.float32)
    bias = np.arange(3 * 8, dtype=np.float32)
    assert torch.equal(unpermute_rope_rows(torch.from_numpy(converter_permute(weight, 3)), 3), torch.from_numpy(weight))
    assert torch.equal(unpermute_rope_rows(torch.from_numpy(converter_permute(bias, 3)), 3), torch.from_numpy(bias))


@pytest.mark.parametrize(
    "arch,make_config",
    [
        ("llama", llama_config),
        ("qwen2", qwen2_config),
        ("qwen3", qwen3_config),
        ("phi3", phi3_config),
        ("qwen3moe", qwen3_moe_config),
        ("llama", mixtral_config),  # llama.cpp writes Mixtral as a llama file with experts
        # A Gemma 3 GGUF has no query scale: llama.cpp takes the head's width, as the small models have it.
        ("gemma3", lambda: gemma3_config(query_pre_attn_scalar=32)),
    ],
    ids=["llama", "qwen2", "qwen3", "phi3", "qwen3moe", "mixtral", "gemma3"],
)
def test_tiny_gguf_matches_hf(tmp_path, arch, make_config):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = make_config()
    config.tie_word_embeddings = False  # exercise output.weight; the real SmolLM2 test covers tied files
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            param.copy_(1 + 0.1 * torch.randn_like(param) if "norm" in name else 0.2 * torch.randn_like(param))
    path = tmp_path / f"tiny-{arch}.gguf"
    write_gguf(path, hf, arch)

    checkpoint = read_gguf_checkpoint(str(path))
    assert checkpoint.config.architecture == arch
    assert checkpoint.config.attention_bias == (arch == "qwen2")
    assert checkpoint.config.num_key_value_heads == config.num_key_value_heads
    assert not checkpoint.config.tie_word_embeddings
    model = build_model(checkpoint.config, checkpoint.weights())

    tokens = random_tokens(26, seed=5)
    model.bind_kv_caches(make_kv_caches(checkpoint.config, num_blocks=16, block_size=4))
    builder = PagedBatchBuilder(16, 4, seed=3)
    builder.add_sequence("a", tokens)
    rows = []
    with torch.inference_mode():
        for n in [9, 8] + [1] * 9:
            batch = builder.step({"a": n})
            rows.append(model.compute_logits(model(batch.input_ids, batch.positions, batch.metadata)))
        expected = hf(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(torch.cat(rows), expected, atol=1e-4, rtol=0)
