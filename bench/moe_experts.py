"""What the cloud engine's mixture-of-experts block costs: grouped matmuls against a loop over experts.

    python -m bench.moe_experts [--quick|--smoke] [--dtype auto|float32|bfloat16] --json bench/results/moe_experts.json

cloud_engine.model.moe runs the experts as two grouped matmuls (`torch._grouped_mm` over the
(token, expert) rows sorted by expert): no Python loop and no data-dependent shapes, so the same
code runs inside the compiled step. The usual alternative, and what transformers' Qwen3-MoE does,
is a Python loop over the experts the router hit, each multiplying its gathered rows. This bench
times both on the same block and the same router choices, in-process, at the shapes the engine
runs: one token (a one-sequence decode step), 32 (a decode step at 32 sequences) and 512 (a
prefill chunk, max_num_batched_tokens). Beside them, the same multiply-adds as one dense matmul
(T x top_k rows through one expert's weights): what the experts would cost with no routing at all.

The block is bench.random_model's Qwen3-MoE at SmolLM2-135M's dimensions (hidden 576, 8 experts of
inner width 1,536, top 2, normalised top-k weights), random weights, router logits random and fixed
by seed, so the experts' loads are near even.

Keys: grouped_over_loop_t{T} (grouped ms / loop ms, median of repetitions, with min and max; below 1
the grouped matmuls are faster), grouped_ms_t{T}, loop_ms_t{T}, dense_equivalent_ms_t{T},
grouped_over_dense_t{T}, and max_abs_diff_t{T} between the two ways (they must agree).
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from bench.machine import report_header, write_report

HIDDEN, INNER, EXPERTS, TOP_K = 576, 1536, 8, 2  # bench.random_model's qwen3-moe at SmolLM2-135M's shape
TOKENS = (1, 32, 512)
# How far the two ways may differ (outputs are of order 1): summation order only, bf16 rounding each product.
AGREEMENT = {torch.float32: 1e-4, torch.bfloat16: 5e-2}
HEADLINE = ("grouped_over_loop_t1", "grouped_over_loop_t32", "grouped_over_loop_t512")


def make_block(dtype: torch.dtype, hidden: int, inner: int):
    from cloud_engine.model.moe import SparseMoeBlock

    config = SimpleNamespace(
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        norm_topk_prob=True,
        hidden_size=hidden,
        moe_intermediate_size=inner,
    )
    block = SparseMoeBlock(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * param.shape[-1] ** -0.5)
    return block.to(dtype).eval()


def loop_over_experts(block, x: torch.Tensor) -> torch.Tensor:
    """The same block computed the usual way: for each expert the router chose, gather its rows and multiply."""
    probs = F.softmax(block.gate(x).float(), dim=-1)
    weights, experts = probs.topk(block.top_k, dim=-1)
    if block.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    for expert in experts.unique().tolist():  # data-dependent: one graph break a step if compiled
        token_idx, slot = (experts == expert).nonzero(as_tuple=True)
        gate, up = F.linear(x[token_idx], block.experts.gate_up_proj[expert]).chunk(2, dim=-1)
        rows = F.linear(F.silu(gate) * up, block.experts.down_proj[expert])
        out.index_add_(0, token_idx, rows * weights[token_idx, slot, None].to(x.dtype))
    return out


def dense_equivalent(block, x: torch.Tensor) -> torch.Tensor:
    """The experts' multiply-adds as one dense SwiGLU over T x top_k rows with expert 0's weights: no routing."""
    rows = x.repeat_interleave(block.top_k, dim=0)
    gate, up = F.linear(rows, block.experts.gate_up_proj[0]).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, block.experts.down_proj[0])


def ms_per_call(fn, x: torch.Tensor, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - start) / calls * 1000


@torch.inference_mode()
def measure(block, tokens: int, dtype: torch.dtype, repeats: int, calls: int) -> dict:
    x = torch.randn(tokens, block.gate.in_features, generator=torch.Generator().manual_seed(tokens)).to(dtype)
    ways = {
        "grouped": block,
        "loop": lambda t: loop_over_experts(block, t),
        "dense_equivalent": lambda t: dense_equivalent(block, t),
    }
    for fn in ways.values():  # warm-up: allocator, oneDNN primitives
        ms_per_call(fn, x, 3)
    times = {name: [] for name in ways}
    for _ in range(repeats):  # interleaved, so drift on the machine hits every way alike
        for name, fn in ways.items():
            times[name].append(ms_per_call(fn, x, calls))
    ratios = [g / loop for g, loop in zip(times["grouped"], times["loop"])]
    diff = (block(x).float() - loop_over_experts(block, x).float()).abs().max().item()
    if diff > AGREEMENT[dtype]:  # timing two different computations would compare nothing
        raise SystemExit(f"moe_experts: the grouped and the looped block disagree at T={tokens} (max |diff| {diff})")
    return {
        f"grouped_over_loop_t{tokens}": statistics.median(ratios),
        f"grouped_over_loop_t{tokens}_spread": [min(ratios), max(ratios)],
        f"grouped_ms_t{tokens}": statistics.median(times["grouped"]),
        f"loop_ms_t{tokens}": statistics.median(times["loop"]),
        f"dense_equivalent_ms_t{tokens}": statistics.median(times["dense_equivalent"]),
        f"grouped_over_dense_t{tokens}": statistics.median(times["grouped"])
        / statistics.median(times["dense_equivalent"]),
        f"max_abs_diff_t{tokens}": diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (about a minute here)")
    parser.add_argument("--smoke", action="store_true", help="tiny widths, one repetition: checks the bench runs")
    parser.add_argument(
        "--dtype", default="auto", help="auto (the cloud engine's default on this CPU), float32, bfloat16"
    )
    args = parser.parse_args()

    from cloud_engine.device import resolve_dtype

    dtype = resolve_dtype(args.dtype, torch.device("cpu"))
    hidden, inner = (64, 128) if args.smoke else (HIDDEN, INNER)
    repeats = 1 if args.smoke else (5 if args.quick else 11)
    block = make_block(dtype, hidden, inner)
    report = report_header("moe_experts", smoke=args.smoke)
    report.update(
        {
            "block": f"{EXPERTS} experts, top {TOP_K}, hidden {hidden}, inner {inner}, random weights (seed 0)",
            "dtype": str(dtype),
            "torch_threads": torch.get_num_threads(),
            "repeats": repeats,
        }
    )
    for tokens in TOKENS:
        calls = max(2, 2048 // tokens) if not args.smoke else 2  # about the same rows timed at every size
        report.update(measure(block, tokens, dtype, repeats, calls))
        grouped, loop, dense = (report[f"{way}_ms_t{tokens}"] for way in ("grouped", "loop", "dense_equivalent"))
        print(f"T={tokens}: grouped {grouped:.3f} ms, loop {loop:.3f} ms, dense {dense:.3f} ms", flush=True)
    write_report(args.json, report, HEADLINE)


if __name__ == "__main__":
    main()
