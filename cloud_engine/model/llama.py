"""The Llama family (Llama 2/3, SmolLM2, Mistral, Qwen2/2.5) over the paged KV cache.

Differences between family members live in ModelConfig (QKV bias, tied embeddings,
rope scaling), not in subclasses. Q/K/V and gate/up are fused into one matmul each;
`load_weights` splits checkpoint tensors into them through STACKED_PARAMS.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from cloud_engine.attention import paged_attention
from cloud_engine.attention_metadata import AttentionMetadata
from cloud_engine.model.config import ModelConfig
from cloud_engine.model.packed_linear import PackedLinear, can_pack, pack_linears, warm_up_packed_linears
from cloud_engine.model.rotary import RotaryEmbedding, apply_rotary

# Checkpoint module name -> (our fused module, shard index within it).
STACKED_PARAMS: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
# Checkpoint tensors that carry nothing we need (old HF checkpoints saved rope tables).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightLoadError(ValueError):
    """Checkpoint tensors do not match the model built from its config."""


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 and scaled in the model dtype, as HF does."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One fused op instead of five: per-op dispatch is a large share of a small decode step on CPU.
        normed = F.rms_norm(x.float(), self.weight.shape, eps=self.eps)
        return self.weight * normed.to(x.dtype)


class LlamaAttention(nn.Module):
    """Fused QKV projection, RoPE, paged attention over this layer's cache, output projection."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        self.qkv_sizes = [self.num_heads * self.head_dim] + [self.num_kv_heads * self.head_dim] * 2
        self.qkv_proj = nn.Linear(config.hidden_size, sum(self.qkv_sizes), bias=config.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.attention_output_bias)
        self.scale = self.head_dim**-0.5
        self.kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None  # set by bind_kv_caches

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, metadata: AttentionMetadata):
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        num_rotated = self.num_heads + self.num_kv_heads
        # Q and K heads are adjacent columns: rotate them in one call (half the elementwise ops).
        qk = apply_rotary(qkv[:, : num_rotated * self.head_dim].view(num_tokens, num_rotated, self.head_dim), cos, sin)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, num_rotated * self.head_dim :].view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.kv_cache is None:
            raise RuntimeError("no KV cache bound: call model.bind_kv_caches(...) before forward")
        out = paged_attention(q, k, v, self.kv_cache[0], self.kv_cache[1], metadata, self.scale)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) with gate and up fused."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks with residual connections."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, metadata: AttentionMetadata):
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, metadata)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


def _embedding_init(num_embeddings: int, dim: int) -> torch.Tensor:
    """nn.Embedding's own init (normal_), except on the meta device (build_model): there normal_
    computes nothing yet imports torch._dynamo (~2 s of the cloud tier's start on 2 cores), which
    nothing else the engine does needs."""
    weight = torch.empty(num_embeddings, dim)
    return weight if weight.is_meta else nn.init.normal_(weight)


class LlamaModel(nn.Module):
    """Embeddings, decoder layers and the final norm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size, _weight=_embedding_init(config.vocab_size, config.hidden_size)
        )
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """forward(input_ids, positions, attn_metadata) -> final-normed hidden states; compute_logits -> float32."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        # Tied models have no lm_head module: the embedding matrix is read directly, so
        # the tie survives meta-device construction and device moves.
        self.lm_head = (
            None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        self.packed_lm_head: PackedLinear | None = None  # set by pack_for_cpu

    def bind_kv_caches(self, kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Give each layer its (key_cache, value_cache), each [num_blocks, block_size, num_kv_heads, head_dim]."""
        layers = self.model.layers
        if len(kv_caches) != len(layers):
            raise ValueError(f"got {len(kv_caches)} KV cache pairs for a model with {len(layers)} layers")
        expected = (self.config.num_key_value_heads, self.config.head_dim)
        dtype = self.model.embed_tokens.weight.dtype
        for i, (layer, (key_cache, value_cache)) in enumerate(zip(layers, kv_caches)):
            if key_cache.dim() != 4 or tuple(key_cache.shape[2:]) != expected or key_cache.shape != value_cache.shape:
                raise ValueError(
                    f"layer {i}: KV caches must both be [num_blocks, block_size, {expected[0]}, {expected[1]}], "
                    f"got {tuple(key_cache.shape)} and {tuple(value_cache.shape)}"
                )
            if key_cache.dtype != dtype or value_cache.dtype != dtype:
                raise ValueError(
                    f"layer {i}: KV caches are {key_cache.dtype}/{value_cache.dtype}, the model is {dtype}; "
                    "allocate them in the model's dtype"
                )
            layer.self_attn.kv_cache = (key_cache, value_cache)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:
        """[num_tokens] ids and positions -> [num_tokens, hidden_size] after the final norm."""
        hidden = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, hidden.dtype)  # once per step, shared by every layer
        for layer in self.model.layers:
            hidden = layer(hidden, cos, sin, attn_metadata)
        return self.model.norm(hidden)

    def pack_for_cpu(self) -> int:
        """Pre-pack every linear weight (and the LM head) for oneDNN; call after load_weights.

        Only for bf16 on CPU (see packed_linear); returns the number of packed layers, 0 when
        packing does not apply. Weights can no longer be loaded afterwards.
        """
        weight = self.model.embed_tokens.weight
        if not can_pack(weight.device, weight.dtype):
            return 0
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        self.packed_lm_head = PackedLinear(head, None)
        if self.lm_head is not None:
            self.lm_head = None  # the packed copy replaces it; tied models keep the embedding for lookups
        return pack_linears(self.model) + 1

    def warm_up_packed(self, max_tokens: int, max_logit_rows: int) -> int:
        """Have oneDNN build the primitives of every row bucket now (see packed_linear): the layers
        see up to `max_tokens` rows a step, the LM head `max_logit_rows`. 0 when nothing is packed."""
        if self.packed_lm_head is None:
            return 0
        body = [m for m in self.model.modules() if isinstance(m, PackedLinear)]
        return warm_up_packed_linears(body, max_tokens) + warm_up_packed_linears([self.packed_lm_head], max_logit_rows)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[rows, hidden_size] -> float32 [rows, vocab_size]."""
        if self.packed_lm_head is not None:
            return self.packed_lm_head(hidden_states).float()
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden_states, weight).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy (HF checkpoint name, tensor) pairs into the parameters; raise on unknown, misshaped or missing ones."""
        params = dict(self.named_parameters())
        shard_sizes = {
            "qkv_proj": self.model.layers[0].self_attn.qkv_sizes if self.model.layers else [],
            "gate_up_proj": [self.config.intermediate_size] * 2,
        }
        expected = {(name, shard) for name in params for shard in range(_num_shards(name, shard_sizes))}
        loaded: set[tuple[str, int]] = set()
        for name, tensor in weights:
            if name.endswith(IGNORED_SUFFIXES) or (self.lm_head is None and name == "lm_head.weight"):
                continue
            parts = name.split(".")
            fused = STACKED_PARAMS.get(parts[-2]) if len(parts) >= 2 else None
            if fused is not None:
                parts[-2], shard = fused
                target_name = ".".join(parts)
            else:
                target_name, shard = name, 0
            param = params.get(target_name)
            if param is None:
                raise WeightLoadError(
                    f"checkpoint tensor {name!r} has no place in {type(self).__name__} "
                    f"built from this config; is the architecture right?"
                )
            target = param.data
            if fused is not None:
                sizes = shard_sizes[parts[-2]]
                target = target.narrow(0, sum(sizes[:shard]), sizes[shard])
            if tuple(tensor.shape) != tuple(target.shape):
                raise WeightLoadError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"the config implies {tuple(target.shape)}"
                )
            target.copy_(tensor)
            loaded.add((target_name, shard))
        missing = sorted({name for name, _ in expected - loaded})
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise WeightLoadError(f"the checkpoint lacks {shown}; it is incomplete or for another architecture")


def _num_shards(param_name: str, shard_sizes: dict[str, list[int]]) -> int:
    module = param_name.split(".")[-2] if "." in param_name else ""
    return len(shard_sizes[module]) if module in shard_sizes else 1
