"""`python -m bench.serve --compare-checkouts BEFORE AFTER`: the same `tandem serve` from two source
trees (two git worktrees of two commits), taking turns, on the compare-local workload at 8 clients.

What a change that should not change speed (a restructure, a refactor) is checked with. Against a
third server (bench.serve --compare-local) a ratio moves with that server's own run-to-run spread as
much as with tandem's; here the two tandems are measured against each other directly, before and
after alternating (ABBA...) so a machine that drifts over the run favours neither.

Each run starts `python -m sdk.cli serve --cloud none` with its tree as the working directory (so its
`sdk` is the one imported), the same threads and model, and stops it before the next starts; with
`--checkouts-tier cloud`, `python -m sdk.cli cloud serve` instead (the cloud engine on the same GGUF,
its default dtype, eager, CLOUD_MAX_NUM_SEQS sequences).
Reported: each tree's output tok/s and TTFT p50 per repetition, and the after/before ratios of their
medians with the spread over repetitions (the lowest and highest after/before pairing of one round).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

import bench.serve_servers as serve_servers
from bench.machine import machine_info
from bench.serve_client import ClientConfig
from bench.serve_datasets import GgufTokenizer
from bench.serve_report import console
from bench.serve_run import benchmark, build_samples, workload_description

CONCURRENCY = 8
CLOUD_MAX_NUM_SEQS = 32
REPEATS, QUICK_REPEATS = 3, 2
HEADLINE_KEYS = ("ratio_output_tps_after_vs_before", "ratio_ttft_p50_after_vs_before")


def _commit(tree: str) -> str:
    described = subprocess.run(
        ["git", "-C", tree, "describe", "--always", "--dirty"], capture_output=True, text=True, check=False
    )
    return described.stdout.strip() or "unknown"


def _ratio_and_spread(after: list[float], before: list[float]) -> tuple[float, list[float]]:
    """median(after) / median(before), and the lowest and highest per-round ratio."""
    per_round = [a / b for a, b in zip(after, before)]
    return statistics.median(after) / statistics.median(before), [min(per_round), max(per_round)]


def _server(tier: str, model_path: str | None, threads: int) -> serve_servers.ManagedServer:
    if tier == "local":
        return serve_servers.tandem_server(model_path, threads)
    port = serve_servers.free_port()
    command = [sys.executable, "-m", "sdk.cli", "cloud", "serve", "--port", str(port)]
    command += ["--grpc-port", str(serve_servers.free_port()), "--threads", str(threads)]
    command += ["--max-num-seqs", str(CLOUD_MAX_NUM_SEQS), "--compile", "off", "--log-level", "warning"]
    command += ["--model", model_path] if model_path else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    return serve_servers.ManagedServer("tandem-cloud", command, port, "/health", "tandem cloud serve", env=env)


def _first_model(base_url: str) -> str:
    from bench.served_models import fetch_model_cards, own_chat_model_id

    return own_chat_model_id(fetch_model_cards(base_url))


def run_compare_checkouts(args: argparse.Namespace) -> dict:
    from sdk.engine_common.model_files import model_name_for, resolve_model_path

    trees = {"before": os.path.abspath(args.compare_checkouts[0]), "after": os.path.abspath(args.compare_checkouts[1])}
    for name, tree in trees.items():
        if not os.path.isfile(os.path.join(tree, "sdk", "cli", "__main__.py")):
            raise SystemExit(f"bench.serve: --compare-checkouts {name} {tree} is not a tandem source tree")
    model_path = resolve_model_path(args.model_path)
    model_name = model_name_for(args.model_path)
    threads = args.threads or os.cpu_count() or 1
    repeats = args.repeats or (1 if args.smoke else QUICK_REPEATS if args.quick else REPEATS)
    args.max_concurrency = CONCURRENCY
    tokenizer = GgufTokenizer(args.tokenizer or model_path)
    samples = build_samples(args, tokenizer)
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    failed = 0
    default_root = serve_servers.REPO_ROOT
    try:
        for rep in range(repeats):
            order = list(trees) if rep % 2 == 0 else list(reversed(trees))
            for name in order:
                serve_servers.REPO_ROOT = trees[name]  # tandem_server starts `python -m sdk.cli` there
                server = _server(args.checkouts_tier, args.model_path, threads)
                console.print(f"starting {name} ({trees[name]}) rep {rep + 1}/{repeats}")
                server.start()
                try:
                    served = model_name if args.checkouts_tier == "local" else _first_model(server.base_url)
                    config = ClientConfig(
                        server.base_url,
                        served,
                        args.endpoint,
                        None,
                        args.temperature,
                        args.ignore_eos,
                        args.timeout,
                    )
                    metrics = benchmark(config, samples, args, f"{name} rep {rep + 1}/{repeats}")
                finally:
                    server.stop()
                failed += metrics["failed"]
                runs[name].append(
                    {"output_tps": metrics["output_throughput"], "ttft_p50_ms": metrics["ttft_ms"]["median"]}
                )
    finally:
        serve_servers.REPO_ROOT = default_root
    output, output_spread = _ratio_and_spread(
        [r["output_tps"] for r in runs["after"]], [r["output_tps"] for r in runs["before"]]
    )
    ttft, ttft_spread = _ratio_and_spread(
        [r["ttft_p50_ms"] for r in runs["after"]], [r["ttft_p50_ms"] for r in runs["before"]]
    )
    return {
        "benchmark": "serve_checkouts",
        "smoke": args.smoke,
        "tier": args.checkouts_tier,
        "command": args.command_line,
        "machine": machine_info(),
        "trees": {name: {"path": tree, "commit": _commit(tree)} for name, tree in trees.items()},
        "model": os.path.basename(model_path),
        "threads": threads,
        "concurrency": CONCURRENCY,
        "repeats": repeats,
        "workload": workload_description(args, tokenizer),
        "failed_requests": failed,
        "runs": runs,
        "ratio_output_tps_after_vs_before": output,
        "ratio_output_tps_after_vs_before_spread": output_spread,
        "ratio_ttft_p50_after_vs_before": ttft,
        "ratio_ttft_p50_after_vs_before_spread": ttft_spread,
        "notes": [
            "the two trees take turns (before, after, then after, before, ...); each run starts its own server",
            "a ratio is 'the same' when the spread of the per-round ratios contains 1.0",
        ],
    }
