"""What prefix caching buys requests that share a long system prompt, in tandem's cloud engine.

    python -m bench.prefix_cache --json bench/results/prefix_cache.json [--quick | --smoke]

Every request is a 1000-token system prompt followed by its own short question. One
request warms the cache, then the others arrive one at a time; we measure each one's
time to first token (from add_request to its first token event) with prefix caching on
and off, in the same run. Key: `ttft_ratio` (cached / uncached mean TTFT, target <= 0.3).
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

SYSTEM_TOKENS = 1000
SMOKE_SYSTEM_TOKENS = 200  # --smoke: still longer than a few KV blocks, so cached blocks are found and reused
WORDS = "the a river city model token light engine paper garden music window story number quiet winter bridge".split()


def ttft_of(engine: CloudEngine, request: GenerationRequest) -> float:
    start = time.perf_counter()
    engine.add_request(request)
    while True:
        if any(event.request_id == request.request_id for event in engine.step()):
            ttft = time.perf_counter() - start
            engine.abort_request(request.request_id)
            return ttft


def run(engine: CloudEngine, num_requests: int, system_tokens: int = SYSTEM_TOKENS) -> dict:
    rng = random.Random(0)
    system = engine.tokenize(" ".join(rng.choice(WORDS) for _ in range(system_tokens + 64)))[:system_tokens]
    params = SamplingParams(max_tokens=1, temperature=0.0)
    questions = [
        engine.tokenize(" ".join(rng.choice(WORDS) for _ in range(24)), add_special=False)
        for _ in range(num_requests + 1)
    ]
    ttft_of(engine, GenerationRequest("warm", system + questions[0], params))  # fills the cache (and warms up)
    hits_before = engine.kv_manager.num_prefix_cache_hits_total
    ttfts = [ttft_of(engine, GenerationRequest(f"q{i}", system + q, params)) for i, q in enumerate(questions[1:])]
    return {
        "ttft_mean_s": float(np.mean(ttfts)),
        "ttft_p50_s": float(np.percentile(ttfts, 50)),
        "ttft_max_s": float(np.max(ttfts)),
        "prompt_tokens": len(system) + len(questions[1]),
        "prefix_cache_hit_tokens": engine.kv_manager.num_prefix_cache_hits_total - hits_before,
        "num_requests": num_requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--quick", action="store_true", help="fewer requests (under 3 minutes here)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"only checks that the bench works (2 requests, a {SMOKE_SYSTEM_TOKENS}-token system prompt): "
        "figures meaningless",
    )
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()

    num_requests = 2 if args.smoke else 4 if args.quick else 16
    system_tokens = SMOKE_SYSTEM_TOKENS if args.smoke else SYSTEM_TOKENS
    results = {}
    for name, caching in (("cached", True), ("uncached", False)):
        engine = CloudEngine(
            CloudEngineConfig(device=args.device, enable_prefix_caching=caching, max_model_len=2048, kv_cache_gb=0.5)
        )
        results[name] = run(engine, num_requests, system_tokens)
        print(name, json.dumps(results[name]), flush=True)
        engine.close()
    report = {
        "benchmark": "prefix_cache",
        "smoke": args.smoke,
        "command": "python -m bench.prefix_cache " + " ".join(sys.argv[1:]),
        "machine": machine_info(),
        "model": "embedded SmolLM2-135M-Instruct (GGUF, dequantized)",
        "device": str(engine.device),
        "dtype": str(engine.dtype),
        "workload": f"{system_tokens}-token shared system prompt + a distinct ~24-token question; one warm-up request, "
        f"then {num_requests} requests one at a time; TTFT from add_request to the first token",
        "results": results,
        "ttft_ratio": results["cached"]["ttft_mean_s"] / results["uncached"]["ttft_mean_s"],
        "targets": {"ttft_ratio": 0.3},
    }
    write_report(args.json, report, ("ttft_ratio",))


if __name__ == "__main__":
    main()
