"""The prompt router: routing quality on MMLU subjects it never saw, and scoring latency.

    python -m bench.prompt_router --json bench/results/prompt_router.json [--data-dir DIR]

Quality: the RouteLLM GSM8K + MMLU tables; MMLU subjects dealt into 4 folds (3 seeds),
each fold held out in turn while the head trains on the other subjects + GSM8K, APGR on
the held-out subjects averaged over folds and seeds (training.grouped_cv: one split alone
swings 0.51-0.66). Each recipe (label x head) on the int8 embeddings the device runs.
Baseline: a random router (APGR 0.5 in expectation); `apgr_vs_random` is the chosen
recipe's APGR / 0.5. Latency: the shipped default router (cached int8 MiniLM export +
default head), one prompt per call after warm-up, on onnxruntime CPU with 1 intra-op
thread (how the device runs it) and with onnxruntime's default thread count; the fp32
export with the same head for comparison.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import numpy as np

from bench.machine import machine_info, write_report
from router.eval_tables import DEFAULT_DATA_DIR, load_routellm
from router.prompt_router.scorer import PromptScorer, load_scorer, open_session
from router.prompt_router.training import HeadConfig, cached_embeddings, grouped_cv, head_heldout_scorer

CHOSEN = HeadConfig(label="weak_wrong", kind="logistic")  # what default_head.onnx is trained with
RECIPES = {
    "logistic_weak_wrong": CHOSEN,
    "logistic_strong_wins": HeadConfig(label="strong_wins", kind="logistic"),
    "mlp_weak_wrong": HeadConfig(label="weak_wrong", kind="mlp"),
    "mlp_strong_wins": HeadConfig(label="strong_wins", kind="mlp"),
}


def fp32_scorer(threads: int | None) -> PromptScorer:
    """The default head behind the exact fp32 export: for timing only (the head was trained on int8)."""
    from router.prompt_router.embedder_export import ensure_embedder

    default = load_scorer(threads=threads, providers=["CPUExecutionProvider"])
    embedder = open_session(ensure_embedder(precision="fp32"), ["CPUExecutionProvider"], threads)
    metadata = {**default.metadata, "embedder_precision": "fp32"}
    return PromptScorer(default.tokenizer, [embedder, default.sessions[1]], metadata, default.path)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    parser.add_argument("--num-latency-prompts", type=int, default=200)
    args = parser.parse_args()

    examples = load_routellm(args.data_dir)
    embeddings = cached_embeddings([e.prompt for e in examples])
    recipes = {}
    for name, config in RECIPES.items():
        recipes[name] = grouped_cv(examples, head_heldout_scorer(examples, embeddings, config))
        print(name, "unseen-subject MMLU APGR", round(recipes[name]["apgr"], 4), flush=True)
    chosen = recipes["logistic_weak_wrong"]

    sample = random.Random(0).sample([e.prompt for e in examples], args.num_latency_prompts)
    from router.prompt_router.scorer import MAX_TOKENS, load_tokenizer

    lengths = [len(e.ids) for e in load_tokenizer().encode_batch(sample)]
    timings = {"threads_1": latency(sample, 1), "threads_default": latency(sample, None),
               "fp32_threads_1": latency(sample, 1, scorer=fp32_scorer(1))}  # fmt: skip
    report = {
        "command": "python -m bench.prompt_router " + " ".join(sys.argv[1:]),
        "machine": machine_info(),
        "chosen_recipe": "logistic_weak_wrong",
        "embedder_precision": "int8",
        "evaluation": "MMLU subjects in 4 folds x seeds 0,1,2; each fold unseen in training; APGR of the fold-mean curve, then the mean over seeds",
        "heldout_mmlu_apgr": chosen["apgr"],
        "heldout_mmlu_apgr_by_seed": chosen["apgr_by_seed"],
        "random_apgr": 0.5,
        "oracle_apgr": chosen["oracle_apgr"],
        "cpt50": chosen["cpt50"],
        "auc": chosen["auc"],
        "random_cpt50": 0.5,
        "apgr_vs_random": chosen["apgr"] / 0.5,
        "baseline": "random router (APGR 0.5 in expectation)",
        "recipes": recipes,
        "latency_p50_ms_1_thread": timings["threads_1"]["p50_ms"],
        "latency": timings,
        "latency_prompts": {"count": len(sample), "tokens_mean": float(np.mean(lengths)), "tokens_p50": float(np.median(lengths)),
                            "tokens_max": int(max(lengths)), "truncated_to": MAX_TOKENS},
        "targets": {"heldout_mmlu_apgr": 0.60, "latency_p50_ms_1_thread": 10.0},
    }  # fmt: skip
    write_report(args.json, report, ("heldout_mmlu_apgr", "apgr_vs_random", "cpt50", "latency_p50_ms_1_thread"))


if __name__ == "__main__":
    main()
