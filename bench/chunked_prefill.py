"""What chunked prefill buys decoding requests when long prompts arrive, in tandem's cloud engine.

    python -m bench.chunked_prefill --json bench/results/chunked_prefill.json [--quick]

16 requests decode steadily; while they do, long prompts (>= 1500 tokens) arrive (one
after the steady requests have made 8 tokens, then one every 24 tokens). We measure
the inter-token latency (gap between consecutive tokens of a steady request, as the
engine emits them) with chunked prefill under a 256-token step budget, and without
chunking (a whole prompt in one step, budget 4096), in the same run, same model, same
arrivals; and with chunks sized from a step-time target (`--step-target-ms`, default 80: under
twice a decode-only step here, cloud_engine.step_cost) under the same budget. Keys, the target
mode against unchunked: `itl_p90_ratio` (target <= 2), `itl_p99_ratio` (<= 0.5),
`long_prompt_ttft_ratio` (the long prompts' time to first token, <= 1.5); the fixed-budget
mode's ratios stay under `token_budget_*`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import numpy as np

from bench.machine import machine_info, write_report
from cloud_engine.config import CloudEngineConfig
from cloud_engine.engine import CloudEngine
from sdk.protocol.engine import GenerationRequest, SamplingParams

NUM_STEADY = 16
TARGETS = {"itl_p90_ratio": 2.0, "itl_p99_ratio": 0.5, "long_prompt_ttft_ratio": 1.5}
WORDS = "the a river city model token light engine paper garden music window story number quiet winter bridge".split()


def _text_ids(engine: CloudEngine, rng: random.Random, num_tokens: int) -> list[int]:
    text = " ".join(rng.choice(WORDS) for _ in range(num_tokens + 32))
    return engine.tokenize(text)[:num_tokens]


def run(engine: CloudEngine, steady_tokens: int, long_lengths: list[int], seed: int) -> dict:
    """Drive the engine step by step; token timestamps per request."""
    rng = random.Random(seed)
    greedy = lambda n: SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)  # noqa: E731
    for i in range(NUM_STEADY):
        engine.add_request(GenerationRequest(f"steady-{i}", _text_ids(engine, rng, 32), greedy(steady_tokens)))
    long_requests = [GenerationRequest(f"long-{j}", _text_ids(engine, rng, n), greedy(8)) for j, n in enumerate(long_lengths)]
    arrivals = {8 + 24 * j: r for j, r in enumerate(long_requests)}  # steady tokens made -> long prompt that arrives
    times: dict[str, list[float]] = {}
    arrived_at: dict[str, float] = {}
    made = 0
    while engine.has_unfinished_requests():
        due = [k for k in arrivals if k <= made]
        if due:
            request = arrivals.pop(min(due))
            arrived_at[request.request_id] = time.perf_counter()
            engine.add_request(request)
        events = engine.step()
        now = time.perf_counter()
        for event in events:
            times.setdefault(event.request_id, []).append(now)
        made = len(times.get("steady-0", []))
    itls = np.concatenate([np.diff(times[f"steady-{i}"]) for i in range(NUM_STEADY)])
    ttfts = [times[r.request_id][0] - arrived_at[r.request_id] for r in long_requests]
    return {
        "itl_p50_s": float(np.percentile(itls, 50)),
        "itl_p90_s": float(np.percentile(itls, 90)),
        "itl_p99_s": float(np.percentile(itls, 99)),
        "itl_max_s": float(itls.max()),
        "long_prompt_ttft_mean_s": float(np.mean(ttfts)),
        "long_prompt_ttft_max_s": float(np.max(ttfts)),
        "num_itl_samples": int(itls.size),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--quick", action="store_true", help="fewer long prompts and tokens (under 3 minutes here)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--step-target-ms", type=float, default=80.0, help="the step-time target mode's target")
    args = parser.parse_args()

    steady_tokens, long_lengths = (48, [1500, 1600]) if args.quick else (128, [1500, 1700, 1900, 2000])
    modes = {
        "chunked": dict(enable_chunked_prefill=True, max_num_batched_tokens=256),
        "step_target": dict(enable_chunked_prefill=True, max_num_batched_tokens=256, step_time_target_ms=args.step_target_ms),
        "unchunked": dict(enable_chunked_prefill=False, max_num_batched_tokens=4096),
    }
    results = {}
    for name, overrides in modes.items():
        engine = CloudEngine(CloudEngineConfig(device=args.device, max_num_seqs=32, max_model_len=4096, kv_cache_gb=1.0, **overrides))
        run(engine, 12, [64], seed=1)  # warm-up
        results[name] = run(engine, steady_tokens, long_lengths, seed=0)
        print(name, json.dumps(results[name]), flush=True)
        engine.close()

    report = {
        "benchmark": "chunked_prefill",
        "command": "python -m bench.chunked_prefill " + " ".join(sys.argv[1:]),
        "machine": machine_info(),
        "model": "embedded SmolLM2-135M-Instruct (GGUF, dequantized)",
        "device": str(engine.device), "dtype": str(engine.dtype),
        "workload": f"{NUM_STEADY} steady requests (32-token prompts, {steady_tokens} greedy tokens); long prompts of "
                    f"{long_lengths} tokens arriving after 8, 32, 56, ... steady tokens",
        "modes": {k: {kk: vv for kk, vv in v.items()} for k, v in modes.items()},
        "results": results,
        **ratios(results["step_target"], results["unchunked"]),
        **{f"token_budget_{k}": v for k, v in ratios(results["chunked"], results["unchunked"]).items()},
        "targets": TARGETS,
    }
    report["targets_met"] = {k: report[k] <= v for k, v in TARGETS.items()}
    write_report(args.json, report, ("itl_p90_ratio", "itl_p99_ratio", "long_prompt_ttft_ratio", "targets_met"))


def ratios(mode: dict, unchunked: dict) -> dict:
    return {
        "itl_p50_ratio": mode["itl_p50_s"] / unchunked["itl_p50_s"],
        "itl_p90_ratio": mode["itl_p90_s"] / unchunked["itl_p90_s"],
        "itl_p99_ratio": mode["itl_p99_s"] / unchunked["itl_p99_s"],
        "long_prompt_ttft_ratio": mode["long_prompt_ttft_mean_s"] / unchunked["long_prompt_ttft_mean_s"],
    }


if __name__ == "__main__":
    main()
