"""Which kernel runs an 8-bit weight linear ([cloud] weight_dtype = int8), measured against the others.

    python -m bench.int8_linear [--quick | --smoke] --json bench/results/int8_linear.json

SmolLM2-135M's linear shapes (the fused QKV, the output projection, the fused gate/up, the down projection and the
LM head), at the row counts a step carries (1, 8, 32 decoding sequences; 256 prompt tokens), each timed side by side
in one process (median of interleaved repetitions, torch's threads: all cores):

* float32 activations: `F.linear` on float32 weights (the baseline), tandem's kernel on int8 weights
  (cloud_engine/kernels/int8_linear_cpu.cpp, what the engine runs), torch's `_weight_int8pack_mm` with float32
  activations, and dequantizing the weight every call then `F.linear`;
* bfloat16 activations: `F.linear` on bf16 weights (the baseline), `_weight_int8pack_mm` (what the engine runs
  without AVX512-BF16) and, on a CPU with it, tandem's kernel's bf16 path (`tandem_int8_bf16`, what the engine runs
  there).

Keys: `{shape}_r{rows}_{kernel}_ms` and the ratio against the baseline of its activation dtype,
`{shape}_r{rows}_{kernel}_vs_dense`; the headline `step_r{rows}_tandem_int8_vs_dense` sums one decode step's
matmuls (30 layers of the four, and the LM head once) for tandem's kernel against float32 F.linear;
`step_r{rows}_torch_int8pack_bf16_vs_dense_bf16` and `step_r{rows}_tandem_int8_bf16_vs_dense_bf16` the same for bf16.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.machine import report_header, write_report

# (out_features, in_features) of SmolLM2-135M's linears; LAYERS of each a step, the LM head once.
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}
LAYERS = 30
ROWS = (1, 8, 32, 256)


def time_ms(function, repetitions: int, calls: int) -> list[float]:
    function()  # warm: oneDNN builds its primitive, caches fill
    out = []
    for _ in range(repetitions):
        started = time.perf_counter()
        for _ in range(calls):
            function()
        out.append((time.perf_counter() - started) / calls * 1e3)
    return out


def kernels(out_features: int, in_features: int, rows: int) -> dict:
    """name -> (activation dtype, callable), on one random weight and input."""
    import torch
    import torch.nn.functional as F

    from cloud_engine.model.int8_linear import Int8Linear, quantize_per_channel, tandem_kernel_takes_bf16

    gen = torch.Generator().manual_seed(out_features + in_features)
    weight = torch.randn(out_features, in_features, generator=gen) * 0.05
    x = torch.randn(rows, in_features, generator=gen)
    quantized, scales = quantize_per_channel(weight)
    tandem = Int8Linear(weight, None)
    weight_bf16, x_bf16, scales_bf16 = weight.bfloat16(), x.bfloat16(), scales.bfloat16()
    out = {
        "dense": ("float32", lambda: F.linear(x, weight)),
        "tandem_int8": ("float32", lambda: tandem(x)),
        "torch_int8pack": ("float32", lambda: torch._weight_int8pack_mm(x, quantized, scales)),
        "dequantize_then_linear": ("float32", lambda: F.linear(x, quantized.float() * scales[:, None])),
        "dense_bf16": ("bfloat16", lambda: F.linear(x_bf16, weight_bf16)),
        "torch_int8pack_bf16": ("bfloat16", lambda: torch._weight_int8pack_mm(x_bf16, quantized, scales_bf16)),
    }
    if tandem_kernel_takes_bf16():  # AVX512-BF16: tandem's bf16 path (tandem's float path below kBf16MinRows)
        out["tandem_int8_bf16"] = ("bfloat16", lambda: tandem(x_bf16))
    return out


def measure(rows_list: tuple[int, ...], repetitions: int, calls: int) -> dict:
    out: dict = {}
    for rows in rows_list:
        for shape, (out_features, in_features) in SHAPES.items():
            timed = {}
            for name, (dtype, function) in kernels(out_features, in_features, rows).items():
                slow = name == "dequantize_then_linear" or (name == "torch_int8pack" and rows > 8)
                timed[name] = (dtype, time_ms(function, repetitions, 1 if slow or shape == "lm_head" else calls))
            for name, (dtype, times) in timed.items():
                baseline = timed["dense" if dtype == "float32" else "dense_bf16"][1]
                out[f"{shape}_r{rows}_{name}_ms"] = round(statistics.median(times), 4)
                ratios = [t / b for t, b in zip(times, baseline)]
                out[f"{shape}_r{rows}_{name}_vs_dense"] = round(statistics.median(ratios), 3)
        for name in ("tandem_int8", "dense", "torch_int8pack_bf16", "dense_bf16", "tandem_int8_bf16"):
            if f"qkv_r{rows}_{name}_ms" in out:
                out[f"step_r{rows}_{name}_ms"] = round(
                    sum(out[f"{s}_r{rows}_{name}_ms"] * (1 if s == "lm_head" else LAYERS) for s in SHAPES), 2
                )
        for name, baseline in (
            ("tandem_int8", "dense"),
            ("torch_int8pack_bf16", "dense_bf16"),
            ("tandem_int8_bf16", "dense_bf16"),
        ):
            if f"step_r{rows}_{name}_ms" in out:
                out[f"step_r{rows}_{name}_vs_{baseline}"] = round(
                    out[f"step_r{rows}_{name}_ms"] / out[f"step_r{rows}_{baseline}_ms"], 3
                )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--quick", action="store_true", help="3 repetitions")
    parser.add_argument("--smoke", action="store_true", help="only checks that the bench works: figures meaningless")
    args = parser.parse_args()
    import torch

    from cloud_engine.custom_ops import load_cpu_ops

    if not load_cpu_ops():
        raise SystemExit("int8_linear: tandem's CPU kernels could not be built here")
    rows, repetitions, calls = ((1, 8), 1, 2) if args.smoke else (ROWS, 3 if args.quick else 7, 20)
    report = report_header("int8_linear", smoke=args.smoke)
    report.update(threads=torch.get_num_threads(), baseline="F.linear on float32 (bf16 kernels: on bf16) weights")
    report.update(measure(rows, repetitions, calls))
    kinds = ("tandem_int8_vs_dense", "torch_int8pack_bf16_vs_dense_bf16", "tandem_int8_bf16_vs_dense_bf16")
    headline = tuple(key for r in rows for k in kinds if (key := f"step_r{r}_{k}") in report)
    write_report(args.json, report, headline)


if __name__ == "__main__":
    main()
