"""One bench.serve run against one server, shared by the single-server mode (bench.serve) and
the side-by-side comparison (bench.serve_compare): the workload the arguments describe, the
warm-up and timed run, and the headline figures."""

from __future__ import annotations

import argparse
import asyncio
import math

from bench.serve_client import ClientConfig, arrival_times, run_requests, warm_up
from bench.serve_datasets import GgufTokenizer, gsm8k_requests, mmlu_requests, random_requests
from bench.serve_metrics import compute_metrics
from bench.serve_report import request_progress


class BenchmarkError(RuntimeError):
    """The benchmark cannot run (server unreachable, warm-up refused); the message says why."""


def build_samples(args: argparse.Namespace, tokenizer: GgufTokenizer | None):
    """The workload the arguments describe; chat prompts counted with the chat template when a tokenizer is given."""
    if args.dataset == "random":
        samples = random_requests(
            args.num_prompts,
            args.random_input_len,
            args.random_output_len,
            args.random_range_ratio,
            args.seed,
            tokenizer,
        )
    elif args.dataset == "gsm8k":
        samples = gsm8k_requests(args.num_prompts, args.seed, args.max_output_len, tokenizer, args.data_dir)
    else:
        samples = mmlu_requests(args.num_prompts, args.seed, args.mmlu_output_len, tokenizer, args.data_dir)
    if tokenizer is not None and args.endpoint == "chat" and tokenizer.chat_template:
        for sample in samples:
            sample.prompt_len = tokenizer.count_chat(sample.prompt)
    return samples


def workload_description(args: argparse.Namespace, tokenizer: GgufTokenizer | None) -> dict:
    workload = {
        "dataset": args.dataset,
        "endpoint": args.endpoint,
        "num_prompts": args.num_prompts,
        "request_rate": "inf" if math.isinf(args.request_rate) else args.request_rate,
        "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
        "seed": args.seed,
        "temperature": args.temperature,
        "ignore_eos": args.ignore_eos,
        "prompt_tokens_counted_by": (
            "server usage when sent, else "
            + (
                f"the tokenizer (and chat template) of {tokenizer.model_path}"
                if tokenizer
                else "an estimate (see bench/serve_datasets.py)"
            )
        ),
    }
    if args.dataset == "random":
        workload.update(
            random_input_len=args.random_input_len,
            random_output_len=args.random_output_len,
            random_range_ratio=args.random_range_ratio,
        )
    elif args.dataset == "gsm8k":
        workload["max_output_len"] = args.max_output_len
    else:
        workload["mmlu_output_len"] = args.mmlu_output_len
    return workload


def benchmark(config: ClientConfig, samples, args: argparse.Namespace, label: str) -> dict:
    """Warm up, run the workload with a progress bar, and compute the metrics."""
    check = asyncio.run(warm_up(config, samples[0]))
    if not check.ok:
        raise BenchmarkError(f"{label}: the warm-up request to {config.url} failed: {check.error}")
    times = arrival_times(len(samples), args.request_rate, args.burstiness, args.seed)
    with request_progress(label, len(samples)) as on_done:
        results, duration = asyncio.run(run_requests(config, samples, times, args.max_concurrency, on_done))
    return compute_metrics(results, duration, args.slos_ms)


def headline(metrics: dict) -> dict:
    """Top-level copies of the figures write_report prints."""
    return {
        "completed": metrics["completed"],
        "failed": metrics["failed"],
        "request_throughput": metrics["request_throughput"],
        "output_throughput": metrics["output_throughput"],
        "ttft_ms_median": metrics["ttft_ms"]["median"],
        "tpot_ms_median": metrics["tpot_ms"]["median"],
    }
