"""The prompt router's scoring latency, as the device runs it (onnxruntime CPU, one prompt per
call after warm-up, 1 intra-op thread and onnxruntime's default count).

    python -m bench.prompt_router [--quick | --smoke] --json bench/results/prompt_router.json [--data-dir DIR]

Two routers: the shipped cold start (prompt shape + linear head: no embedding model), and a
router trained from traffic (the int8 MiniLM export + the head + a topic correction), built
here from the RouteLLM tables with a quarter of the MMLU subjects played as labelled traffic.
Target: p50 <= 10 ms on 1 thread for either. Routing quality lives in bench.router_learning
(zero-shot recipes, learning from traffic) and bench.routing (`tandem eval`'s curves).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.machine import report_header, write_report
from router.eval_tables import DEFAULT_DATA_DIR, load_routellm
from router.prompt_router.scorer import MAX_TOKENS, PromptScorer, load_scorer

TARGET_P50_MS = 10.0
SMOKE_EXAMPLES, SMOKE_PROMPTS = 400, 20  # --smoke: table rows kept (so few prompts to embed), prompts timed


def smoke_examples(examples: list, count: int, seed: int = 0) -> list:
    """`count` of the table's rows drawn at random, in table order: every subject stays, with fewer rows
    (what --smoke runs on, so that the MiniLM embeddings take seconds instead of minutes)."""
    rows = sorted(random.Random(seed).sample(range(len(examples)), min(count, len(examples))))
    return [examples[i] for i in rows]


def latency(prompts: list[str], threads: int | None, warmup: int = 20, scorer: PromptScorer | None = None) -> dict:
    scorer = scorer or load_scorer(threads=threads, providers=["CPUExecutionProvider"])
    for prompt in prompts[:warmup]:
        scorer(prompt)
    times = []
    for prompt in prompts:
        start = time.perf_counter()
        scorer(prompt)
        times.append((time.perf_counter() - start) * 1000)
    return {f"p{q}_ms": float(np.percentile(times, q)) for q in (50, 90, 99)} | {"mean_ms": float(np.mean(times))}


def traffic_router(examples, path: Path) -> PromptScorer:
    """A router trained on the tables' other subjects plus a quarter of the MMLU subjects as
    labelled traffic (embedded with the int8 export, as the traffic record does)."""
    from router.prompt_router.cross_validation import subject_split
    from router.prompt_router.embeddings import cached_embeddings
    from router.prompt_router.training import table_rows, train_router

    train, held, _ = subject_split(examples, 0.25, seed=0)
    traffic = table_rows([examples[i] for i in held])
    traffic.embedding = cached_embeddings([examples[i].prompt for i in held])
    train_router([examples[i] for i in train], path, traffic=traffic, holdout_fraction=0)
    return load_scorer(path, threads=1, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--quick", action="store_true", help="50 prompts instead of 200")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"only checks that the bench works ({SMOKE_EXAMPLES} table rows, {SMOKE_PROMPTS} prompts): "
        "figures meaningless",
    )
    args = parser.parse_args()

    examples = load_routellm(args.data_dir)
    if args.smoke:
        examples = smoke_examples(examples, SMOKE_EXAMPLES)
    sample = random.Random(0).sample(
        [e.prompt for e in examples], SMOKE_PROMPTS if args.smoke else 50 if args.quick else 200
    )
    with tempfile.TemporaryDirectory() as scratch:
        learned = traffic_router(examples, Path(scratch) / "traffic_router.onnx")
        timings = {
            "default_threads_1": latency(sample, 1),
            "default_threads_default": latency(sample, None),
            "traffic_router_threads_1": latency(sample, 1, scorer=learned),
        }
    lengths = [len(e.ids) for e in learned.tokenizer.encode_batch(sample)]
    report = {
        **report_header("prompt_router", smoke=args.smoke),
        "quick": args.quick,
        "baseline": "none run: a latency target, p50 <= 10 ms on 1 thread",
        "latency_p50_ms_1_thread": timings["default_threads_1"]["p50_ms"],
        "latency_traffic_router_p50_ms_1_thread": timings["traffic_router_threads_1"]["p50_ms"],
        "latency": timings,
        "latency_prompts": {
            "count": len(sample),
            "tokens_mean": float(np.mean(lengths)),
            "tokens_p50": float(np.median(lengths)),
            "tokens_max": int(max(lengths)),
            "truncated_to": MAX_TOKENS,
        },
        "traffic_router": {
            "topic_correction": learned.metadata["topic_correction"],
            "embedder_precision": learned.metadata["embedder_precision"],
        },
        "targets": {"latency_p50_ms_1_thread": TARGET_P50_MS, "latency_traffic_router_p50_ms_1_thread": TARGET_P50_MS},
    }
    write_report(args.json, report, ("latency_p50_ms_1_thread", "latency_traffic_router_p50_ms_1_thread"))


if __name__ == "__main__":
    main()
