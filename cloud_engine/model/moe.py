"""A mixture-of-experts feed-forward block (Qwen3-MoE, Mixtral): a top-k router over SwiGLU experts.

The experts' weights are stacked, [num_experts, 2 x inner, hidden] for gate and up and
[num_experts, hidden, inner] for down, and each step runs them as grouped matmuls
(`torch._grouped_mm`, the op torch's own MoE layers use): every (token, expert) pair the router
picks becomes one row, the rows sorted by expert, each expert's run of rows multiplied by that
expert's matrix. No Python loop over tokens or experts and no data-dependent shapes (a step of T
tokens always has T x top_k rows), so the same code runs eager and inside the compiled step (there
through an opaque op: torch's compile-time check of the grouped matmul accepts bfloat16 only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import cloud_engine.custom_ops  # noqa: F401  (registers tandem::grouped_mm for the compiled step)
from cloud_engine.model.config import ModelConfig


class StackedExperts(nn.Module):
    """The experts' SwiGLU weights, one stacked tensor per projection (checkpoint names `experts.gate_up_proj`
    and `experts.down_proj`; per-expert checkpoint tensors are placed into them by the loader)."""

    def __init__(self, num_experts: int, hidden_size: int, inner_size: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inner_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, inner_size))

    def forward(self, rows: torch.Tensor, group_ends: torch.Tensor) -> torch.Tensor:
        """rows [n, hidden] sorted by expert, group_ends [num_experts] int32 (one past each expert's last row)."""
        gate_up = _grouped_mm(rows, self.gate_up_proj.transpose(-2, -1), group_ends)
        gate, up = gate_up.chunk(2, dim=-1)
        return _grouped_mm(F.silu(gate) * up, self.down_proj.transpose(-2, -1), group_ends)


def _grouped_mm(rows: torch.Tensor, weights: torch.Tensor, group_ends: torch.Tensor) -> torch.Tensor:
    if torch.compiler.is_compiling():  # one opaque op in the compiled step (cloud_engine.custom_ops)
        return torch.ops.tandem.grouped_mm(rows, weights, group_ends)
    return torch._grouped_mm(rows, weights, offs=group_ends)


class SparseMoeBlock(nn.Module):
    """Route each token to its top-k experts and sum their outputs, weighted by the router."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_experts, self.top_k = config.num_experts, config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)  # the router
        self.experts = StackedExperts(config.num_experts, config.hidden_size, config.moe_intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Router probabilities in float32, as the reference implementations compute them.
        probs = F.softmax(self.gate(x).float(), dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        flat_experts = experts.reshape(-1)
        order = flat_experts.argsort(stable=True)  # rows grouped by expert
        token_of_row = order // self.top_k
        # Rows per expert by a scatter rather than bincount, whose length depends on the data.
        counts = torch.zeros(self.num_experts, dtype=torch.int64, device=x.device)
        counts.index_add_(0, flat_experts, torch.ones_like(flat_experts))
        group_ends = counts.cumsum(0).to(torch.int32)
        out_rows = self.experts(x.index_select(0, token_of_row), group_ends)
        out_rows = out_rows * weights.reshape(-1)[order].to(x.dtype)[:, None]
        return torch.zeros_like(x).index_add_(0, token_of_row, out_rows)
