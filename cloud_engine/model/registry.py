"""Which model class runs an architecture, and how its GGUF tensor names map to HF names.

Keyed by config.json `architectures[0]` and by GGUF `general.architecture`; adding an
architecture is adding rows here, not branches in the loaders.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from cloud_engine.model.llama import LlamaForCausalLM

# GGUF tensor name -> HF checkpoint name; "{}" is the layer index. llama.cpp's
# converter uses the same names for every Llama-like architecture.
LLAMA_GGUF_TENSOR_NAMES: dict[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
    "blk.{}.attn_q.weight": "model.layers.{}.self_attn.q_proj.weight",
    "blk.{}.attn_k.weight": "model.layers.{}.self_attn.k_proj.weight",
    "blk.{}.attn_v.weight": "model.layers.{}.self_attn.v_proj.weight",
    "blk.{}.attn_q.bias": "model.layers.{}.self_attn.q_proj.bias",
    "blk.{}.attn_k.bias": "model.layers.{}.self_attn.k_proj.bias",
    "blk.{}.attn_v.bias": "model.layers.{}.self_attn.v_proj.bias",
    "blk.{}.attn_output.weight": "model.layers.{}.self_attn.o_proj.weight",
    "blk.{}.attn_output.bias": "model.layers.{}.self_attn.o_proj.bias",
    "blk.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "blk.{}.ffn_gate.weight": "model.layers.{}.mlp.gate_proj.weight",
    "blk.{}.ffn_up.weight": "model.layers.{}.mlp.up_proj.weight",
    "blk.{}.ffn_down.weight": "model.layers.{}.mlp.down_proj.weight",
}


class UnsupportedArchitectureError(ValueError):
    """The checkpoint's architecture has no implementation here."""


@dataclass(frozen=True)
class ArchitectureSpec:
    """How to build and load one architecture."""

    model_class: type[nn.Module]  # built from a ModelConfig
    gguf_tensor_names: dict[str, str] = field(default_factory=lambda: LLAMA_GGUF_TENSOR_NAMES)
    # llama.cpp's converter interleaves the rotary halves of Q and K rows for archs its
    # "normal" (GPT-J style) rope kernel runs; those must be permuted back for HF rope.
    gguf_rope_interleaved: bool = False


LLAMA = ArchitectureSpec(LlamaForCausalLM, gguf_rope_interleaved=True)
QWEN2 = ArchitectureSpec(LlamaForCausalLM, gguf_rope_interleaved=False)  # NeoX rope: stored as in HF

HF_ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "LlamaForCausalLM": LLAMA,
    "MistralForCausalLM": LLAMA,
    "Qwen2ForCausalLM": QWEN2,
}
GGUF_ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "llama": LLAMA,
    "mistral": LLAMA,
    "qwen2": QWEN2,
}


def get_architecture(name: str) -> ArchitectureSpec:
    """The spec for an HF architecture class name or a GGUF architecture; raises UnsupportedArchitectureError."""
    spec = HF_ARCHITECTURES.get(name) or GGUF_ARCHITECTURES.get(name)
    if spec is None:
        raise UnsupportedArchitectureError(
            f"architecture {name!r} is not supported by tandem's cloud engine; supported: "
            f"{', '.join(HF_ARCHITECTURES)} (config.json) and {', '.join(GGUF_ARCHITECTURES)} (GGUF)"
        )
    return spec


def gguf_to_hf_name(gguf_name: str, spec: ArchitectureSpec) -> str | None:
    """The HF checkpoint name of a GGUF tensor, or None when the table has no row for it."""
    parts = gguf_name.split(".")
    if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit():
        template = spec.gguf_tensor_names.get(".".join(["blk", "{}", *parts[2:]]))
        return template.format(parts[1]) if template else None
    return spec.gguf_tensor_names.get(gguf_name)
