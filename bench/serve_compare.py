"""bench.serve --compare-local: tandem's local endpoint against llama.cpp's own servers.

    python -m bench.serve --compare-local [--quick] --json bench/results/serve_local_vs_llama_server.json

Servers, one at a time (these machines have 2 cores), all on the same GGUF and threads:
`tandem serve --cloud none`; llama.cpp's C++ `llama-server` (scripts/build-llama-server.sh:
the llama.cpp commit tandem's backend uses), with `--no-repack` (tandem's setting: no extra
buffer types) and with llama.cpp's default (repacked layouts where a tensor type has one);
and, at 8 clients only, llama-cpp-
python's `llama_cpp.server` (the earlier baseline, which serves one request at a time).
Configured alike: NUM_SLOTS sequences, CTX_PER_SLOT KV cells per sequence and the same total
(llama-server's -c is divided among its slots; tandem gets --kv-cache-tokens NUM_SLOTS x
CTX_PER_SLOT and --max-model-len CTX_PER_SLOT), STEP_TOKENS tokens per step (tandem's
--max-num-batched-tokens, llama-server's -b and -ub), prompt caching on (both defaults;
random prompts share no prefix), flash attention on.

The workload (default: 64 random prompts of ~128 tokens plus the chat template, exactly 64
output tokens, greedy) runs at each concurrency in CONCURRENCIES; every repetition runs
every (concurrency, server) pair once, servers in turn, so a noisy minute on a shared
machine falls on all of them. Per concurrency and server: medians over the repetitions of
output tok/s, TTFT and ITL p50/p99; and tandem / llama-server ratios per repetition, their
median and spread (min, max). --quick: 8 clients only, 2 repetitions; --smoke: 8 clients, 8 short
requests, once (checks the bench works). A server that does not start (llama-server's repacked
variant dies with SIGILL on some AMX machines) is one missing row: `servers_not_started` says
which, with its exit code and signal, and the rest is compared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess

from bench.machine import machine_info
from bench.repetitions import median_and_spread
from bench.serve_client import ClientConfig
from bench.serve_datasets import GgufTokenizer
from bench.serve_report import console, print_summary
from bench.serve_run import benchmark, build_samples, headline, workload_description
from bench.serve_servers import (
    REPO_ROOT,
    ManagedServer,
    ServerStartError,
    llama_cpp_server,
    llama_server,
    tandem_server,
)

CONCURRENCIES = (1, 4, 8, 16)
QUICK_CONCURRENCIES = (8,)
REPEATS, QUICK_REPEATS = 3, 2
NUM_SLOTS = 16  # sequences each server runs at once (the largest concurrency)
CTX_PER_SLOT = 1024  # KV cells per sequence; the workload needs ~230
STEP_TOKENS = 512  # tokens one step / llama_decode call carries at most
BASELINE_CONCURRENCY = 8  # where llama_cpp.server runs (it serializes requests; more clients change nothing)
# Issue 38's two (a lone prompt's first token, and 8 clients' throughput), and issue 24's.
TARGETS = {
    "ratio_ttft_p50_vs_llama_server_c1": ("<=", 1.0),
    "ratio_output_tps_vs_llama_server_c8": (">=", 1.0),
    "ratio_output_tps_vs_llama_server_default_c8": (">=", 0.9),
    "ratio_ttft_p50_vs_llama_server_c8": ("<=", 1.0),
}
HEADLINE_KEYS = (
    "ratio_output_tps_vs_llama_server_c8",
    "ratio_output_tps_vs_llama_server_c8_spread",
    "ratio_ttft_p50_vs_llama_server_c8",
    "ratio_ttft_p50_vs_llama_server_c8_spread",
    "targets_met",
)


def build_llama_server() -> tuple[str, str]:
    """The llama-server binary (built on first use) and the llama.cpp commit it was built from."""
    run = subprocess.run(
        ["bash", os.path.join(REPO_ROOT, "scripts", "build-llama-server.sh")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        raise RuntimeError(f"scripts/build-llama-server.sh failed:\n{run.stderr[-3000:]}")
    binary = run.stdout.strip().splitlines()[-1]
    with open(os.path.join(os.path.dirname(binary), "llama-cpp.commit")) as f:
        return binary, f.read().strip()


def servers_at(
    concurrency: int, binary: str, model_path: str, model_name: str, threads: int, kv_cache_type: str = "f16"
) -> list[ManagedServer]:
    shape = (model_name, NUM_SLOTS, CTX_PER_SLOT, STEP_TOKENS, STEP_TOKENS)
    servers = [
        tandem_server(
            model_path,
            threads,
            max_num_seqs=NUM_SLOTS,
            max_model_len=CTX_PER_SLOT,
            kv_cache_tokens=NUM_SLOTS * CTX_PER_SLOT,
            max_num_batched_tokens=STEP_TOKENS,
            extra_args=["--model-name", model_name, "--kv-cache-type", kv_cache_type],
        ),
        llama_server(binary, model_path, threads, *shape, kv_cache_type=kv_cache_type),
        llama_server(binary, model_path, threads, *shape, repack=False, kv_cache_type=kv_cache_type),
    ]
    if concurrency == BASELINE_CONCURRENCY and kv_cache_type == "f16":  # its server takes no KV type by name
        servers.append(llama_cpp_server(model_path, threads, model_name, n_ctx=CTX_PER_SLOT))
    return servers


def run_compare(args: argparse.Namespace) -> dict:
    from sdk.engine_common.model_files import model_name_for, resolve_model_path

    model_path = resolve_model_path(args.model_path)
    model_name = model_name_for(args.model_path)
    threads = args.threads or os.cpu_count() or 1
    concurrencies = QUICK_CONCURRENCIES if args.quick or args.smoke else CONCURRENCIES
    repeats = args.repeats or (1 if args.smoke else QUICK_REPEATS if args.quick else REPEATS)
    binary, llama_cpp_commit = build_llama_server()
    tokenizer = GgufTokenizer(args.tokenizer or model_path)
    samples = build_samples(args, tokenizer)
    runs: dict[int, dict[str, list[dict]]] = {c: {} for c in concurrencies}
    commands: dict[str, dict] = {}
    not_started: list[dict] = []
    for rep in range(repeats):
        for concurrency in concurrencies:
            args.max_concurrency = concurrency
            for server in servers_at(concurrency, binary, model_path, model_name, threads, args.kv_cache_type):
                label = f"{server.name} c={concurrency} rep {rep + 1}/{repeats}"
                console.print(f"starting {label}: {' '.join(server.command)}")
                commands[server.name] = {"description": server.description, "command": " ".join(server.command)}
                try:
                    server.start()
                except (
                    ServerStartError
                ) as exc:  # one missing row (e.g. SIGILL on a CPU it was not built for), not a lost run
                    console.print(f"[red]{label} did not start: {exc}[/red]")
                    not_started.append(
                        {
                            "server": server.name,
                            "concurrency": concurrency,
                            "repetition": rep + 1,
                            "exit_code": exc.exit_code,
                            "signal": exc.signal_name,
                            "error": str(exc)[-2000:],
                        }
                    )
                    runs[concurrency].setdefault(server.name, []).append(None)
                    continue
                try:
                    config = ClientConfig(
                        server.base_url,
                        model_name,
                        args.endpoint,
                        None,
                        args.temperature,
                        args.ignore_eos,
                        args.timeout,
                    )
                    runs[concurrency].setdefault(server.name, []).append(benchmark(config, samples, args, label))
                finally:
                    server.stop()
            print_summary({name: rs[-1] for name, rs in runs[concurrency].items() if rs[-1] is not None})
    ratios = headline_ratios(runs)
    return {
        "benchmark": "serve_local_vs_llama_server",
        "smoke": args.smoke,
        "command": args.command_line,
        "machine": machine_info(),
        "llama_cpp_commit": llama_cpp_commit,
        "llama_server_binary": binary,
        "model": os.path.basename(model_path),
        "threads": threads,
        "config": {
            "num_slots": NUM_SLOTS,
            "ctx_per_slot": CTX_PER_SLOT,
            "step_tokens": STEP_TOKENS,
            "concurrencies": list(concurrencies),
            "repeats": repeats,
            "kv_cache_type": args.kv_cache_type,
        },
        "workload": workload_description(args, tokenizer),
        "servers": commands,
        "servers_not_started": not_started,
        "failed_requests": sum(
            m["failed"] for by_server in runs.values() for reps in by_server.values() for m in reps if m
        ),
        "by_concurrency": {f"c{c}": summarize(runs[c]) for c in concurrencies},
        **ratios,
        "targets": {key: f"{op} {bound}" for key, (op, bound) in TARGETS.items()},
        "targets_met": targets_met(ratios),
        "notes": [
            "tandem's local engine loads models without llama.cpp's extra (repacked) buffer types (they break its "
            "batch invariance), as 'llama_server_no_repack' does (--no-repack); 'llama_server' runs llama.cpp's "
            "default; on SmolLM2 Q4_1 nothing is repacked either way. llama_cpp.server loads as tandem does",
            "tandem runs its defaults: llama.cpp ubatches of up to 512 tokens (llama-server's -ub here is "
            "STEP_TOKENS), a cache of finished prompts (llama-server's cache_prompt), and, since every slot here "
            "fits max_model_len, one KV stream per slot (kv_layout auto; llama-server's -np layout); "
            "batch_invariant (63-token ubatches, unified pool, no prompt cache) is opt-in",
            "the benchmark client runs on the same cores as the server; timings on shared machines are noisy",
        ],
    }


def summarize(by_server: dict[str, list[dict]]) -> dict:
    """Per server: the median over repetitions of each headline figure, and every repetition's."""
    out = {}
    for name, reps in by_server.items():
        started = [m for m in reps if m is not None]
        if not started:
            out[name] = {"started": 0}
            continue
        figures = [_figures(m) for m in started]
        out[name] = {key: _median([f[key] for f in figures]) for key in figures[0]}
        out[name]["failed"] = sum(m["failed"] for m in started)
        out[name]["started"] = len(started)
        out[name]["runs"] = [{**headline(m), **_figures(m)} if m is not None else None for m in reps]
    return out


def _figures(metrics: dict) -> dict:
    return {
        "output_tps": metrics["output_throughput"],
        "ttft_p50_ms": metrics["ttft_ms"]["median"],
        "ttft_p99_ms": metrics["ttft_ms"]["p99"],
        "itl_p50_ms": metrics["itl_ms"]["median"],
        "itl_p99_ms": metrics["itl_ms"]["p99"],
    }


def headline_ratios(runs: dict[int, dict[str, list[dict]]]) -> dict:
    """tandem / each llama.cpp server, per repetition (servers ran in turn), median and spread."""
    out = {}
    for concurrency, by_server in runs.items():
        tandem = by_server["tandem"]
        # "" is llama-server with tandem's buffer-type setting (no repacking), "_default" llama.cpp's default.
        for name, suffix in (
            ("llama_server_no_repack", ""),
            ("llama_server", "_default"),
            ("llama_cpp_server", "_cpp_python"),
        ):
            # Only repetitions where both servers ran: a server that did not start leaves its row out.
            pairs = [(t, o) for t, o in zip(tandem, by_server.get(name, [])) if t is not None and o is not None]
            if not pairs:
                continue
            for figure, key in (("output_tps", "output_tps"), ("ttft_p50_ms", "ttft_p50")):
                ratios = [_figures(t)[figure] / _figures(o)[figure] for t, o in pairs]
                name_key = (
                    f"ratio_{key}_vs_llama_server{suffix}_c{concurrency}"
                    if name != "llama_cpp_server"
                    else f"ratio_{key}_vs_llama_cpp_server_c{concurrency}"
                )
                out[name_key], out[f"{name_key}_spread"] = median_and_spread(ratios)
    return out


def targets_met(ratios: dict, targets: dict | None = None) -> dict:
    """Of headline_ratios' figures: met only when the whole spread meets the target (a bound inside it is not; a
    figure with no `_spread` is one measurement); "not measured" where a server did not start (a missing row, not a
    lost run). `targets`: default TARGETS."""
    met = {}
    for key, (op, bound) in (TARGETS if targets is None else targets).items():
        if key not in ratios:
            met[key] = "not measured"
            continue
        low, high = ratios.get(f"{key}_spread", (ratios[key], ratios[key]))
        met[key] = low >= bound if op == ">=" else high <= bound
    return met


def _median(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
