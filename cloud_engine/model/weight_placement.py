"""Where a checkpoint tensor goes in the model: fused projections and stacked experts.

Checkpoints store Q, K and V (and gate and up) as separate matrices, and each expert's as its
own; the model fuses them into one matmul each and stacks the experts for grouped matmuls. So a
checkpoint tensor fills a part of a parameter: a shard (a run of rows of a fused matrix), an
expert (one index of a stacked one), or both. Checkpoints that store them fused already (Phi-3's
`qkv_proj` and `gate_up_proj`, transformers 5's stacked experts, GGUF's expert stacks) fill
several parts at once. Every part must be filled exactly by the end, or the load fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

# Checkpoint projection -> (our fused projection, its shard).
FUSED_SHARDS: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
FUSED = ("qkv_proj", "gate_up_proj")
# Checkpoint tensors that carry nothing we need (old HF checkpoints saved rope tables).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightLoadError(ValueError):
    """Checkpoint tensors do not match the model built from its config."""


@dataclass(frozen=True)
class Placement:
    """The part of a parameter one checkpoint tensor fills."""

    param: str  # our parameter's name
    expert: int | None  # index into a stacked-experts parameter; None: all of them, or not stacked
    shard: int | None  # shard of a fused parameter; None: all of them, or not fused


def place(name: str) -> Placement:
    """Where the checkpoint tensor `name` (an HF name) goes."""
    parts = name.split(".")
    # One expert's matrix: ...experts.{e}.{gate,up,down}_proj.weight
    if len(parts) >= 4 and parts[-4] == "experts" and parts[-3].isdigit() and parts[-1] == "weight":
        prefix, expert, projection = parts[:-3], int(parts[-3]), parts[-2]
        fused, shard = FUSED_SHARDS.get(projection, (projection, None))
        return Placement(".".join([*prefix, fused]), expert, shard)
    # Every expert's gate or up matrix in one stack (GGUF's ffn_gate_exps, ffn_up_exps).
    if len(parts) >= 2 and parts[-2] == "experts" and parts[-1] in ("gate_proj", "up_proj"):
        fused, shard = FUSED_SHARDS[parts[-1]]
        return Placement(".".join([*parts[:-1], fused]), None, shard)
    if len(parts) >= 2 and parts[-2] in FUSED_SHARDS:
        fused, shard = FUSED_SHARDS[parts[-2]]
        return Placement(".".join([*parts[:-2], fused, parts[-1]]), None, shard)
    return Placement(name, None, None)


def _is_stacked(param_name: str) -> bool:
    return ".experts." in param_name and not param_name.endswith((".weight", ".bias"))


def _fused_name(param_name: str) -> str | None:
    parts = param_name.split(".")
    module = parts[-1] if _is_stacked(param_name) else parts[-2] if len(parts) >= 2 else ""
    return module if module in FUSED else None


def load_checkpoint_tensors(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    qkv_sizes: list[int],
    skip: Callable[[str], bool] = lambda name: False,
) -> None:
    """Copy (HF name, tensor) pairs into `model`'s parameters; raise WeightLoadError on an unknown,
    misshaped or missing one. `qkv_sizes` are the rows of Q, K and V in a fused qkv_proj; `skip` names
    checkpoint tensors the model does not keep (a tied model's lm_head)."""
    params = dict(model.named_parameters())

    def shard_sizes(param_name: str, param: torch.Tensor) -> list[int] | None:
        fused = _fused_name(param_name)
        if fused == "qkv_proj":
            return qkv_sizes
        if fused == "gate_up_proj":
            return [param.shape[-2 if _is_stacked(param_name) else 0] // 2] * 2
        return None

    def parts(param_name: str, param: torch.Tensor, expert: int | None = None, shard: int | None = None):
        experts = [expert] if expert is not None else range(param.shape[0]) if _is_stacked(param_name) else [None]
        sizes = shard_sizes(param_name, param)
        shards = [shard] if shard is not None else range(len(sizes)) if sizes else [None]
        return {(param_name, e, s) for e in experts for s in shards}

    expected = set().union(*(parts(name, param) for name, param in params.items()))
    loaded: set[tuple[str, int | None, int | None]] = set()
    for name, tensor in weights:
        if name.endswith(IGNORED_SUFFIXES) or skip(name):
            continue
        placement = place(name)
        param = params.get(placement.param)
        if param is None or (placement.expert is not None and not _is_stacked(placement.param)):
            raise WeightLoadError(
                f"checkpoint tensor {name!r} has no place in {type(model).__name__} "
                f"built from this config; is the architecture right?"
            )
        target = param.data
        if placement.expert is not None:
            if not 0 <= placement.expert < target.shape[0]:
                raise WeightLoadError(f"checkpoint tensor {name!r} names an expert the config does not have")
            target = target[placement.expert]
        if placement.shard is not None:
            sizes = shard_sizes(placement.param, param)
            dim = 1 if _is_stacked(placement.param) and placement.expert is None else 0
            target = target.narrow(dim, sum(sizes[: placement.shard]), sizes[placement.shard])
        if tuple(tensor.shape) != tuple(target.shape):
            raise WeightLoadError(
                f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, the config implies {tuple(target.shape)}"
            )
        target.copy_(tensor)
        loaded |= parts(placement.param, param, placement.expert, placement.shard)
    missing = sorted({name for name, _, _ in expected - loaded})
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise WeightLoadError(f"the checkpoint lacks {shown}; it is incomplete or for another architecture")
