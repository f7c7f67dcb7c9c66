"""bench.router_learning's out-of-sample half: the recipe's nested estimate on the design
subjects, and the one scoring of each shipped recipe on the locked subjects
(router.prompt_router.locked_split): cold, with 10% of each locked subject labelled in a table
(`tandem router train --data`), and with labels arriving as traffic under the shipped judge and
under a best-case one.

Every figure on the locked subjects is pooled APGR (how outside evaluations score a router)
with its jackknife standard error over subjects, the paired difference to prompt length on
the same rows, and the per-subject spread (cross_validation.locked_figures).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from router.eval_tables import RoutingExample
from router.evaluation.metrics import Outcomes, evaluate_scores
from router.prompt_router.cold_recipe import DEFAULT, LENGTH, SELECTED, select_cold_recipe
from router.prompt_router.cross_validation import evaluate, group_of, locked_figures, mean_and_se, subject_folds
from bench.router_simulation import Traffic, cold_router, guarded_fit, position_at, revealed_labels
from router.prompt_router.training import LabelledRows, fit, heldout_gain, table_rows

LABELLED_SHARE = 0.10  # of each locked subject, labelled in the table or by the time the rest is scored


def within_subject_apgr(scores: np.ndarray, examples: Sequence[RoutingExample]) -> float:
    """Recovered gap inside each subject, summed over subjects and divided by their summed gap
    (rows weigh alike): how well a router ranks prompts of one topic, which pooled APGR mixes
    with ranking the topics themselves."""
    groups = np.array([group_of(e) for e in examples])
    recovered = gap = 0.0
    for subject in np.unique(groups):
        rows = np.flatnonzero(groups == subject)
        outcomes = Outcomes.of([examples[i] for i in rows])
        recovered += rows.size * (evaluate_scores(np.asarray(scores)[rows], outcomes).auc - outcomes.weak_acc)
        gap += rows.size * (outcomes.strong_acc - outcomes.weak_acc)
    return recovered / gap


def nested_estimate(design: list[RoutingExample], seeds: Sequence[int], folds: int = 4) -> dict:
    """The whole recipe procedure (select_cold_recipe on the training subjects only) scored on
    held-out design subjects, paired with prompt length: its honest estimate before the locked
    subjects are touched."""
    rows = table_rows(design)
    pooled, within, chosen = [], [], []
    for seed in seeds:
        for held in subject_folds(design, folds, seed):
            train = np.setdiff1d(np.arange(len(design)), held)
            train_examples, held_examples = [design[i] for i in train], [design[i] for i in held]
            recipe, _ = select_cold_recipe(train_examples, rows.shape[train], rows.labels[train])
            head, _ = fit(rows.take(train), None, recipe)
            scores, length = heldout_gain(head, None, rows.take(held)), rows.shape[held, 0]
            pooled.append([evaluate(scores, held_examples)["apgr"], evaluate(length, held_examples)["apgr"]])
            within.append([within_subject_apgr(scores, held_examples), within_subject_apgr(length, held_examples)])
            chosen.append("length" if recipe.is_length else "+".join(recipe.features) + f" alpha {recipe.alpha:g}")
    pooled, within = np.array(pooled), np.array(within)
    report = {"seeds": list(seeds), "folds": folds, "chosen_per_split": chosen}
    for name, values in (("pooled", pooled), ("within_subject", within)):
        report[f"{name}_apgr"], report[f"{name}_apgr_se"] = mean_and_se(values[:, 0])
        report[f"{name}_length_apgr"] = float(values[:, 1].mean())
        report[f"{name}_minus_length"], report[f"{name}_minus_length_se"] = mean_and_se(values[:, 0] - values[:, 1])
    return report


def locked_zero_shot(design: list[RoutingExample], locked: list[RoutingExample]) -> dict:
    """SELECTED and LENGTH trained on every design row, each scored once on the locked subjects,
    which of the two the default router is by the rule written in cold_recipe, and whether the
    code's DEFAULT is that one."""
    train, held = table_rows(design), table_rows(locked)
    length = held.shape[:, 0]
    figures = {}
    for name, recipe in (("selected_recipe", SELECTED), ("length", LENGTH)):
        head, _ = fit(train, None, recipe)
        figures[name] = locked_figures(heldout_gain(head, None, held), length, locked)
    figures["default_router"] = "selected_recipe" if figures["selected_recipe"]["beats_length"] else "length"
    figures["rule_agrees_with_code"] = (
        SELECTED if figures["default_router"] == "selected_recipe" else LENGTH
    ) == DEFAULT
    return figures


def _label_split(locked: list[RoutingExample], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(labelled rows, the rest): LABELLED_SHARE of each subject's rows, at random."""
    rng = np.random.default_rng(seed)
    groups = np.array([group_of(e) for e in locked])
    labelled = []
    for subject in np.unique(groups):
        rows = np.flatnonzero(groups == subject)
        labelled += list(rng.choice(rows, size=max(1, round(LABELLED_SHARE * rows.size)), replace=False))
    labelled = np.sort(np.array(labelled))
    return labelled, np.setdiff1d(np.arange(len(locked)), labelled)


def _summarize(per_seed: list[dict]) -> dict:
    """Mean over seeds of each locked figure (the SEs stay over subjects), and the seeds' own spread."""
    out = {
        key: float(np.mean([f[key] for f in per_seed]))
        for key in ("apgr", "apgr_se", "minus_length", "minus_length_se")
    }
    out["apgr_seed_sd"] = float(np.std([f["apgr"] for f in per_seed], ddof=1)) if len(per_seed) > 1 else float("nan")
    for key in ("apgr_mean", "apgr_se", "apgr_min", "apgr_max"):
        out[f"per_subject_{key}"] = float(np.mean([f["per_subject"][key] for f in per_seed]))
    out["num_seeds"] = len(per_seed)
    return out


def locked_with_labelled_tables(
    design: list[RoutingExample], locked: list[RoutingExample], embeddings: np.ndarray, seeds: Sequence[int]
) -> dict:
    """`tandem router train --data routellm --data labelled.csv`: the design tables plus
    LABELLED_SHARE of each locked subject as a labelled table (its rows in the head and, with
    their MiniLM embeddings, in the topic correction), scored on the rest of each subject."""
    tables, all_locked = table_rows(design), table_rows(locked)
    all_locked.embedding = embeddings
    per_seed = []
    for seed in seeds:
        labelled, rest = _label_split(locked, seed)
        own = all_locked.take(labelled)
        prior = LabelledRows(np.vstack([tables.shape, own.shape]), np.vstack([tables.labels, own.labels]))
        head, correction = fit(prior, None, topic_rows=own)
        held = all_locked.take(rest)
        per_seed.append(
            locked_figures(heldout_gain(head, correction, held), held.shape[:, 0], [locked[i] for i in rest])
        )
    return _summarize(per_seed)


def locked_via_traffic(
    design: list[RoutingExample],
    locked: list[RoutingExample],
    embeddings: np.ndarray,
    seeds: Sequence[int],
    traffic: Traffic,
) -> dict:
    """The locked subjects arrive as traffic (shuffled) to the cold router trained on the design
    tables; labels come as bench.router_simulation.revealed_labels gives them under `traffic`;
    when they number LABELLED_SHARE of the stream, the learner scores the part of the stream not
    yet seen: `tandem router train --from-traffic` (`fit(tables, seen)`, "unguarded") and the
    background retrain (guarded_fit, the headline)."""
    tables = table_rows(design)
    cold, cut = cold_router(tables, traffic.cloud_share)
    rows = table_rows(locked)
    rows.embedding = embeddings
    per_seed, unguarded, swapped = [], [], []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(locked))
        stream = rows.take(order)
        labels = revealed_labels(stream, cold, cut, traffic, rng)
        position = position_at(labels, round(LABELLED_SHARE * len(stream)))
        seen = LabelledRows(
            stream.shape[:position], labels[:position], stream.embedding[:position], stream.groups[:position]
        )
        rest = stream.take(np.arange(position, len(stream)))
        rest_examples = [locked[i] for i in order[position:]]
        unguarded.append(locked_figures(heldout_gain(*fit(tables, seen), rest), rest.shape[:, 0], rest_examples))
        guarded = guarded_fit(tables, cold, seen)
        swapped.append(guarded[0] is not cold)
        per_seed.append(locked_figures(heldout_gain(*guarded, rest), rest.shape[:, 0], rest_examples))
    # how many seeds the guard swapped the learner in (the rest keep the cold router: length's figure exactly)
    return _summarize(per_seed) | {"unguarded": _summarize(unguarded), "num_swapped": int(sum(swapped))}
