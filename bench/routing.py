"""Routing quality and scoring latency of tandem's routers, as `tandem eval` measures them.

    python -m bench.routing --json bench/results/routing.json [--quick | --smoke] [--data-dir DIR]

Writes the JSON, and next to it `<stem>_mmlu.png` and `<stem>_arithmetic.png` (quality
against cloud share, router.evaluation.plot). Every metric is router.evaluation.metrics'
(RouteLLM's decile grid): APGR, CPT(50%) and AUC. Baseline: the random router, APGR 0.5 in
expectation; `*_vs_random` = APGR / 0.5. The random router measured here is `tandem eval`'s
(the mean curve of 100 random orders), so its APGR is 0.5 up to sampling noise.

1. Unseen MMLU subjects (RouteLLM's GSM8K + MMLU design tables, contaminated prompts dropped;
   the locked test subjects and defective tables left out, router.prompt_router.locked_split):
   grouped cross-validation (router.prompt_router.cross_validation.grouped_cv): MMLU
   subjects dealt into 4 folds, every subject held out once per seed (seeds 0, 1, 2; GSM8K
   always trains); APGR is that of the fold-mean curve, then the mean over seeds (and, as
   `apgr_fold_mean` / `_se`, the mean of per-fold APGRs with its standard error). Routers:
   - prompt_router: the shipped cold-start recipe (router.prompt_router.cold_recipe.DEFAULT:
     since issue 37, ridge per tier on prompt length alone, so it ranks as prompt_length does)
     trained per fold on the other subjects + GSM8K and scoring the held-out subjects;
   - prompt_length: untrained, strong-need = the prompt's length in characters;
   - random, oracle (strong_correct - weak_correct).
   The plotted curve of a router is the mean over every (seed, fold) of that fold's decile
   curve: scores of different fold heads are not on one scale, so out-of-fold scores are
   never pooled into one ranking. The legend shows the reported APGR.
   The shipped default router is trained on all of these prompts (in-sample), so it is used
   for latency only, never for quality. bench.router_learning reports the same recipe with
   per-fold means and standard errors, beside every other recipe tried.
2. The checkable-answers task of bench.confidence_auroc: generated arithmetic answered by
   the embedded SmolLM2 (600 questions; 200 with --quick), the same stratified split.
   weak_correct = the local answer is right; strong_correct = True for every item: an
   ASSUMED-correct cloud (key `strong_assumption`), so APGR here measures how well a signal
   orders the local model's wrong answers first. Routers, on the held-out answers: each
   single confidence signal (orientation chosen on the train split; strong-need =
   -confidence), the probe (trained on the train split, scored by its ONNX export with
   onnxruntime), random, oracle. `best_signal` is the signal with the highest held-out
   APGR: picked on the test rows, a baseline flattered by the choice.
3. Scoring latency, onnxruntime CPU, 1 intra-op thread, one item per call after warm-up:
   the shipped prompt router (bench.prompt_router.latency: prompt shape + head) per prompt,
   and the probe's ONNX graph per answer (features already computed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from pathlib import Path

import numpy as np

from bench.confidence_auroc import (
    DEFAULT_N,
    DEFAULT_SEED,
    HOLDOUT_FRACTION,
    SMOKE_N,
    Answers,
    collect_answers,
    heldout_scores,
)
from bench.machine import report_header, write_report
from bench.prompt_router import latency
from router.eval_tables import DEFAULT_DATA_DIR
from router.evaluation.inputs import LoadedTable, load_examples
from router.evaluation.metrics import (
    DECILE_SHARES,
    Outcomes,
    RouterMetrics,
    evaluate_scores,
    oracle_scores,
    random_curve,
    summarize,
)
from router.evaluation.plot import plot_report
from router.evaluation.report import print_report, report_json
from router.prompt_router.cross_validation import grouped_cv
from router.prompt_router.locked_split import design_examples
from router.prompt_router.training import shape_heldout_scorer

FOLDS, SEEDS, QUICK_SEEDS = 4, (0, 1, 2), (0,)
QUICK_N = 200
NUM_RANDOM_SEEDS = 100  # tandem eval's default
NUM_LATENCY_PROMPTS, QUICK_LATENCY_PROMPTS = 200, 50
SMOKE_LATENCY_PROMPTS = 20
STRONG_ASSUMPTION = "strong_correct = True for every arithmetic item: the cloud is assumed always right (not measured)"
TARGETS = {"prompt_router_apgr_unseen_mmlu": 0.60, "prompt_router_latency_p50_ms": 10.0}


def _fold_entry(fold_metrics: list[RouterMetrics], folds: int, seeds, cv: dict | None = None) -> dict:
    """One router's figures over (seed, fold) in grouped_cv's order (seeds outer): the fold-mean
    curve, its APGR per seed averaged over seeds, AUC / CPT as fold means; with `cv` (grouped_cv's
    entry for this router) also the mean of per-fold APGRs and its standard error."""

    def mean(values):
        return float(np.mean(values))  # NaN (a level a fold never reaches) stays NaN

    levels = list(fold_metrics[0].cpt)
    apgrs = np.array([m.apgr for m in fold_metrics])

    def curve_apgr(metrics: list[RouterMetrics]) -> float:
        """APGR of the fold-mean curve: its ends are the mean weak and strong accuracy."""
        quality = np.mean([m.quality for m in metrics], axis=0)
        return float((np.mean([m.auc for m in metrics]) - quality[0]) / (quality[-1] - quality[0]))

    by_seed = {str(seed): curve_apgr(fold_metrics[i * folds : (i + 1) * folds]) for i, seed in enumerate(seeds)}
    entry = {
        "shares": DECILE_SHARES.tolist(),
        "quality": np.mean([m.quality for m in fold_metrics], axis=0).tolist(),
        "auc": mean(np.array([m.auc for m in fold_metrics])),
        "apgr": float(np.mean(list(by_seed.values()))),
        "cpt": {level: mean(np.array([m.cpt[level] for m in fold_metrics])) for level in levels},
        "apgr_by_seed": by_seed,
        "apgr_fold_min": float(apgrs.min()),
        "apgr_fold_max": float(apgrs.max()),
    }
    if cv is not None:
        entry.update(apgr_fold_mean=cv["apgr"], apgr_fold_mean_se=cv["apgr_se"])
    return entry


def unseen_mmlu(table: LoadedTable, folds: int = FOLDS, seeds=SEEDS, num_random_seeds: int = NUM_RANDOM_SEEDS) -> dict:
    """Section 1: a report in `tandem eval`'s format (report["routers"][name] = metrics dict)
    plus the grouped-CV details."""
    examples = table.examples
    lengths = np.array([len(e.prompt) for e in examples], dtype=float)
    oracle = oracle_scores(Outcomes.of(examples))
    scorers = {
        "prompt_router": shape_heldout_scorer(examples),
        "prompt_length": lambda train, held: lengths[held],
        "oracle": lambda train, held: oracle[held],
    }
    recorded: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {name: [] for name in scorers}

    def recording(name, scorer):
        def score_heldout(train, held):
            scores = np.asarray(scorer(train, held), dtype=float)
            recorded[name].append((held, scores))
            return scores

        return score_heldout

    start = time.perf_counter()
    cv = grouped_cv(
        examples, {name: recording(name, scorer) for name, scorer in scorers.items()}, folds=folds, seeds=seeds
    )
    print(f"unseen MMLU: {time.perf_counter() - start:.0f} s", flush=True)
    routers = {}
    for name in scorers:
        fold_metrics = [
            evaluate_scores(scores, Outcomes.of([examples[i] for i in held])) for held, scores in recorded[name]
        ]
        routers[name] = _fold_entry(fold_metrics, folds, seeds, cv["recipes"][name])
        print(f"unseen MMLU: {name} APGR {routers[name]['apgr']:.4f}", flush=True)
    held_sets = [held for held, _ in recorded["oracle"]]
    fold_outcomes = [Outcomes.of([examples[i] for i in held]) for held in held_sets]
    random_metrics = [
        summarize(random_curve(outcomes, num_random_seeds, seed=0), outcomes) for outcomes in fold_outcomes
    ]
    routers = {
        "prompt_router": routers["prompt_router"],
        "prompt_length": routers["prompt_length"],
        "random": _fold_entry(random_metrics, folds, seeds),
        "oracle": routers["oracle"],
    }
    subjects = sorted(
        {str(examples[i].extra.get("subject") or examples[i].source) for held in held_sets[:folds] for i in held}
    )
    return {
        "router": f"unseen MMLU subjects ({folds}-fold grouped CV x {len(seeds)} seed(s))",
        "num_prompts": int(sum(held.size for held in held_sets[:folds])),  # each MMLU row is held out once per seed
        "num_dropped_contaminated": table.num_dropped_contaminated,
        "sources": table.sources,
        "num_train_only_prompts": len(examples) - int(sum(held.size for held in held_sets[:folds])),
        "num_subjects": len(subjects),
        "weak_acc": float(np.mean([o.weak_acc for o in fold_outcomes])),  # fold means, like the curves
        "strong_acc": float(np.mean([o.strong_acc for o in fold_outcomes])),
        "num_random_seeds": num_random_seeds,
        "folds": folds,
        "seeds": list(seeds),
        "recipe": "router.prompt_router.training.shape_heldout_scorer: ridge per tier on the prompt shape, "
        "score = predicted gain",
        "curve": "mean over (seed, fold) of each fold's decile curve; APGR of the fold-mean curve per seed, "
        "averaged over seeds; AUC/CPT fold means",
        "routers": routers,
    }


def arithmetic(
    answers: Answers,
    seed: int = DEFAULT_SEED,
    holdout_fraction: float = HOLDOUT_FRACTION,
    num_random_seeds: int = NUM_RANDOM_SEEDS,
) -> tuple[dict, object]:
    """Section 2: (a report in `tandem eval`'s format with every router, bench.confidence_auroc's
    HeldoutScores) on the held-out answers, against an always-right cloud."""
    scored = heldout_scores(answers, seed, holdout_fraction)
    weak = answers.labels[scored.heldout]
    outcomes = Outcomes(weak, np.ones_like(weak))
    routers = {f"signal:{name}": evaluate_scores(-values, outcomes) for name, values in scored.oriented_heldout.items()}
    routers["probe"] = evaluate_scores(-scored.probe_scores, outcomes)
    routers["random"] = summarize(random_curve(outcomes, num_random_seeds, seed=0), outcomes)
    routers["oracle"] = evaluate_scores(oracle_scores(outcomes), outcomes)
    routers = {name: metrics.as_dict() for name, metrics in routers.items()}
    for name, values in scored.signals.items():
        routers[f"signal:{name}"].update(orientation=values["orientation"], heldout_auroc=values["heldout_auroc"])
    routers["probe"]["heldout_auroc"] = float(_auroc(scored.probe_scores, weak))
    signal_names = [name for name in routers if name.startswith("signal:")]
    best = max(signal_names, key=lambda name: routers[name]["apgr"])
    report = {
        "router": "arithmetic: local confidence (held-out answers)",
        "num_prompts": int(weak.size),
        "num_dropped_contaminated": 0,
        "sources": [
            f"confidence.arithmetic_task.generate_items({len(answers.items)}, seed={seed}), "
            f"held out {holdout_fraction:.0%}"
        ],
        "weak_acc": outcomes.weak_acc,
        "strong_acc": outcomes.strong_acc,
        "strong_assumption": STRONG_ASSUMPTION,
        "num_random_seeds": num_random_seeds,
        "counts": {
            "items": len(answers.items),
            "right": int(answers.labels.sum()),
            "train": int(scored.train.size),
            "heldout": int(weak.size),
            "heldout_right": int(weak.sum()),
        },
        "best_signal": best.removeprefix("signal:"),
        "routers": routers,
    }
    return report, scored


def _auroc(scores, labels) -> float:
    from confidence.auroc import auroc

    return auroc(np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool))


def probe_latency(onnx_probe, features: np.ndarray, warmup: int = 20) -> dict:
    """The probe's ONNX graph (1 thread, as load_probe opens it), one answer's features per call."""
    rows = [np.asarray(row, dtype=np.float32) for row in features]
    for row in rows[:warmup]:
        onnx_probe.predict(row)
    times = []
    for row in rows:
        start = time.perf_counter()
        onnx_probe.predict(row)
        times.append((time.perf_counter() - start) * 1000)
    return {f"p{q}_ms": float(np.percentile(times, q)) for q in (50, 90, 99)} | {
        "mean_ms": float(np.mean(times)),
        "count": len(times),
    }


def plotted(report: dict, names: list[str]) -> dict:
    """The report with only `names` among its routers (in that order), for a readable figure."""
    return report | {"routers": {name: report["routers"][name] for name in names}}


def strict(report: dict) -> dict:
    """NaN (a level never reached) as null, as `tandem eval --json` writes it."""
    return json.loads(report_json(report))


def build(
    data_dir: str, quick: bool, n: int | None, seed: int, threads: int | None, smoke: bool = False
) -> tuple[dict, dict, dict]:
    """(the bench report, the MMLU section, the arithmetic section). `smoke`: tiny sizes, figures meaningless."""
    seeds = QUICK_SEEDS if quick or smoke else SEEDS
    n = n or (SMOKE_N if smoke else QUICK_N if quick else DEFAULT_N)
    start = time.perf_counter()
    table = load_examples("routellm", data_dir)
    # the design subjects only: the locked ones are scored by bench.router_learning, once per shipped recipe
    table = dataclasses.replace(table, examples=design_examples(table.examples))
    mmlu = unseen_mmlu(table, FOLDS, seeds)
    mmlu_seconds = time.perf_counter() - start

    start = time.perf_counter()
    answers = collect_answers(n, seed, threads)
    generation_seconds = time.perf_counter() - start
    arith, scored = arithmetic(answers, seed)
    print(f"arithmetic: {n} answers in {generation_seconds:.0f} s, {answers.labels.mean():.1%} right", flush=True)

    num_latency_prompts = SMOKE_LATENCY_PROMPTS if smoke else QUICK_LATENCY_PROMPTS if quick else NUM_LATENCY_PROMPTS
    sample = random.Random(0).sample([e.prompt for e in table.examples], num_latency_prompts)
    router_latency = latency(sample, 1)
    probe_timing = probe_latency(scored.onnx_probe, answers.features[scored.heldout])

    routers, arith_routers = mmlu["routers"], arith["routers"]
    best = "signal:" + arith["best_signal"]
    report = {
        **report_header("routing", smoke=smoke),
        "quick": quick,
        "baseline": "random router: APGR 0.5 in expectation "
        "(tandem eval's random router, measured under each section's routers.random)",
        "random_apgr": 0.5,
        "prompt_router_apgr_unseen_mmlu": routers["prompt_router"]["apgr"],
        "prompt_router_cpt50_unseen_mmlu": routers["prompt_router"]["cpt"]["50%"],
        "prompt_router_auc_unseen_mmlu": routers["prompt_router"]["auc"],
        "prompt_length_apgr_unseen_mmlu": routers["prompt_length"]["apgr"],
        "oracle_apgr_unseen_mmlu": routers["oracle"]["apgr"],
        "random_apgr_measured_unseen_mmlu": routers["random"]["apgr"],
        "probe_apgr_arithmetic": arith_routers["probe"]["apgr"],
        "probe_cpt50_arithmetic": arith_routers["probe"]["cpt"]["50%"],
        "best_signal_arithmetic": arith["best_signal"],
        "best_signal_apgr_arithmetic": arith_routers[best]["apgr"],
        "oracle_apgr_arithmetic": arith_routers["oracle"]["apgr"],
        "random_apgr_measured_arithmetic": arith_routers["random"]["apgr"],
        "prompt_router_apgr_vs_random": routers["prompt_router"]["apgr"] / 0.5,
        "prompt_length_apgr_vs_random": routers["prompt_length"]["apgr"] / 0.5,
        "probe_apgr_vs_random": arith_routers["probe"]["apgr"] / 0.5,
        "best_signal_apgr_vs_random": arith_routers[best]["apgr"] / 0.5,
        "prompt_router_latency_p50_ms": router_latency["p50_ms"],
        "prompt_router_latency_p90_ms": router_latency["p90_ms"],
        "probe_latency_p50_ms": probe_timing["p50_ms"],
        "targets": TARGETS,
        "strong_assumption": STRONG_ASSUMPTION,
        "unseen_mmlu": mmlu,
        "arithmetic": arith
        | {
            "generation": {
                "seconds": answers.seconds,
                "output_tokens": answers.num_output_tokens,
                "model": "embedded SmolLM2-135M-Instruct (GGUF), local_runtime.AsyncLocalEngine",
            }
        },
        "latency": {
            "prompt_router": router_latency
            | {
                "threads": 1,
                "prompts": len(sample),
                "what": "shipped default router (prompt shape + head), in-sample on these tables: latency only",
            },
            "probe": probe_timing
            | {"threads": 1, "what": "ONNX probe graph + calibrator per answer, features precomputed"},
        },
        "seconds": {"unseen_mmlu": mmlu_seconds, "arithmetic_generation": generation_seconds},
    }
    return strict(report), mmlu, arith


def write_plots(json_path: str | Path, mmlu: dict, arith: dict) -> list[Path]:
    stem = Path(json_path).with_suffix("")
    stem.parent.mkdir(parents=True, exist_ok=True)
    mmlu_png, arith_png = Path(f"{stem}_mmlu.png"), Path(f"{stem}_arithmetic.png")
    plot_report(mmlu, mmlu_png)
    plot_report(plotted(arith, ["probe", "signal:" + arith["best_signal"], "random", "oracle"]), arith_png)
    return [mmlu_png, arith_png]


def print_signals(arith: dict, console=None) -> None:
    """Every arithmetic router, best APGR first (print_report's curve table would be too wide)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Arithmetic: every router on the held-out answers (cloud assumed always right)")
    for column in ("router", "right when", "AUROC", "AUC", "APGR", "CPT(50%)"):
        table.add_column(column, justify="left" if column == "router" else "right")
    for name, m in sorted(arith["routers"].items(), key=lambda item: -item[1]["apgr"]):
        auroc = m.get("heldout_auroc")
        table.add_row(
            name,
            m.get("orientation", "-"),
            "-" if auroc is None else f"{auroc:.3f}",
            f"{m['auc']:.3f}",
            f"{m['apgr']:.3f}",
            f"{m['cpt']['50%']:.3f}",
        )
    (console or Console()).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument(
        "--quick", action="store_true", help=f"one CV seed, {QUICK_N} arithmetic questions, fewer latency prompts"
    )
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    parser.add_argument(
        "--n", type=int, default=None, help=f"arithmetic questions (default {DEFAULT_N}, {QUICK_N} with --quick)"
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="arithmetic question generator and split seed")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: all cores)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"only checks that the bench works (one CV seed, {SMOKE_N} arithmetic "
        f"questions, {SMOKE_LATENCY_PROMPTS} latency prompts): figures meaningless",
    )
    args = parser.parse_args()

    report, mmlu, arith = build(args.data_dir, args.quick, args.n, args.seed, args.threads, smoke=args.smoke)
    print_report(mmlu)
    print_report(plotted(arith, ["probe", "signal:" + arith["best_signal"], "random", "oracle"]))
    print_signals(arith)
    for path in write_plots(args.json, mmlu, arith):
        print(f"wrote {path}")
    write_report(
        args.json,
        report,
        (
            "prompt_router_apgr_unseen_mmlu",
            "prompt_length_apgr_unseen_mmlu",
            "random_apgr",
            "probe_apgr_arithmetic",
            "best_signal_arithmetic",
            "best_signal_apgr_arithmetic",
            "prompt_router_latency_p50_ms",
            "probe_latency_p50_ms",
        ),
    )


if __name__ == "__main__":
    main()
