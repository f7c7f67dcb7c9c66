"""The local engine over one unified KV pool against one llama.cpp KV stream per slot, side by side.

    python -m bench.local_kv_layout --json bench/results/local_kv_layout.json [--quick | --smoke]

bench.local_step_profile's workload and engine configuration (bench.serve --compare-local's: 16
slots, 16 x 1024 KV cells, 512-token steps, 2 threads; random chat prompts of 128 words, exactly
64 output tokens, greedy), in-process (no HTTP), once with `kv_layout = "unified"` (every slot
draws cells from one pool, as tandem did before issue 38) and once with `"streams"` (each slot
1024 cells of its own, llama-server's -np layout; what `auto` picks for this configuration). Each
repetition runs both layouts in turn at every client count, so a slow minute falls on both.

Keys, per client count C: `ratio_output_tps_streams_vs_unified_cC` and
`ratio_decode_step_streams_vs_unified_cC` (the median whole step with every client decoding),
each the median of per-repetition ratios with its min-max spread, and each layout's medians.
"""

from __future__ import annotations

import argparse
import statistics

from bench.local_step_profile import run
from bench.machine import report_header, write_report
from bench.repetitions import median_and_spread

LAYOUTS = ("unified", "streams")
CLIENTS = (1, 8)
HEADLINE_KEYS = ("ratio_output_tps_streams_vs_unified_c8", "ratio_output_tps_streams_vs_unified_c8_spread",
                 "ratio_decode_step_streams_vs_unified_c8", "ratio_output_tps_streams_vs_unified_c1")


def measure(repeats: int, prompts: dict[int, int], clients: tuple[int, ...]) -> dict:
    runs: dict[int, dict[str, list[dict]]] = {c: {layout: [] for layout in LAYOUTS} for c in clients}
    for rep in range(repeats):
        for c in clients:
            for layout in LAYOUTS:
                result = run(prompts[c], c, overrides={"kv_layout": layout})
                runs[c][layout].append(result)
                print(f"repetition {rep + 1}/{repeats} c={c} {layout}: {result['output_tokens_per_s']:.1f} tok/s, "
                      f"decode step {result['decode_step_ms_p50']:.1f} ms", flush=True)
    report: dict = {"layouts": {}}
    for c in clients:
        by_layout = runs[c]
        report["layouts"][f"c{c}"] = {
            layout: {"output_tokens_per_s": statistics.median(r["output_tokens_per_s"] for r in rs),
                     "decode_step_ms_p50": statistics.median(r["decode_step_ms_p50"] for r in rs),
                     "runs": [{k: r[k] for k in ("output_tokens_per_s", "decode_step_ms_p50", "llama_decode_ms_p50",
                                                 "python_share", "prefix_shared_tokens")} for r in rs]}
            for layout, rs in by_layout.items()
        }  # fmt: skip
        pairs = list(zip(by_layout["streams"], by_layout["unified"]))
        for key, figure in (("output_tps", "output_tokens_per_s"), ("decode_step", "decode_step_ms_p50")):
            name = f"ratio_{key}_streams_vs_unified_c{c}"
            report[name], report[f"{name}_spread"] = median_and_spread([s[figure] / u[figure] for s, u in pairs])
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--quick", action="store_true", help="2 repetitions of 24 (c8) and 8 (c1) prompts")
    parser.add_argument("--smoke", action="store_true", help="once, 4 prompts, 2 clients: checks the bench works")
    args = parser.parse_args()
    if args.smoke:
        repeats, prompts, clients = 1, {2: 4}, (2,)
    elif args.quick:
        repeats, prompts, clients = 2, {1: 8, 8: 24}, CLIENTS
    else:
        repeats, prompts, clients = 3, {1: 16, 8: 48}, CLIENTS
    report = report_header("local_kv_layout", smoke=args.smoke) | {"repeats": repeats, "prompts": prompts}
    report |= measure(repeats, prompts, clients)
    keys = HEADLINE_KEYS if not args.smoke else ("ratio_output_tps_streams_vs_unified_c2",)
    write_report(args.json, report, keys)


if __name__ == "__main__":
    main()
