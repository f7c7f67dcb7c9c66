"""The prompt router: routing quality on MMLU subjects it never saw, and scoring latency.

    python -m bench.prompt_router --json bench/results/prompt_router.json [--data-dir DIR]

Quality: the RouteLLM GSM8K + MMLU tables, 25% of MMLU subjects held out (seed 0); each
recipe (label x head) is trained on the rest and scored by APGR on the held-out MMLU
prompts. Baseline: a random router (APGR 0.5 in expectation); `apgr_vs_random` is the
chosen recipe's APGR / 0.5. Latency: the shipped default router (cached MiniLM export +
default head), one prompt per call after warm-up, on onnxruntime CPU with 1 intra-op
thread (how the device runs it) and with onnxruntime's default thread count.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import numpy as np

from bench.machine import machine_info, write_report
from router.eval_tables import DEFAULT_DATA_DIR, load_routellm
from router.prompt_router.scorer import load_scorer
from router.prompt_router.training import HeadConfig, cached_embeddings, split_report

CHOSEN = HeadConfig(label="weak_wrong", kind="logistic")  # what default_head.onnx is trained with
RECIPES = {
    "logistic_weak_wrong": CHOSEN,
    "logistic_strong_wins": HeadConfig(label="strong_wins", kind="logistic"),
    "mlp_weak_wrong": HeadConfig(label="weak_wrong", kind="mlp"),
    "mlp_strong_wins": HeadConfig(label="strong_wins", kind="mlp"),
}


def latency(prompts: list[str], threads: int | None, warmup: int = 20) -> dict:
    scorer = load_scorer(threads=threads, providers=["CPUExecutionProvider"])
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
        recipes[name] = split_report(examples, embeddings, config, holdout_fraction=0.25, seed=0)
        print(name, "held-out MMLU APGR", round(recipes[name]["heldout_mmlu"]["apgr"], 4), flush=True)
    chosen = recipes["logistic_weak_wrong"]
    # the same recipe on other subject splits: how much the figure depends on which subjects are held out
    other_splits = {seed: split_report(examples, embeddings, CHOSEN, 0.25, seed)["heldout_mmlu"]["apgr"] for seed in (1, 2, 3, 4)}

    sample = random.Random(0).sample([e.prompt for e in examples], args.num_latency_prompts)
    from router.prompt_router.scorer import load_tokenizer

    lengths = [len(e.ids) for e in load_tokenizer().encode_batch(sample)]
    timings = {"threads_1": latency(sample, 1), "threads_default": latency(sample, None)}
    report = {
        "command": "python -m bench.prompt_router " + " ".join(sys.argv[1:]),
        "machine": machine_info(),
        "chosen_recipe": "logistic_weak_wrong",
        "heldout_subjects": chosen["heldout_groups"],
        "heldout_mmlu_apgr": chosen["heldout_mmlu"]["apgr"],
        "heldout_all_apgr": chosen["heldout"]["apgr"],
        "random_apgr": 0.5,
        "oracle_apgr": chosen["heldout_mmlu"]["oracle_apgr"],
        "cpt50": chosen["heldout_mmlu"]["cpt50"],
        "random_cpt50": 0.5,
        "apgr_vs_random": chosen["heldout_mmlu"]["apgr"] / 0.5,
        "baseline": "random router (APGR 0.5 in expectation)",
        "chosen_recipe_apgr_other_split_seeds": other_splits,
        "recipes": {name: {"heldout_mmlu": r["heldout_mmlu"], "heldout_all": r["heldout"]} for name, r in recipes.items()},
        "latency_p50_ms_1_thread": timings["threads_1"]["p50_ms"],
        "latency": timings,
        "latency_prompts": {"count": len(sample), "tokens_mean": float(np.mean(lengths)), "tokens_p50": float(np.median(lengths)),
                            "tokens_max": int(max(lengths)), "truncated_to": 256},
        "targets": {"heldout_mmlu_apgr": 0.60, "latency_p50_ms_1_thread": 10.0},
    }  # fmt: skip
    write_report(args.json, report, ("heldout_mmlu_apgr", "apgr_vs_random", "cpt50", "latency_p50_ms_1_thread"))


if __name__ == "__main__":
    main()
