"""Gemma 3 (text) over the paged KV cache: the Llama layout with Gemma's differences.

- Norms scale by (1 + weight), in float32; four per layer (before and after attention, before
  and after the MLP), the post norms applied to each block's output before the residual add.
- Embeddings are scaled by sqrt(hidden_size) (rounded to the model's dtype, as transformers does).
- The MLP is GeGLU with tanh-approximated GELU; q and k are RMS-normed per head before rope; the
  query scale is query_pre_attn_scalar ** -0.5.
- Local layers (ModelConfig.local_layers: five of every six) attend to their last `sliding_window`
  positions only, with their own rope base; global layers see the whole context with the model's
  rope (and its scaling). Every layer keeps its whole context in the paged cache: the global layers
  need it, and all layers share one block table per sequence, so the window saves reads, not memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cloud_engine.attention_metadata import AttentionMetadata
from cloud_engine.model.config import ModelConfig
from cloud_engine.model.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, embedding_init
from cloud_engine.model.rotary import RotaryEmbedding


class GemmaRMSNorm(nn.Module):
    """RMSNorm scaled by (1 + weight), all in float32 and cast back, as Gemma's reference computes it."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), self.weight.shape, eps=self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


class Gemma3DecoderLayer(nn.Module):
    """Attention (windowed in local layers) and MLP, each with a norm before and after."""

    def __init__(self, config: ModelConfig, index: int):
        super().__init__()
        self.is_local = index in config.local_layers
        window = config.sliding_window if self.is_local else 0
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, window=window, norm=GemmaRMSNorm)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)
        self.post_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, metadata: AttentionMetadata):
        attended = self.self_attn(self.input_layernorm(hidden), cos, sin, metadata)
        hidden = hidden + self.post_attention_layernorm(attended)
        return hidden + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden)))


class Gemma3Model(nn.Module):
    """Embeddings, decoder layers and the final norm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size, _weight=embedding_init(config.vocab_size, config.hidden_size)
        )
        self.layers = nn.ModuleList(Gemma3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)


class Gemma3ForCausalLM(LlamaForCausalLM):
    """Gemma 3's text model; loading, packing, KV binding and logits as in LlamaForCausalLM."""

    body_class = Gemma3Model

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.local_rotary = RotaryEmbedding(config.rotary_dim, config.rope_local_theta or config.rope_theta, None)
        self.embed_scale = config.hidden_size**0.5

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:
        """[num_tokens] ids and positions -> [num_tokens, hidden_size] after the final norm."""
        hidden = self.model.embed_tokens(input_ids)
        hidden = hidden * torch.tensor(self.embed_scale, dtype=hidden.dtype, device=hidden.device)
        # Two rope tables per step, each shared by the layers of its kind.
        global_rope = self.rotary.cos_sin(positions, hidden.dtype)
        local_rope = self.local_rotary.cos_sin(positions, hidden.dtype)
        for layer in self.model.layers:
            cos, sin = local_rope if layer.is_local else global_rope
            hidden = layer(hidden, cos, sin, attn_metadata)
        return self.model.norm(hidden)
