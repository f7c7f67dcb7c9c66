"""POST /v1/embeddings' model (sdk.embeddings: all-MiniLM-L6-v2, fp32 ONNX on onnxruntime) against
sentence-transformers on the same weights (PyTorch, CPU), side by side, in one process.

    python -m bench.embeddings [--quick] --json bench/results/embeddings.json

Texts: prompts of RouteLLM's MMLU and GSM8K tables (../shared/data), shuffled with a fixed seed
(512; 128 with --quick), cut to the model's 256-token window by both sides. Throughput in texts
per second at batch 1 (one text per call) and batch 32, each side with every core (torch's and
onnxruntime's thread counts set alike), after a warm-up; 3 rounds with the sides in turn, the
median and the spread over rounds. Baseline: sentence-transformers' `encode` with
normalize_embeddings (what this model's sentence-transformers config computes);
`ratio_vs_sentence_transformers_b*` = tandem / it, per round. `cosine_min_vs_fp32`: the
smallest cosine between tandem's vector and sentence-transformers' fp32 vector for a text.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import numpy as np

from bench.machine import report_header, write_report
from bench.repetitions import median_and_spread
from router.eval_tables import DEFAULT_DATA_DIR, load_routellm

ROUNDS = 3
TARGETS = {"ratio_vs_sentence_transformers_b32": 1.0, "cosine_min_vs_fp32": 0.98}


def texts_per_s(embed, texts: list[str], batch_size: int) -> float:
    start = time.perf_counter()
    for offset in range(0, len(texts), batch_size):
        embed(texts[offset : offset + batch_size])
    return len(texts) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--quick", action="store_true", help="128 texts instead of 512")
    parser.add_argument("--smoke", action="store_true", help="32 texts, one round: checks the bench works")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    args = parser.parse_args()

    import torch
    from sentence_transformers import SentenceTransformer

    from router.prompt_router.embedder_export import package_model_dir
    from sdk.embeddings.model import WINDOW, EmbeddingModel

    header = report_header("embeddings", smoke=args.smoke)
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    prompts = [e.prompt for e in load_routellm(args.data_dir)]
    texts = random.Random(0).sample(prompts, 32 if args.smoke else 128 if args.quick else 512)
    ours = EmbeddingModel(threads=threads)
    theirs = SentenceTransformer(str(package_model_dir()), device="cpu")
    theirs.max_seq_length = WINDOW

    def tandem(batch):
        return ours.embed(batch, truncate=True).vectors

    def reference(batch):
        return theirs.encode(batch, batch_size=len(batch), normalize_embeddings=True, convert_to_numpy=True)

    cosine = float(np.min(np.sum(tandem(texts) * reference(texts), axis=1)))
    for embed in (tandem, reference):  # warm-up: first calls allocate
        texts_per_s(embed, texts[:64], 32)
        texts_per_s(embed, texts[:16], 1)
    rounds = {f"{side}_b{batch}": [] for side in ("tandem", "sentence_transformers") for batch in (1, 32)}
    for _ in range(1 if args.smoke else ROUNDS):
        for batch in (1, 32):
            rounds[f"tandem_b{batch}"].append(texts_per_s(tandem, texts, batch))
            rounds[f"sentence_transformers_b{batch}"].append(texts_per_s(reference, texts, batch))
    ratios = {
        batch: [t / s for t, s in zip(rounds[f"tandem_b{batch}"], rounds[f"sentence_transformers_b{batch}"])]
        for batch in (1, 32)
    }
    figures = {name: median_and_spread(values) for name, values in rounds.items()}
    report = {
        **header,
        "quick": args.quick,
        "baseline": "sentence-transformers encode(normalize_embeddings=True) on the same weights, CPU, same thread "
        "count, run in turn",
        "threads": threads,
        "num_texts": len(texts),
        "tokens_mean": float(np.mean(ours.count_tokens(texts))),
        "texts_per_s_b1": figures["tandem_b1"][0],
        "texts_per_s_b32": figures["tandem_b32"][0],
        "sentence_transformers_texts_per_s_b1": figures["sentence_transformers_b1"][0],
        "sentence_transformers_texts_per_s_b32": figures["sentence_transformers_b32"][0],
        "ratio_vs_sentence_transformers_b1": median_and_spread(ratios[1])[0],
        "ratio_vs_sentence_transformers_b1_spread": median_and_spread(ratios[1])[1],
        "ratio_vs_sentence_transformers_b32": median_and_spread(ratios[32])[0],
        "ratio_vs_sentence_transformers_b32_spread": median_and_spread(ratios[32])[1],
        "cosine_min_vs_fp32": cosine,
        "rounds": rounds,
        "targets": TARGETS,
    }
    write_report(
        args.json,
        report,
        ("texts_per_s_b1", "texts_per_s_b32", "ratio_vs_sentence_transformers_b32", "cosine_min_vs_fp32"),
    )


if __name__ == "__main__":
    main()
