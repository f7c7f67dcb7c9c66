"""The Llama family over the paged KV cache: Llama 2/3, SmolLM2, Mistral, Qwen2/2.5, Qwen3, Phi-3/Phi-4-mini,
and their mixture-of-experts kin (Qwen3-MoE, Mixtral).

Differences between family members live in ModelConfig (QKV bias, tied embeddings, rope scaling,
per-head q/k norms, partial rotary, experts), not in subclasses. Q/K/V and gate/up are fused into
one matmul each; `load_weights` places checkpoint tensors into them (weight_placement).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from cloud_engine.attention import paged_attention
from cloud_engine.attention_metadata import AttentionMetadata
from cloud_engine.kv_quant import cache_row_width
from cloud_engine.model.config import ModelConfig
from cloud_engine.model.moe import SparseMoeBlock
from cloud_engine.model.int8_linear import Int8Linear, quantize_linears
from cloud_engine.model.packed_linear import PackedLinear, can_pack, pack_linears, warm_up_packed_linears
from cloud_engine.model.rotary import RotaryEmbedding, apply_rotary
from cloud_engine.model.weight_placement import load_checkpoint_tensors


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
    """Fused QKV projection, RoPE, paged attention over this layer's cache (its last `window` positions
    when window > 0), output projection. `norm` is the per-head q/k norm's class where the config has one."""

    def __init__(self, config: ModelConfig, window: int = 0, norm: type[nn.Module] = RMSNorm):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        self.qkv_sizes = [self.num_heads * self.head_dim] + [self.num_kv_heads * self.head_dim] * 2
        self.qkv_proj = nn.Linear(config.hidden_size, sum(self.qkv_sizes), bias=config.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.attention_output_bias)
        self.scale = (config.query_pre_attn_scalar or self.head_dim) ** -0.5
        self.window = window
        # Qwen3, Gemma 3: each head's q and k RMS-normed over the head before rope.
        self.q_norm = norm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = norm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None  # set by bind_kv_caches

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, metadata: AttentionMetadata):
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        num_rotated = self.num_heads + self.num_kv_heads
        qk = qkv[:, : num_rotated * self.head_dim].view(num_tokens, num_rotated, self.head_dim)
        if self.q_norm is not None:
            qk = torch.cat((self.q_norm(qk[:, : self.num_heads]), self.k_norm(qk[:, self.num_heads :])), dim=1)
        # Q and K heads are adjacent columns: rotate them in one call (half the elementwise ops).
        qk = apply_rotary(qk, cos, sin)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, num_rotated * self.head_dim :].view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.kv_cache is None:
            raise RuntimeError("no KV cache bound: call model.bind_kv_caches(...) before forward")
        out = paged_attention(q, k, v, self.kv_cache[0], self.kv_cache[1], metadata, self.scale, self.window)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    """A gated MLP, down(act(gate(x)) * up(x)) with gate and up fused: SwiGLU (silu), or GeGLU with
    tanh-approximated GELU (Gemma)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.tanh_gelu = config.hidden_act == "gelu_pytorch_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        gate = F.gelu(gate, approximate="tanh") if self.tanh_gelu else F.silu(gate)
        return self.down_proj(gate * up)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and feed-forward blocks with residual connections; the feed-forward block is a
    mixture of experts in the layers the config names."""

    def __init__(self, config: ModelConfig, index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SparseMoeBlock(config) if index in config.moe_layers else LlamaMLP(config)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, metadata: AttentionMetadata):
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, metadata)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


def embedding_init(num_embeddings: int, dim: int) -> torch.Tensor:
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
            config.vocab_size, config.hidden_size, _weight=embedding_init(config.vocab_size, config.hidden_size)
        )
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """forward(input_ids, positions, attn_metadata) -> final-normed hidden states; compute_logits -> float32."""

    body_class: type[nn.Module] = LlamaModel  # embeddings, layers, final norm (a family may bring its own)

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = self.body_class(config)
        # Tied models have no lm_head module: the embedding matrix is read directly, so
        # the tie survives meta-device construction and device moves.
        self.lm_head = (
            None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        self.rotary = RotaryEmbedding(config.rotary_dim, config.rope_theta, config.rope_scaling)
        # The LM head as a faster layer, when one replaces the plain matmul: set by pack_for_cpu or quantize_weights.
        self.head_linear: PackedLinear | Int8Linear | None = None

    def bind_kv_caches(self, kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Give each layer its (key_cache, value_cache), each [num_blocks, block_size, num_kv_heads, head_dim] in the
        model's dtype, or int8 [..., head_dim + 2] (quantized rows, cloud_engine.kv_quant)."""
        layers = self.model.layers
        if len(kv_caches) != len(layers):
            raise ValueError(f"got {len(kv_caches)} KV cache pairs for a model with {len(layers)} layers")
        dtype = self.model.embed_tokens.weight.dtype
        for i, (layer, (key_cache, value_cache)) in enumerate(zip(layers, kv_caches)):
            if key_cache.dtype not in (dtype, torch.int8) or value_cache.dtype != key_cache.dtype:
                raise ValueError(
                    f"layer {i}: KV caches are {key_cache.dtype}/{value_cache.dtype}, the model is {dtype}; "
                    "allocate them both in the model's dtype or both in int8"
                )
            expected = (self.config.num_key_value_heads, cache_row_width(self.config.head_dim, key_cache.dtype))
            if key_cache.dim() != 4 or tuple(key_cache.shape[2:]) != expected or key_cache.shape != value_cache.shape:
                raise ValueError(
                    f"layer {i}: KV caches must both be [num_blocks, block_size, {expected[0]}, {expected[1]}], "
                    f"got {tuple(key_cache.shape)} and {tuple(value_cache.shape)}"
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
        self._replace_lm_head(PackedLinear)
        return pack_linears(self.model) + 1

    def quantize_weights(self) -> int:
        """Hold every linear weight (and the LM head) in int8 with a scale per output channel
        ([cloud] weight_dtype = int8, cloud_engine.model.int8_linear); call after load_weights, instead of
        pack_for_cpu. Returns the number of int8 layers. A mixture's router stays in the model's dtype: it makes
        discrete choices from few, close logits. Its stacked experts stay too (no grouped int8 matmul here).

        The LM head is included by measurement: it is the largest matmul of a decode step (SmolLM2-135M: 49152 x
        576), and int8 took 0.13-0.66 of float32 F.linear's time at 1-100 rows on a 2-core AVX2 EPYC (its quality:
        bench.kv_precision's weights rows). A tied model keeps its embedding for lookups beside the int8 copy."""
        self._replace_lm_head(Int8Linear)
        return quantize_linears(self.model, keep=lambda name: name.endswith("mlp.gate")) + 1

    def _replace_lm_head(self, layer_class) -> None:
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        self.head_linear = layer_class(head, None)
        if self.lm_head is not None:
            self.lm_head = None  # the copy replaces it; tied models keep the embedding for lookups

    def warm_up_packed(self, max_tokens: int, max_logit_rows: int) -> int:
        """Have oneDNN build the primitives of every row bucket now (see packed_linear): the layers
        see up to `max_tokens` rows a step, the LM head `max_logit_rows`. 0 when nothing is packed."""
        if not isinstance(self.head_linear, PackedLinear):
            return 0
        body = [m for m in self.model.modules() if isinstance(m, PackedLinear)]
        return warm_up_packed_linears(body, max_tokens) + warm_up_packed_linears([self.head_linear], max_logit_rows)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[rows, hidden_size] -> float32 [rows, vocab_size] (soft-capped where the config says)."""
        if self.head_linear is not None:
            logits = self.head_linear(hidden_states).float()
        else:
            weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
            logits = F.linear(hidden_states, weight).float()
        cap = self.config.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy (HF checkpoint name, tensor) pairs into the parameters; raise on unknown, misshaped or missing ones."""
        qkv_sizes = self.model.layers[0].self_attn.qkv_sizes if self.model.layers else []
        tied = self.lm_head is None
        load_checkpoint_tensors(self, weights, qkv_sizes, skip=lambda name: tied and name == "lm_head.weight")
