"""bench.serve --compare-local: tandem's local endpoint against llama-cpp-python's own server.

Both servers load the same GGUF with the same llama.cpp threads, flash attention on
and llama.cpp's extra (repacked) buffer types off; they run one after the other, never
at once (these machines have 2 cores). Each gets one warm-up request, then the same
seeded workload (default: 64 random prompts of ~128 tokens answering exactly 64,
greedy, chat endpoint) from 8 concurrent clients. The headline is
`ratio_output_tps_vs_llama_cpp_server` = tandem output tokens/s / llama_cpp.server
output tokens/s, against the issue's target of 1.7.
"""

from __future__ import annotations

import argparse
import os

from bench.machine import machine_info
from bench.serve_client import ClientConfig
from bench.serve_datasets import GgufTokenizer
from bench.serve_report import console, print_summary
from bench.serve_run import benchmark, build_samples, headline, workload_description
from bench.serve_servers import llama_cpp_server, tandem_server

COMPARE_CONCURRENCY = 8
TARGET_RATIO = 1.7
HEADLINE_KEYS = ("ratio_output_tps_vs_llama_cpp_server", "target_met", "output_throughput")


def run_compare(args: argparse.Namespace) -> dict:
    from sdk.protocol.model_files import model_name_for, resolve_model_path

    model_path = resolve_model_path(args.model_path)
    model_name = model_name_for(args.model_path)
    threads = args.threads or os.cpu_count() or 1
    if args.max_concurrency is None:
        args.max_concurrency = COMPARE_CONCURRENCY
    tokenizer = GgufTokenizer(args.tokenizer or model_path)
    samples = build_samples(args, tokenizer)
    longest = max(s.prompt_len + s.output_len for s in samples) + 256  # room for the chat template
    servers = [  # tandem's own defaults (16 sequences, 8192 KV cells) unless the workload needs more
        tandem_server(args.model_path, threads, max_num_seqs=args.max_concurrency if args.max_concurrency > 16 else None),
        llama_cpp_server(model_path, threads, model_name, n_ctx=max(longest, 2048)),
    ]
    runs: dict[str, dict] = {}
    server_info: dict[str, dict] = {}
    for server in servers:
        console.print(f"starting {server.name}: {' '.join(server.command)}")
        with server:
            console.print(f"{server.name} ready in {server.startup_s:.1f}s")
            config = ClientConfig(server.base_url, model_name, args.endpoint, None, args.temperature,
                                  args.ignore_eos, args.timeout)
            runs[server.name] = benchmark(config, samples, args, server.name)
        server_info[server.name] = {"description": server.description, "command": " ".join(server.command),
                                    "startup_s": server.startup_s,
                                    "exit_code_after_sigterm": server.process.returncode,  # -15: uvicorn re-raised it
                                    "log": server.log_path}
    print_summary(runs)

    tandem, baseline = runs["tandem"], runs["llama_cpp_server"]
    ratio = tandem["output_throughput"] / baseline["output_throughput"] if baseline["output_throughput"] else None
    complete = tandem["failed"] == 0 and baseline["failed"] == 0
    return {
        "benchmark": "serve_local_vs_llama_cpp",
        "command": args.command_line,
        "machine": machine_info(),
        "model": os.path.basename(model_path),
        "threads": threads,
        "workload": workload_description(args, tokenizer),
        "servers": {name: {**server_info[name], **headline(runs[name]), "metrics": runs[name]} for name in runs},
        "output_throughput": {name: runs[name]["output_throughput"] for name in runs},
        "ratio_output_tps_vs_llama_cpp_server": ratio,
        "ratio_request_throughput_vs_llama_cpp_server": (tandem["request_throughput"] / baseline["request_throughput"]
                                                         if baseline["request_throughput"] else None),
        "ratio_ttft_median_vs_llama_cpp_server": (tandem["ttft_ms"]["median"] / baseline["ttft_ms"]["median"]
                                                  if tandem["ttft_ms"]["median"] and baseline["ttft_ms"]["median"]
                                                  else None),
        "target_ratio_output_tps": TARGET_RATIO,
        "target_met": bool(complete and ratio is not None and ratio >= TARGET_RATIO),
        "quick": args.quick,
        "notes": [
            "llama_cpp.server streams carry no usage: its output tokens are max_tokens for streams that stopped "
            "for length (min_tokens = max_tokens keeps its end-of-sequence token masked), and its prompt tokens "
            "are counted with the GGUF's tokenizer and chat template (the same numbers tandem's usage reports)",
            "the benchmark client runs on the same cores as the server; timings on shared machines are noisy",
        ],
    }
