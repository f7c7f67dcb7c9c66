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
# Architectures whose sliding-window layers are enforced (the others' windows only cap the context).
SLIDING_WINDOW_ARCHITECTURES = ("Gemma3ForCausalLM", "gemma3")
# Gemma 3: five local layers, then a global one; llama.cpp assumes the same for its GGUFs, which do not say.
GEMMA3_SLIDING_WINDOW_PATTERN = 6
GEMMA3_LOCAL_ROPE_THETA = 10000.0
# The gated MLP's activations (HF names): SwiGLU, and Gemma's tanh-approximated GeGLU.
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")

# What a key missing from config.json means for an architecture (Qwen2 always has QKV bias; Qwen3 and
# Qwen3-MoE and Gemma 3 always norm each head's q and k; Mixtral renormalises its top-k router weights).
HF_ARCHITECTURE_DEFAULTS: dict[str, dict[str, Any]] = {
    "Qwen2ForCausalLM": {"attention_bias": True, "attention_output_bias": False},
    "Qwen3ForCausalLM": {"qk_norm": True},
    "Qwen3MoeForCausalLM": {"qk_norm": True},
    "MixtralForCausalLM": {"norm_topk_prob": True},
    "Gemma3ForCausalLM": {"qk_norm": True, "hidden_activation": "gelu_pytorch_tanh"},
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
    # The attention window of the layers in local_layers (Gemma 3); with no local layers it is informational
    # (attention here is full) and the engine caps max_model_len at it.
    sliding_window: int | None = None
    local_layers: tuple[int, ...] = ()  # layers attending only to their last sliding_window positions
    rope_local_theta: float | None = None  # RoPE base of the local layers (Gemma 3), unscaled; None: rope_theta
    query_pre_attn_scalar: float | None = None  # attention scale is its -1/2 power (Gemma 3); None: head_dim
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap) when set
    hidden_act: str = "silu"  # the gated MLP's activation: silu (SwiGLU) or gelu_pytorch_tanh (GeGLU, Gemma)
    qk_norm: bool = False  # RMSNorm over each head's q and k before rope (Qwen3)
    partial_rotary_factor: float = 1.0  # share of each head's dimensions rope rotates (Phi-3/Phi-4-mini)
    # Mixture of experts (Qwen3-MoE, Mixtral); num_experts = 0 is a dense model.
    num_experts: int = 0  # experts per MoE layer
    num_experts_per_tok: int = 0  # experts each token is routed to (top-k)
    moe_intermediate_size: int = 0  # one expert's SwiGLU inner width
    norm_topk_prob: bool = False  # renormalise the top-k router weights to sum to one
    moe_layers: tuple[int, ...] = ()  # which layers are MoE (the others keep the dense MLP)
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
        if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim % 2:
            raise ModelConfigError(
                f"partial_rotary_factor {self.partial_rotary_factor} must leave an even number of rotated "
                f"dimensions in (0, head_dim = {self.head_dim}]; check the model's config"
            )
        _validate_experts(self)
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ModelConfigError(
                f"hidden_act {self.hidden_act!r} is not supported; supported: {', '.join(SUPPORTED_ACTIVATIONS)}"
            )
        if self.local_layers and not (self.sliding_window and self.sliding_window > 0):
            raise ModelConfigError("the config names sliding-window layers but no positive sliding_window")
        if any(not 0 <= i < self.num_hidden_layers for i in self.local_layers):
            raise ModelConfigError(
                f"local_layers {self.local_layers} name layers outside 0..{self.num_hidden_layers - 1}"
            )
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ModelConfigError("rope_theta and rms_norm_eps must be positive; check the model's config")
        _validate_rope_scaling(self.rope_scaling, self.rotary_dim)

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head that rope rotates (the first ones; the rest pass through)."""
        return int(self.head_dim * self.partial_rotary_factor)

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
        if d.get("attn_logit_softcapping"):
            raise ModelConfigError(
                "attn_logit_softcapping (Gemma 2) is not supported: tandem's attention kernels do not cap scores"
            )
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        local_rope = {}
        if "full_attention" in rope:  # transformers 5 keeps one rope per layer type (Gemma 3)
            local_rope, rope = dict(rope.get("sliding_attention") or {}), dict(rope["full_attention"])
        rope_theta = d.get("rope_theta") or rope.pop("rope_theta", None) or 10000.0
        rope.pop("rope_theta", None)
        # transformers 5 moved partial_rotary_factor into rope_parameters; checkpoints keep it at the top.
        partial_rotary = rope.pop("partial_rotary_factor", None) or d.get("partial_rotary_factor") or 1.0
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        rope_scaling = None if rope_type == "default" else {**rope, "rope_type": rope_type}
        use_window = d.get("use_sliding_window", True)
        attention_bias = bool(d.get("attention_bias", False))
        local_layers = _hf_local_layers(d)
        local_theta = d.get("rope_local_base_freq") or local_rope.get("rope_theta")
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
            sliding_window=d.get("sliding_window") if use_window or local_layers else None,
            local_layers=local_layers,
            rope_local_theta=float(local_theta) if local_theta else None,
            query_pre_attn_scalar=d.get("query_pre_attn_scalar"),
            final_logit_softcapping=d.get("final_logit_softcapping"),
            hidden_act=d.get("hidden_activation") or d.get("hidden_act", "silu"),
            qk_norm=bool(d.get("qk_norm", False)),
            partial_rotary_factor=float(partial_rotary),
            **_hf_experts(d),
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
        if "rope_factors_long.weight" in names:
            raise ModelConfigError(
                "rope type 'longrope' (Phi-3's long-context rope, rope_factors_long in the GGUF) is not supported; "
                "use the model's short-context variant (e.g. Phi-3-mini-4k)"
            )
        # Partial rotary (Phi-3/Phi-4-mini): rope.dimension_count is the rotated share of a head; absent, all of it.
        rotated = int(get("rope.dimension_count") or 0)
        head_dim = int(get("attention.key_length") or max(hidden // num_heads, rotated))
        rotary_dim = rotated or head_dim
        num_layers = int(get("block_count"))
        gemma = arch in SLIDING_WINDOW_ARCHITECTURES
        return cls(
            architecture=arch,
            vocab_size=int(vocab_size),
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=int(get("attention.head_count_kv") or num_heads),
            head_dim=head_dim,
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(get("context_length", 2048)),
            tie_word_embeddings=bool(names) and "output.weight" not in names,
            attention_bias="blk.0.attn_q.bias" in names,
            attention_output_bias="blk.0.attn_output.bias" in names,
            sliding_window=get("attention.sliding_window"),
            **(_gguf_gemma3(get, num_layers, head_dim, hidden // num_heads) if gemma else {}),
            qk_norm="blk.0.attn_q_norm.weight" in names,
            partial_rotary_factor=rotary_dim / head_dim,
            **_gguf_experts(get, num_layers, names),
            bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=tuple(dict.fromkeys(int(i) for i in eos_ids if i is not None)),
        )


def _as_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _validate_rope_scaling(rope_scaling: Mapping[str, Any] | None, rotary_dim: int) -> None:
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
        if len(factors) != rotary_dim // 2 or not all(math.isfinite(f) and f > 0 for f in factors):
            raise ModelConfigError(f"per_frequency rope needs {rotary_dim // 2} positive factors, got {len(factors)}")


def _hf_experts(d: Mapping[str, Any]) -> dict[str, Any]:
    """The mixture-of-experts fields of a config.json: Qwen3-MoE (`num_experts`, or transformers 5's
    `num_local_experts`; `decoder_sparse_step` and `mlp_only_layers` pick its MoE layers) and Mixtral
    (every layer, each expert as wide as `intermediate_size`). A dense model gets none."""
    num_experts = int(d.get("num_experts") or d.get("num_local_experts") or 0)
    if not num_experts:
        return {}
    step = int(d.get("decoder_sparse_step") or 1)
    dense_layers = set(d.get("mlp_only_layers") or ())
    layers = tuple(i for i in range(d["num_hidden_layers"]) if i not in dense_layers and (i + 1) % step == 0)
    return dict(
        num_experts=num_experts,
        num_experts_per_tok=int(d.get("num_experts_per_tok") or 0),
        moe_intermediate_size=int(d.get("moe_intermediate_size") or d["intermediate_size"]),
        norm_topk_prob=bool(d.get("norm_topk_prob", False)),
        moe_layers=layers,
    )


def _gguf_experts(get, num_layers: int, tensor_names: Collection[str]) -> dict[str, Any]:
    """The mixture-of-experts fields of GGUF metadata (`expert_count`; Mixtral is a `llama` GGUF with
    experts, whose experts are `feed_forward_length` wide); a layer is MoE where it has a router."""
    num_experts = int(get("expert_count") or 0)
    if not num_experts:
        return {}
    return dict(
        num_experts=num_experts,
        num_experts_per_tok=int(get("expert_used_count") or 0),
        moe_intermediate_size=int(get("expert_feed_forward_length") or get("feed_forward_length")),
        # llama.cpp renormalises the top-k weights of both families unless the file says otherwise.
        norm_topk_prob=bool(get("expert_weights_norm", True)),
        moe_layers=tuple(i for i in range(num_layers) if f"blk.{i}.ffn_gate_inp.weight" in tensor_names),
    )


def _validate_experts(config: ModelConfig) -> None:
    if not config.num_experts:
        if config.moe_layers:
            raise ModelConfigError("moe_layers is set but num_experts is 0; check the model's config")
        return
    if not 0 < config.num_experts_per_tok <= config.num_experts:
        raise ModelConfigError(
            f"num_experts_per_tok must be in 1..num_experts ({config.num_experts}), got {config.num_experts_per_tok}"
        )
    if config.moe_intermediate_size <= 0:
        raise ModelConfigError(f"moe_intermediate_size must be positive, got {config.moe_intermediate_size}")
    if any(not 0 <= i < config.num_hidden_layers for i in config.moe_layers):
        raise ModelConfigError(f"moe_layers {config.moe_layers} name layers outside 0..{config.num_hidden_layers - 1}")


def _hf_local_layers(d: Mapping[str, Any]) -> tuple[int, ...]:
    """The sliding-window layers of a config.json: its `layer_types` (transformers 5), else Gemma 3's
    pattern (every `sliding_window_pattern`-th layer global, the others local). Only Gemma 3 is read
    this way; other families' windows stay informational (ModelConfig.sliding_window)."""
    if d.get("architectures", [None])[0] not in SLIDING_WINDOW_ARCHITECTURES:
        return ()
    types = d.get("layer_types")
    if types:
        return tuple(i for i, kind in enumerate(types) if kind == "sliding_attention")
    pattern = d.get("sliding_window_pattern") or d.get("_sliding_window_pattern") or GEMMA3_SLIDING_WINDOW_PATTERN
    return tuple(i for i in range(d["num_hidden_layers"]) if (i + 1) % pattern)


def _gguf_gemma3(get, num_layers: int, head_dim: int, hidden_per_head: int) -> dict[str, Any]:
    """What a Gemma 3 GGUF leaves to the reader, taken as llama.cpp takes it: the layer pattern (the
    file's `attention.sliding_window_pattern`, a list or a period, where it has one; else every sixth
    layer global),
    the local layers' rope base, the query scale (head_dim; hidden / heads for the 62-layer 27B)."""
    pattern = get("attention.sliding_window_pattern")
    if isinstance(pattern, list) and len(pattern) == num_layers:
        local = tuple(i for i, is_local in enumerate(pattern) if is_local)
    else:
        period = pattern if isinstance(pattern, int) and pattern > 0 else GEMMA3_SLIDING_WINDOW_PATTERN
        local = tuple(i for i in range(num_layers) if (i + 1) % period)
    return dict(
        local_layers=local,
        rope_local_theta=float(get("rope.freq_base_swa") or GEMMA3_LOCAL_ROPE_THETA),
        query_pre_attn_scalar=float(hidden_per_head if num_layers == 62 else head_dim),
        final_logit_softcapping=get("final_logit_softcapping"),
        hidden_act="gelu_pytorch_tanh",
    )
