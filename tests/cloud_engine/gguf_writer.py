"""Tiny GGUF files written the way llama.cpp's converter writes them, for the loader and export tests.

The converter's conventions are restated here on purpose (tensor names, the per-head interleaving
of Q/K rows for llama, `rope_freqs` for Llama 3 scaling), so the loaders are checked against an
independent statement of the format. `tokenizer_from` copies another GGUF's tokenizer keys, for
readers that need a vocabulary (transformers' `gguf_file=`, `tandem export-hf`).
"""

from __future__ import annotations

import math

import numpy as np

from tests.cloud_engine.tiny_models import SMALL

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
    "self_attn.q_norm.weight": "attn_q_norm.weight",  # Qwen3
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",  # Phi-3: fused, and gate with up under ffn_up
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",  # experts: the router, then one stack per projection
    "mlp.experts.gate_proj": "ffn_gate_exps.weight",
    "mlp.experts.up_proj": "ffn_up_exps.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight",
}
# Gemma 3's four norms a layer (its ffn_norm is the norm before the MLP); the converter adds 1 to every norm.
GEMMA3_LAYER_NAMES = {
    **LAYER_NAMES,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
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


def converter_tensors(state_dict):
    """(HF name, array) as the converter sees them: a stacked gate-and-up of experts split in two."""
    for hf_name, tensor in state_dict.items():
        array = tensor.float().numpy()
        if hf_name.endswith("mlp.experts.gate_up_proj"):
            gate, up = np.split(array, 2, axis=1)
            layer = hf_name.split(".")[2]
            yield f"model.layers.{layer}.mlp.experts.gate_proj", gate
            yield f"model.layers.{layer}.mlp.experts.up_proj", up
        else:
            yield hf_name, array


def write_gguf(path, hf, arch: str, tokenizer_from: str | None = None) -> None:
    import gguf

    cfg = hf.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    rope = cfg.rope_parameters
    if arch == "gemma3":  # one rope per layer type
        writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
        rope = rope["full_attention"]
    writer.add_rope_freq_base(rope["rope_theta"])
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if rope.get("partial_rotary_factor", 1.0) < 1.0:  # as the converters write it: only where rope is partial
        writer.add_rope_dimension_count(int(head_dim * rope["partial_rotary_factor"]))
    if arch == "gemma3":
        writer.add_sliding_window(cfg.sliding_window)
        writer.add_sliding_window_pattern([kind == "sliding_attention" for kind in cfg.layer_types])
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
    num_experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", 0)
    if num_experts:
        writer.add_expert_count(num_experts)
        writer.add_expert_used_count(cfg.num_experts_per_tok)
        writer.add_expert_feed_forward_length(getattr(cfg, "moe_intermediate_size", cfg.intermediate_size))
        writer.add_expert_weights_norm(getattr(cfg, "norm_topk_prob", True))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    if tokenizer_from is None:
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
    else:
        copy_tokenizer(writer, tokenizer_from)
    for hf_name, array in converter_tensors(hf.state_dict()):
        if hf_name.startswith("model.layers."):
            _, _, layer, rest = hf_name.split(".", 3)
            name = f"blk.{layer}.{(GEMMA3_LAYER_NAMES if arch == 'gemma3' else LAYER_NAMES)[rest]}"
        else:
            name = GLOBAL_NAMES[hf_name]
        if arch == "llama" and ".q_proj." in hf_name:
            array = converter_permute(array, cfg.num_attention_heads)
        elif arch == "llama" and ".k_proj." in hf_name:
            array = converter_permute(array, cfg.num_key_value_heads)
        if arch == "gemma3" and hf_name.endswith("norm.weight"):
            array = array + 1.0
        if name == "output.weight" and cfg.tie_word_embeddings:
            continue
        writer.add_tensor(name, np.ascontiguousarray(array))
    if rope.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_freq_factors(cfg.head_dim, rope["rope_theta"], rope))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def copy_tokenizer(writer, source: str) -> None:
    """Every `tokenizer.*` key of the GGUF at `source`, as it is there (its vocabulary must fit the model's)."""
    import gguf

    for key, field in gguf.GGUFReader(source).fields.items():
        if key.startswith("tokenizer."):
            sub_type = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type)


def write_tiny_qwen3_gguf(path, tokenizer_from: str):
    """A two-layer random-weight Qwen3 in the vocabulary of the GGUF at `tokenizer_from` (its tokenizer keys
    copied), written to `path`; returns the transformers model it was written from. No real Qwen3 GGUF is on
    the package index here: this is what `tandem export-hf` is checked on for the family."""
    import gguf
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    vocab_size = len(gguf.GGUFReader(tokenizer_from).fields["tokenizer.ggml.tokens"].data)
    torch.manual_seed(0)
    config = Qwen3Config(
        **{**SMALL, "vocab_size": vocab_size, "num_hidden_layers": 2},
        head_dim=64,  # wider than hidden / heads, as in the real Qwen3 models; a head size vLLM's CPU kernels take
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        architectures=["Qwen3ForCausalLM"],
    )
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():  # norms away from 1, so a dropped q/k norm would show
            param.copy_(1 + 0.1 * torch.randn_like(param) if "norm" in name else 0.2 * torch.randn_like(param))
    write_gguf(path, model, "qwen3", tokenizer_from=tokenizer_from)
    return model
