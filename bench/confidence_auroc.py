"""How well confidence signals and the learned probe predict "the local answer is right",
on a task whose answers can be checked: generated arithmetic of rising difficulty.

    python -m bench.confidence_auroc --json bench/results/confidence_auroc.json [--n N] [--seed S] [--smoke]

The embedded local model (SmolLM2-135M-Instruct, GGUF) answers every question greedily
(temperature 0, at most 16 tokens), all requests submitted at once so the engine batches
them. Each answer gives one feature vector (confidence.aggregate.FEATURE_NAMES) and a label
(the reply's answer, confidence.arithmetic_task.reply_answer, is the true one). A stratified split (fixed seed)
holds out part of the answers; on the rest we train the confidence probe (logistic, Platt
calibration fitted on a share of the train split, as ConfidenceProbe does), export it to
ONNX and score the held-out answers with onnxruntime (confidence.probe_runtime.load_probe):
the probe measured is the one a device would run.

Every single signal is oriented on the TRAIN split only: if its train AUROC is below 0.5,
lower values mean "more likely right" and we score it negated (orientation "lower"). Its
held-out AUROC is then reported as is, so a signal that flips sign between the splits
shows up below 0.5 rather than being flattered by max(s, 1 - s).

Key: `probe_auroc_minus_best_signal`, the probe's held-out AUROC minus that of the best
single signal (the one with the highest held-out AUROC, named in `best_signal`), with the
paired DeLong standard error of that difference.

--compare-prefill answers the same questions twice, prompts prefilled on the model's own weights
(prefill_weights = off) and through the 16-bit copy `--prefill-weights` names (default: the one
`auto` measured on this machine; local_runtime.prefill_choice). Probes and thresholds are fitted on
the first kind of answers, so the question is whether they still hold on the second: a probe is
trained on the own-weights answers of one split and scored on the held-out questions of both runs.
Keys `shipped_probe_auroc_copy_minus_off` and `best_signal_auroc_copy_minus_off`, each with an SE
(the two AUROCs' DeLong variances added: the runs' answers differ, so they are not paired).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from confidence.aggregate import FEATURE_NAMES, sequence_features
from confidence.arithmetic_task import LEVELS, ArithmeticItem, generate_items, is_correct
from confidence.auroc import auroc
from confidence.signals import signals_from_events
from router.evaluation.paired_auc import delong_components, paired_auroc_difference_se
from sdk.protocol.engine import GenerationRequest, SamplingParams

MAX_TOKENS = 16
TOP_LOGPROBS = 5  # alternatives per token, so mean_topk_mass is defined
HOLDOUT_FRACTION = 0.4  # share of each class held out for the reported AUROCs
DEFAULT_N = 600
DEFAULT_SEED = 0
SMOKE_N = 60  # enough answers that both classes reach the probe's fit, calibration and held-out rows


def local_engine_config(n_threads: int | None = None, kv_cache_type: str = "f16"):
    """A small engine over the embedded model: 32 sequences decoded together, the rest
    of a run queued (max_waiting) rather than refused."""
    from local_runtime.config import LocalEngineConfig

    return LocalEngineConfig(
        kv_cache_tokens=4096,
        max_num_seqs=32,
        max_num_batched_tokens=512,
        max_model_len=256,
        max_waiting=100_000,
        n_threads=n_threads,
        kv_cache_type=kv_cache_type,
    )


@dataclass
class Answers:
    """What the local model answered: one row per item."""

    items: list[ArithmeticItem]
    texts: list[str]
    features: np.ndarray  # [n, len(FEATURE_NAMES)] float64
    labels: np.ndarray  # [n] bool: the answer is right
    levels: np.ndarray  # [n] int difficulty level
    seconds: float  # wall time of the generation
    num_output_tokens: int


async def _answer_all(engine, items: list[ArithmeticItem]) -> list[tuple[str, list]]:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=TOP_LOGPROBS)

    async def answer(index: int, item: ArithmeticItem) -> tuple[str, list]:
        prompt = engine.apply_chat_template(list(item.messages))
        events = [event async for event in engine.generate(GenerationRequest(f"q{index}", prompt, params))]
        return "".join(event.text for event in events), events

    return await asyncio.gather(*(answer(i, item) for i, item in enumerate(items)))


def answer_items(engine, items: list[ArithmeticItem]) -> Answers:
    """Run every item through a started AsyncLocalEngine at once; features and labels."""
    start = time.perf_counter()
    results = asyncio.run(_answer_all(engine, items))
    seconds = time.perf_counter() - start
    texts = [text for text, _ in results]
    features = np.stack([sequence_features(signals_from_events(events)) for _, events in results])
    labels = np.array([is_correct(text, item.answer) for text, item in zip(texts, items)], dtype=bool)
    return Answers(
        items=items,
        texts=texts,
        features=features,
        labels=labels,
        levels=np.array([item.level for item in items], dtype=int),
        seconds=seconds,
        num_output_tokens=sum(len(events) for _, events in results),
    )


def collect_answers(n: int, seed: int, n_threads: int | None = None, prefill_weights: str = "auto") -> Answers:
    """Generate `n` items from `seed` and answer them with a fresh local engine."""
    return collect_answers_with(n, seed, n_threads, prefill_weights)[0]


def collect_answers_with(
    n: int, seed: int, n_threads: int | None, prefill_weights: str, kv_cache_type: str = "f16"
) -> tuple[Answers, str]:
    """collect_answers, and the weights prompts prefilled on ("own", "bf16" or "f16")."""
    import dataclasses

    from local_runtime.async_engine import AsyncLocalEngine

    config = dataclasses.replace(local_engine_config(n_threads, kv_cache_type), prefill_weights=prefill_weights)
    engine = AsyncLocalEngine(config).start()
    try:
        engine.wait_ready(180)
        kind = engine.engine.prefill_choice.kind or "own"
        return answer_items(engine, generate_items(n, seed)), kind
    finally:
        engine.shutdown()


def auroc_se(scores: np.ndarray, labels: np.ndarray) -> float:
    """DeLong standard error of one AUROC."""
    v, w = delong_components(scores, labels)
    return math.sqrt(np.var(v, ddof=1) / v.size + np.var(w, ddof=1) / w.size)


def compare_prefill(off: Answers, copy: Answers, seed: int, holdout_fraction: float = HOLDOUT_FRACTION) -> dict:
    """A probe fitted on own-weights answers, and the best single signal oriented on them, scored on the
    held-out questions of both runs (see the module docstring)."""
    return compare_answers(off, copy, seed, ("off", "copy"), holdout_fraction)


def compare_answers(
    base: Answers, other: Answers, seed: int, names: tuple[str, str], holdout_fraction: float = HOLDOUT_FRACTION
) -> dict:
    """A probe fitted on `base`'s answers of the train split, and the best single signal oriented on them, scored
    on the held-out questions of both runs: does what was fitted on one engine setting hold on another? Keys
    `{score}_auroc_{other}_minus_{base}` with an SE (the two AUROCs' DeLong variances added: the runs' answers
    differ, so they are not paired)."""
    from confidence.probe import ConfidenceProbe, ProbeConfig, model_fingerprint_for_gguf
    from confidence.probe_training import stratified_split
    from sdk.engine_common.model_files import resolve_model_path

    train, heldout = stratified_split(base.labels, holdout_fraction, seed)
    fingerprint = model_fingerprint_for_gguf(resolve_model_path(None))
    config = ProbeConfig(kind="logistic", calibration="platt", seed=seed)
    probe = ConfidenceProbe(list(FEATURE_NAMES), fingerprint, config).fit(base.features[train], base.labels[train])
    best = evaluate(base, seed, holdout_fraction)["best_signal"]
    column = FEATURE_NAMES.index(best)
    fill = float(np.nanmedian(base.features[train, column]))
    sign = 1.0 if auroc(_impute(base.features[train, column], fill), base.labels[train]) >= 0.5 else -1.0
    sides = {}
    for name, answers in zip(names, (base, other)):
        labels = answers.labels[heldout]
        scores = {
            "shipped_probe": np.asarray(probe.predict(answers.features[heldout]), dtype=np.float64),
            "best_signal": sign * _impute(answers.features[heldout, column], fill),
        }
        sides[name] = {"accuracy": float(answers.labels.mean())}
        for score_name, values in scores.items():
            sides[name][f"{score_name}_heldout_auroc"] = auroc(values, labels)
            sides[name][f"{score_name}_heldout_auroc_se"] = auroc_se(values, labels)
    mean_logprob = FEATURE_NAMES.index("mean_logprob")
    out = {
        "best_signal": best,
        "sides": sides,
        "answers_identical_share": float(np.mean([a == b for a, b in zip(base.texts, other.texts)])),
        "labels_differ": int((base.labels != other.labels).sum()),
        "mean_logprob_mean_abs_diff": float(
            np.nanmean(np.abs(base.features[:, mean_logprob] - other.features[:, mean_logprob]))
        ),
    }
    base_name, other_name = names
    for score_name in ("shipped_probe", "best_signal"):
        key = f"{score_name}_heldout_auroc"
        name = f"{score_name}_auroc_{other_name}_minus_{base_name}"
        out[name] = sides[other_name][key] - sides[base_name][key]
        out[name + "_se"] = math.hypot(sides[other_name][key + "_se"], sides[base_name][key + "_se"])
    return out


def _impute(column: np.ndarray, fill: float) -> np.ndarray:
    return np.where(np.isnan(column), fill, column)


@dataclass
class HeldoutScores:
    """The split and every score on its held-out rows (what evaluate and bench.routing report)."""

    train: np.ndarray  # row indices
    heldout: np.ndarray
    signals: dict  # per signal: orientation, train / held-out AUROC, NaN count
    oriented_heldout: dict  # per signal: held-out values, higher = more likely right (NaN imputed)
    probe: object  # the fitted confidence.probe.ConfidenceProbe
    probe_config: object
    onnx_probe: object  # its ONNX export, loaded with confidence.probe_runtime.load_probe
    probe_scores: np.ndarray  # held-out P(right) from the ONNX export
    probe_logits: np.ndarray
    probe_file_bytes: int


def heldout_scores(
    answers: Answers, seed: int, holdout_fraction: float = HOLDOUT_FRACTION, probe_dir: str | None = None
) -> HeldoutScores:
    """Split, orient single signals on train, train + export the probe, score held-out."""
    from confidence.probe import ConfidenceProbe, ProbeConfig, load_probe, model_fingerprint_for_gguf
    from confidence.probe_training import stratified_split
    from sdk.engine_common.model_files import resolve_model_path

    labels, features = answers.labels, answers.features
    train, heldout = stratified_split(labels, holdout_fraction, seed)
    train_labels, heldout_labels = labels[train], labels[heldout]

    signals, oriented_heldout = {}, {}
    for column, name in enumerate(FEATURE_NAMES):
        values = features[:, column]
        train_values = values[train]
        present = train_values[~np.isnan(train_values)]
        fill = float(np.median(present)) if present.size else 0.0  # NaN only for empty answers
        train_auroc = auroc(_impute(train_values, fill), train_labels)
        sign = 1.0 if train_auroc >= 0.5 else -1.0
        oriented_heldout[name] = sign * _impute(values[heldout], fill)
        signals[name] = {
            "orientation": "higher" if sign > 0 else "lower",  # which values mean "more likely right"
            "train_auroc": sign * (train_auroc - 0.5) + 0.5,
            "heldout_auroc": auroc(oriented_heldout[name], heldout_labels),
            "num_nan": int(np.isnan(values).sum()),
        }

    fingerprint = model_fingerprint_for_gguf(resolve_model_path(None))
    config = ProbeConfig(kind="logistic", calibration="platt", seed=seed)
    probe = ConfidenceProbe(list(FEATURE_NAMES), fingerprint, config).fit(features[train], train_labels)
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(probe_dir or scratch, "arithmetic_probe.onnx")
        probe.save(path)
        onnx_probe = load_probe(path, fingerprint)
        probe_scores = np.asarray(onnx_probe.predict(features[heldout]), dtype=np.float64)
        probe_logits = np.asarray(onnx_probe.predict_logit(features[heldout]), dtype=np.float64)
        file_bytes = os.path.getsize(path)
    return HeldoutScores(
        train, heldout, signals, oriented_heldout, probe, config, onnx_probe, probe_scores, probe_logits, file_bytes
    )


def evaluate(
    answers: Answers, seed: int, holdout_fraction: float = HOLDOUT_FRACTION, probe_dir: str | None = None
) -> dict:
    """The held-out AUROCs of heldout_scores: each signal, the probe, the best signal."""
    scored = heldout_scores(answers, seed, holdout_fraction, probe_dir)
    labels = answers.labels
    train, heldout, signals, oriented_heldout = scored.train, scored.heldout, scored.signals, scored.oriented_heldout
    heldout_labels = labels[heldout]
    probe, config, onnx_probe = scored.probe, scored.probe_config, scored.onnx_probe
    probe_scores, probe_logits, file_bytes = scored.probe_scores, scored.probe_logits, scored.probe_file_bytes
    probe_auroc = auroc(probe_scores, heldout_labels)

    best_signal = max(FEATURE_NAMES, key=lambda name: signals[name]["heldout_auroc"])
    best_on_train = max(FEATURE_NAMES, key=lambda name: signals[name]["train_auroc"])
    by_level = []
    for level, spec in enumerate(LEVELS):
        rows = answers.levels == level
        by_level.append(
            {
                "level": level,
                "name": spec.name,
                "count": int(rows.sum()),
                "accuracy": float(labels[rows].mean()) if rows.any() else None,
            }
        )
    return {
        "counts": {
            "items": int(labels.size),
            "right": int(labels.sum()),
            "wrong": int((~labels).sum()),
            "train": int(train.size),
            "heldout": int(heldout.size),
            "heldout_right": int(heldout_labels.sum()),
            "heldout_wrong": int((~heldout_labels).sum()),
            "probe_fit_rows": probe.metrics["num_train"],
            "probe_calibration_rows": probe.metrics["num_heldout"],
        },
        "accuracy": float(labels.mean()),
        "accuracy_by_level": by_level,
        "signals": signals,
        "probe": {
            "kind": config.kind,
            "calibration": config.calibration,
            "runtime": "onnxruntime",
            "provider": onnx_probe.provider,
            "heldout_auroc": probe_auroc,
            "heldout_auroc_of_logit": auroc(probe_logits, heldout_labels),
            "onnx_file_bytes": file_bytes,
        },
        "best_signal": best_signal,
        "best_signal_heldout_auroc": signals[best_signal]["heldout_auroc"],
        "best_signal_on_train": best_on_train,
        "best_signal_on_train_heldout_auroc": signals[best_on_train]["heldout_auroc"],
        "probe_auroc_minus_best_signal": probe_auroc - signals[best_signal]["heldout_auroc"],
        "probe_auroc_minus_best_signal_se": paired_auroc_difference_se(
            probe_scores, oriented_heldout[best_signal], heldout_labels
        ),
    }


def format_table(result: dict) -> str:
    """The figures as plain text."""
    counts = result["counts"]
    lines = [
        f"{counts['items']} answers, {counts['right']} right ({result['accuracy']:.1%}); "
        f"held out {counts['heldout']} ({counts['heldout_right']} right, {counts['heldout_wrong']} wrong)",
        "",
        f"{'level':<32}{'n':>5}{'accuracy':>10}",
    ]
    for row in result["accuracy_by_level"]:
        accuracy = "-" if row["accuracy"] is None else f"{row['accuracy']:.1%}"
        lines.append(f"{row['level']}: {row['name']:<29}{row['count']:>5}{accuracy:>10}")
    lines += ["", f"{'signal':<24}{'right when':>11}{'train AUROC':>13}{'held-out AUROC':>16}"]
    for name, row in sorted(result["signals"].items(), key=lambda kv: -kv[1]["heldout_auroc"]):
        lines.append(f"{name:<24}{row['orientation']:>11}{row['train_auroc']:>13.3f}{row['heldout_auroc']:>16.3f}")
    lines.append(
        f"{'probe (ONNX, ' + result['probe']['kind'] + ')':<24}{'higher':>11}{'':>13}"
        f"{result['probe']['heldout_auroc']:>16.3f}"
    )
    lines += [
        "",
        f"probe - best signal ({result['best_signal']}): {result['probe_auroc_minus_best_signal']:+.3f} "
        f"(paired DeLong SE {result['probe_auroc_minus_best_signal_se']:.3f})",
    ]
    return "\n".join(lines)


def main() -> None:
    from bench.machine import report_header, write_report

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--n", type=int, default=None, help=f"questions (default {DEFAULT_N}; {SMOKE_N} with --smoke)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="question generator and split seed")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: all cores)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"only checks that the bench works ({SMOKE_N} questions): figures meaningless",
    )
    parser.add_argument(
        "--prefill-weights",
        default="auto",
        choices=("auto", "bf16", "f16", "off"),
        help="the local engine's prefill_weights (with --compare-prefill: the copy compared with off)",
    )
    parser.add_argument(
        "--compare-prefill", action="store_true", help="answer twice, on the own weights and through the copy"
    )
    args = parser.parse_args()
    n = args.n if args.n is not None else SMOKE_N if args.smoke else DEFAULT_N
    if args.compare_prefill:
        return main_compare_prefill(args, n)

    answers, prefill_kind = collect_answers_with(n, args.seed, args.threads, args.prefill_weights)
    result = evaluate(answers, args.seed)
    print(format_table(result), flush=True)
    wrong_examples = [
        {"question": item.question, "answer": item.answer, "reply": text}
        for item, text, right in zip(answers.items, answers.texts, answers.labels)
        if not right
    ]
    report = {
        **report_header("confidence_auroc", smoke=args.smoke),
        "model": "embedded SmolLM2-135M-Instruct (GGUF Q4_1), local_runtime.AsyncLocalEngine",
        "workload": f"{n} generated arithmetic questions (seed {args.seed}), {len(LEVELS)} difficulty levels in "
        f"equal shares; greedy, max_tokens {MAX_TOKENS}, {TOP_LOGPROBS} top logprobs; label = the reply's "
        f"answer (number after its first '=', else its first integer) equals the true one; stratified split "
        f"holding out {HOLDOUT_FRACTION:.0%}",
        "generation": {"seconds": answers.seconds, "output_tokens": answers.num_output_tokens},
        "prefill_weights": {"setting": args.prefill_weights, "in_effect": prefill_kind},
        **result,
        "baseline": "best single signal by held-out AUROC (orientation chosen on train)",
        "examples_wrong": wrong_examples[:: max(1, len(wrong_examples) // 12)][:12],
    }
    write_report(
        args.json,
        report,
        (
            "accuracy",
            "best_signal",
            "best_signal_heldout_auroc",
            "probe_auroc_minus_best_signal",
            "probe_auroc_minus_best_signal_se",
        ),
    )


def main_compare_prefill(args, n: int) -> None:
    from bench.machine import report_header, write_report

    copy_setting = "auto" if args.prefill_weights == "off" else args.prefill_weights
    off, _ = collect_answers_with(n, args.seed, args.threads, "off")
    copy, kind = collect_answers_with(n, args.seed, args.threads, copy_setting)
    if kind == "own":
        raise SystemExit(
            "bench.confidence_auroc --compare-prefill: no copy is in effect on this machine (auto chose the "
            "model's own weights); name one with --prefill-weights bf16 or f16"
        )
    result = compare_prefill(off, copy, args.seed)
    for name, side in result["sides"].items():
        print(name, {k: round(v, 4) for k, v in side.items()}, flush=True)
    report = {
        **report_header("confidence_auroc_prefill", smoke=args.smoke),
        "model": "embedded SmolLM2-135M-Instruct (GGUF Q4_1), local_runtime.AsyncLocalEngine",
        "workload": f"{n} generated arithmetic questions (seed {args.seed}), answered with prefill_weights "
        f"off and {kind}",
        "copy": kind,
        **result,
        "baseline": "the same probe and signal on the answers prefilled on the model's own weights",
    }
    headline = ["copy", "shipped_probe_auroc_copy_minus_off", "shipped_probe_auroc_copy_minus_off_se"]
    headline += ["best_signal_auroc_copy_minus_off", "best_signal_auroc_copy_minus_off_se"]
    write_report(args.json, report, tuple(headline))


if __name__ == "__main__":
    main()
