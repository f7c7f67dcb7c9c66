"""Which model class runs an architecture, and how its GGUF tensor names map to HF names.

Keyed by config.json `architectures[0]` and by GGUF `general.architecture`; adding an
architecture is adding rows here, not branches in the loaders.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from cloud_engine.model.gemma3 import Gemma3ForCausalLM
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
    # Qwen3: per-head norms of q and k.
    "blk.{}.attn_q_norm.weight": "model.layers.{}.self_attn.q_norm.weight",
    "blk.{}.attn_k_norm.weight": "model.layers.{}.self_attn.k_norm.weight",
    # Mixtures of experts: the router, and each projection of every expert stacked in one tensor.
    "blk.{}.ffn_gate_inp.weight": "model.layers.{}.mlp.gate.weight",
    "blk.{}.ffn_gate_exps.weight": "model.layers.{}.mlp.experts.gate_proj",
    "blk.{}.ffn_up_exps.weight": "model.layers.{}.mlp.experts.up_proj",
    "blk.{}.ffn_down_exps.weight": "model.layers.{}.mlp.experts.down_proj",
}
# Phi-3 stores Q, K and V fused (attn_qkv) and gate and up fused under ffn_up, as its HF checkpoint does.
PHI3_GGUF_TENSOR_NAMES: dict[str, str] = {
    **{k: v for k, v in LLAMA_GGUF_TENSOR_NAMES.items() if not k.startswith(("blk.{}.attn_q", "blk.{}.ffn_up"))},
    "blk.{}.attn_qkv.weight": "model.layers.{}.self_attn.qkv_proj.weight",
    "blk.{}.ffn_up.weight": "model.layers.{}.mlp.gate_up_proj.weight",
}
# Gemma 3: four norms a layer; llama.cpp's ffn_norm is the norm before the MLP, not after attention.
GEMMA3_GGUF_TENSOR_NAMES: dict[str, str] = {
    **LLAMA_GGUF_TENSOR_NAMES,
    "blk.{}.post_attention_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "blk.{}.ffn_norm.weight": "model.layers.{}.pre_feedforward_layernorm.weight",
    "blk.{}.post_ffw_norm.weight": "model.layers.{}.post_feedforward_layernorm.weight",
}
# Mixtral's HF checkpoints name its feed-forward block and experts their own way.
MIXTRAL_HF_RENAMES: tuple[tuple[str, str], ...] = (
    (".block_sparse_moe.", ".mlp."),
    (".w1.", ".gate_proj."),
    (".w3.", ".up_proj."),
    (".w2.", ".down_proj."),
)


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
    # (old, new) substring renames from this architecture's HF checkpoint names to the model's.
    hf_tensor_renames: tuple[tuple[str, str], ...] = ()
    # llama.cpp's converter stores Gemma's (1 + weight) norms with the 1 added; the loader takes it off.
    gguf_norm_shift: float = 0.0

    def hf_name(self, checkpoint_name: str) -> str:
        """The model's name for an HF checkpoint tensor of this architecture."""
        for old, new in self.hf_tensor_renames:
            checkpoint_name = checkpoint_name.replace(old, new)
        return checkpoint_name


# Llama, Mistral and Mixtral (a `llama` GGUF with experts) keep llama.cpp's interleaved rope rows;
# the others are NeoX-rope families, stored as in HF.
LLAMA = ArchitectureSpec(LlamaForCausalLM, gguf_rope_interleaved=True)
MIXTRAL = ArchitectureSpec(LlamaForCausalLM, gguf_rope_interleaved=True, hf_tensor_renames=MIXTRAL_HF_RENAMES)
QWEN = ArchitectureSpec(LlamaForCausalLM)  # Qwen2, Qwen3 and Qwen3-MoE
PHI3 = ArchitectureSpec(LlamaForCausalLM, gguf_tensor_names=PHI3_GGUF_TENSOR_NAMES)
GEMMA3 = ArchitectureSpec(Gemma3ForCausalLM, gguf_tensor_names=GEMMA3_GGUF_TENSOR_NAMES, gguf_norm_shift=1.0)

HF_ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "LlamaForCausalLM": LLAMA,
    "MistralForCausalLM": LLAMA,
    "Qwen2ForCausalLM": QWEN,
    "Qwen3ForCausalLM": QWEN,
    "Phi3ForCausalLM": PHI3,
    "Qwen3MoeForCausalLM": QWEN,
    "MixtralForCausalLM": MIXTRAL,
    "Gemma3ForCausalLM": GEMMA3,
}
GGUF_ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "llama": LLAMA,
    "mistral": LLAMA,
    "qwen2": QWEN,
    "qwen3": QWEN,
    "phi3": PHI3,
    "qwen3moe": QWEN,
    "gemma3": GEMMA3,
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
