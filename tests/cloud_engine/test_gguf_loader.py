"""GGUF loading on tiny files written here the way llama.cpp's converter writes them.

The converter's conventions are restated in this file on purpose (tensor names, the
per-head interleaving of Q/K rows for llama, `rope_freqs` for Llama 3 scaling), so the
loader is checked against an independent statement of the format, then against HF.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cloud_engine.loader import build_model
from cloud_engine.loader.gguf import read_gguf_checkpoint, unpermute_rope_rows
from tests.cloud_engine.paged_helpers import PagedBatchBuilder, make_kv_caches
from tests.cloud_engine.tiny_models import llama_config, qwen2_config, random_tokens

LAYER_NAMES = {  # HF module path inside a layer -> llama.cpp tensor name inside blk.N
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def converter_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf rope permutation: per head, rows (half, i) become (i, half)."""
    return (
        weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def llama3_rope_freq_factors(head_dim: int, theta: float, rope: dict) -> np.ndarray:
    """What the converter stores as rope_freqs.weight: each frequency's divisor under llama3 scaling."""
    factors = []
    for i in range(0, head_dim, 2):
        wavelength = 2 * math.pi * theta ** (i / head_dim)
        old_context = rope["original_max_position_embeddings"]
        if wavelength < old_context / rope["high_freq_factor"]:
            factors.append(1.0)
        elif wavelength > old_context / rope["low_freq_factor"]:
            factors.append(rope["factor"])
        else:
            smooth = (old_context / wavelength - rope["low_freq_factor"]) / (
                rope["high_freq_factor"] - rope["low_freq_factor"]
            )
            factors.append(1 / ((1 - smooth) / rope["factor"] + smooth))
    return np.array(factors, dtype=np.float32)


def write_gguf(path, hf, arch: str) -> None:
    import gguf

    cfg = hf.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for hf_name, tensor in hf.state_dict().items():
        array = tensor.float().numpy()
        if hf_name.startswith("model.layers."):
            _, _, layer, rest = hf_name.split(".", 3)
            name = f"blk.{layer}.{LAYER_NAMES[rest]}"
        else:
            name = GLOBAL_NAMES[hf_name]
        if arch == "llama" and ".q_proj." in hf_name:
            array = converter_permute(array, cfg.num_attention_heads)
        elif arch == "llama" and ".k_proj." in hf_name:
            array = converter_permute(array, cfg.num_key_value_heads)
        if name == "output.weight" and cfg.tie_word_embeddings:
            continue
        writer.add_tensor(name, np.ascontiguousarray(array))
    rope = cfg.rope_parameters
    if rope.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_freq_factors(cfg.head_dim, rope["rope_theta"], rope))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_unpermute_inverts_the_converter_permutation():
    weight = np.random.default_rng(0).standard_normal((3 * 8, 5)).astype(np.float32)
    bias = np.arange(3 * 8, dtype=np.float32)
    assert torch.equal(unpermute_rope_rows(torch.from_numpy(converter_permute(weight, 3)), 3), torch.from_numpy(weight))
    assert torch.equal(unpermute_rope_rows(torch.from_numpy(converter_permute(bias, 3)), 3), torch.from_numpy(bias))


@pytest.mark.parametrize("arch,make_config", [("llama", llama_config), ("qwen2", qwen2_config)])
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
