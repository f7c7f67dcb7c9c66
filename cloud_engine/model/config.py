"""The shape of a decoder-only model, read from an HF config.json or from GGUF metadata.

One validated dataclass for every supported architecture; the model code reads only
this, never the raw config, so the two file formats meet here.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Rope types the rotary module implements; "per_frequency" carries explicit divisors
# (what llama.cpp stores as the `rope_freqs` tensor of Llama 3.x GGUFs).
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "per_frequency")
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")

# What a key missing from config.json means for an architecture (Qwen2 always has QKV bias).
HF_ARCHITECTURE_DEFAULTS: dict[str, dict[str, Any]] = {
    "Qwen2ForCausalLM": {"attention_bias": True, "attention_output_bias": False},
}


class ModelConfigError(ValueError):
    """The model's config is incomplete or describes something tandem cannot run."""


@dataclass(frozen=True)
class ModelConfig:
    """Everything the model code needs to build and run one architecture."""

    architecture: str  # config.json architectures[0] (LlamaForCausalLM...) or GGUF general.architecture (llama...)
    vocab_size: int  # rows of the embedding and of the LM head
    hidden_size: int  # residual stream width
    intermediate_size: int  # SwiGLU inner width
    num_hidden_layers: int  # decoder layers
    num_attention_heads: int  # query heads
    num_key_value_heads: int  # K/V heads (GQA when fewer than query heads)
    head_dim: int  # width of one head (usually hidden_size // num_attention_heads)
    rms_norm_eps: float = 1e-6  # RMSNorm epsilon
    rope_theta: float = 10000.0  # RoPE base
    rope_scaling: dict[str, Any] | None = None  # {"rope_type": ..., params}; None is plain RoPE
    max_position_embeddings: int = 2048  # trained context length
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix
    attention_bias: bool = False  # biases on the Q, K and V projections (Qwen2)
    attention_output_bias: bool = False  # bias on the output projection (Llama with attention_bias)
    sliding_window: int | None = None  # informational: attention here is full; cap max_model_len at it
    hidden_act: str = "silu"  # the MLP activation; only SwiGLU (silu) is implemented
    bos_token_id: int | None = None  # beginning-of-sequence token
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)  # tokens that end generation

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ModelConfigError(f"{name} must be a positive integer, got {value!r}; check the model's config")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_key_value_heads}); the config is inconsistent"
            )
        if self.head_dim % 2:
            raise ModelConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.hidden_act != "silu":
            raise ModelConfigError(
                f"hidden_act {self.hidden_act!r} is not supported; only 'silu' (SwiGLU) models run here"
            )
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ModelConfigError("rope_theta and rms_norm_eps must be positive; check the model's config")
        _validate_rope_scaling(self.rope_scaling, self.head_dim)

    @property
    def num_queries_per_kv(self) -> int:
        """Query heads sharing one K/V head."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf_config(cls, hf_config: Mapping[str, Any]) -> ModelConfig:
        """From a config.json dict (transformers 4.x `rope_scaling` or 5.x `rope_parameters`)."""
        architectures = hf_config.get("architectures") or []
        if not architectures:
            raise ModelConfigError("config.json has no 'architectures' entry; add e.g. [\"LlamaForCausalLM\"]")
        architecture = architectures[0]
        d = {**HF_ARCHITECTURE_DEFAULTS.get(architecture, {}), **hf_config}
        missing = [
            k
            for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
            if d.get(k) is None
        ]
        if missing:
            raise ModelConfigError(f"config.json lacks {missing}; it does not describe a decoder-only transformer")
        if d.get("mlp_bias"):
            raise ModelConfigError("mlp_bias=true is not supported by tandem's Llama implementation")
        num_heads = d["num_attention_heads"]
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        rope_theta = d.get("rope_theta") or rope.pop("rope_theta", None) or 10000.0
        rope.pop("rope_theta", None)
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        rope_scaling = None if rope_type == "default" else {**rope, "rope_type": rope_type}
        use_window = d.get("use_sliding_window", True)
        attention_bias = bool(d.get("attention_bias", False))
        return cls(
            architecture=architecture,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=num_heads,
            num_key_value_heads=d.get("num_key_value_heads") or num_heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // num_heads,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            # Llama's attention_bias covers o_proj too; Qwen2's bias is QKV only (see the defaults table).
            attention_output_bias=bool(d.get("attention_output_bias", attention_bias)),
            sliding_window=d.get("sliding_window") if use_window else None,
            hidden_act=d.get("hidden_act", "silu"),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=_as_ids(d.get("eos_token_id")),
        )

    @classmethod
    def from_gguf(
        cls,
        metadata: Mapping[str, Any],
        tensor_names: Collection[str] = (),
        rope_freq_factors: Sequence[float] | None = None,
    ) -> ModelConfig:
        """From GGUF key/values; `tensor_names` tells biases and tied embeddings,
        `rope_freq_factors` is `rope_freqs`."""
        arch = metadata.get("general.architecture")
        if not arch:
            raise ModelConfigError("the GGUF file has no general.architecture; it is not a model file")

        def get(key: str, default: Any = None) -> Any:
            return metadata.get(f"{arch}.{key}", default)

        missing = [
            k
            for k in ("embedding_length", "feed_forward_length", "block_count", "attention.head_count")
            if get(k) is None
        ]
        if missing:
            raise ModelConfigError(f"the GGUF metadata lacks {[f'{arch}.{k}' for k in missing]}; re-convert the model")
        hidden, num_heads = int(get("embedding_length")), int(get("attention.head_count"))
        vocab_size = get("vocab_size") or len(metadata.get("tokenizer.ggml.tokens") or ())
        scaling_type = get("rope.scaling.type", "none")
        if rope_freq_factors is not None:
            rope_scaling = {"rope_type": "per_frequency", "factors": [float(f) for f in rope_freq_factors]}
        elif scaling_type in ("none", None):
            rope_scaling = None
        elif scaling_type == "linear":
            rope_scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
        else:
            raise ModelConfigError(
                f"GGUF rope scaling {scaling_type!r} is not supported (supported: none, linear, rope_freqs)"
            )
        eos_ids = [
            metadata.get(k)
            for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
        ]
        names = set(tensor_names)
        return cls(
            architecture=arch,
            vocab_size=int(vocab_size),
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_hidden_layers=int(get("block_count")),
            num_attention_heads=num_heads,
            num_key_value_heads=int(get("attention.head_count_kv") or num_heads),
            head_dim=int(get("attention.key_length") or get("rope.dimension_count") or hidden // num_heads),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(get("context_length", 2048)),
            tie_word_embeddings=bool(names) and "output.weight" not in names,
            attention_bias="blk.0.attn_q.bias" in names,
            attention_output_bias="blk.0.attn_output.bias" in names,
            sliding_window=get("attention.sliding_window"),
            bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=tuple(dict.fromkeys(int(i) for i in eos_ids if i is not None)),
        )


def _as_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _validate_rope_scaling(rope_scaling: Mapping[str, Any] | None, head_dim: int) -> None:
    if rope_scaling is None:
        return
    rope_type = rope_scaling.get("rope_type")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelConfigError(
            f"rope_type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "linear" and not rope_scaling.get("factor", 0) > 0:
        raise ModelConfigError("linear rope scaling needs a positive 'factor'")
    if rope_type == "llama3":
        missing = [k for k in LLAMA3_ROPE_KEYS if k not in rope_scaling]
        if missing:
            raise ModelConfigError(f"llama3 rope scaling lacks {missing}; copy them from the model's config.json")
        if rope_scaling["high_freq_factor"] <= rope_scaling["low_freq_factor"]:
            raise ModelConfigError("llama3 rope scaling needs high_freq_factor > low_freq_factor")
    if rope_type == "per_frequency":
        factors = rope_scaling.get("factors") or []
        if len(factors) != head_dim // 2 or not all(math.isfinite(f) and f > 0 for f in factors):
            raise ModelConfigError(f"per_frequency rope needs {head_dim // 2} positive factors, got {len(factors)}")
