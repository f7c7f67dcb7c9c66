"""bench.router_learning's traffic simulation: labels arrive as the product would get them
(feedback on the tier that answered, shadow samples under a judge), and learners retrained at
checkpoints score the part of the stream not yet seen (the module docstring of
bench.router_learning says what each method is)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from router.eval_tables import RoutingExample
from router.prompt_router.cold_recipe import DEFAULT
from router.prompt_router.cross_validation import evaluate, mean_and_se, subject_split
from router.prompt_router.topic_correction import fit_topic_correction
from router.prompt_router.training import LabelledRows, RouterParameters, fit, heldout_gain, table_rows
from sdk.traffic.retrain import MIN_TRAINING_LABELS, SWAP_MARGIN_SE, refit_against_serving

CHECKPOINTS = (0.0, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2)  # labels as a share of the stream's length
MIN_REST = 200  # a checkpoint needs this many prompts still to come
HOLDOUT_LABELS = 100  # the background retrain's default (sdk.traffic.config: retrain_holdout_labels)


@dataclass(frozen=True)
class Traffic:
    """How labels arrive."""

    feedback: float = 0.2  # share of requests whose served answer gets feedback
    shadow: float = 0.1  # share of locally answered requests also sent to the cloud and judged
    cloud_share: float = 0.3  # the cold router's operating point: which requests the cloud answers
    blocked: bool = False  # subjects arrive one after another instead of shuffled
    judge: str = "exact_match"  # the shipped default judge of shadow samples; "best_case": both tiers' true labels


def cold_router(tables: LabelledRows, cloud_share: float):
    """(the cold router trained on the tables, the score above which it sends a request to the
    cloud: its top `cloud_share` on the tables)."""
    cold, _ = fit(tables, None)
    return cold, float(np.quantile(heldout_gain(cold, None, tables), 1 - cloud_share))


def position_at(labels: np.ndarray, need: int) -> int:
    """How many prompts of the stream have arrived once `need` of them carry a label (0 for none)."""
    return 0 if need == 0 else int(np.searchsorted(np.cumsum(~np.isnan(labels).all(1)), need)) + 1


def guarded_fit(
    tables: LabelledRows,
    cold,
    seen: LabelledRows,
    holdout_labels: int = HOLDOUT_LABELS,
    margin_se: float = SWAP_MARGIN_SE,
):
    """What the background retrain (sdk.traffic.retrain) swaps in, as (head, correction): the
    learner trained without the newest `holdout_labels` labels when it ranks them better than the
    serving (cold) router (AUROC for a wrong local answer, by more than `margin_se` paired SEs: the
    product's retrain.SWAP_MARGIN_SE unless asked), else the cold router."""
    labelled = np.flatnonzero(~np.isnan(seen.labels).all(1))  # in arrival order
    if labelled.size < holdout_labels + MIN_TRAINING_LABELS:
        return cold, None
    serving = RouterParameters.of(cold, None).as_stored()  # as the serving router's file holds it
    candidate = refit_against_serving(
        tables, seen, labelled[-holdout_labels:], serving, DEFAULT
    )  # the recipe cold was fitted with
    return (candidate.head, candidate.correction) if candidate.ranking.a_beats_b(margin_se) else (cold, None)


def _kmeans(points: np.ndarray, k: int, seed: int, iterations: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """(centres, assignment) by Lloyd's algorithm on unit vectors (cosine)."""
    rng = np.random.default_rng(seed)
    centres = points[rng.choice(len(points), size=min(k, len(points)), replace=False)]
    for _ in range(iterations):
        assignment = np.argmax(points @ centres.T, axis=1)
        for c in range(len(centres)):
            members = points[assignment == c]
            if len(members):
                mean = members.mean(0)
                centres[c] = mean / max(np.linalg.norm(mean), 1e-12)
    return centres, np.argmax(points @ centres.T, axis=1)


def _group_means(
    groups_known: np.ndarray, residuals: np.ndarray, groups_rest: np.ndarray, shrink: float = 5.0
) -> np.ndarray:
    out = np.zeros(len(groups_rest))
    for group in np.unique(groups_rest):
        mine = groups_known == group
        out[groups_rest == group] = residuals[mine].sum() / (mine.sum() + shrink)
    return out


def _residual_means(
    labels: np.ndarray, predicted: np.ndarray, groups_known: np.ndarray, groups_rest: np.ndarray
) -> np.ndarray:
    """Per group and tier, the mean residual of the known labels, shrunk: [rest, 2]."""
    out = np.zeros((len(groups_rest), 2))
    for column in range(2):
        known = ~np.isnan(labels[:, column])
        out[:, column] = _group_means(
            groups_known[known], (labels[:, column] - predicted[:, column])[known], groups_rest
        )
    return out


def _knn_corrections(
    traffic: LabelledRows, predicted: np.ndarray, rest: LabelledRows, k: int = 50, shrink: float = 1.0
) -> np.ndarray:
    """Per tier, the cosine-weighted mean residual of the k most similar labelled prompts, shrunk."""
    out = np.zeros((len(rest), 2))
    for column in range(2):
        known = np.flatnonzero(~np.isnan(traffic.labels[:, column]))
        if not known.size:
            continue
        similarity = rest.embedding @ traffic.embedding[known].T
        nearest = np.argpartition(-similarity, min(k, known.size) - 1, axis=1)[:, :k]
        weight = np.maximum(np.take_along_axis(similarity, nearest, 1), 0.0)
        residual = traffic.labels[known, column] - predicted[known, column]
        out[:, column] = (weight * residual[nearest]).sum(1) / (weight.sum(1) + shrink)
    return out


def method_scores(
    name: str,
    tables: LabelledRows,
    cold,
    seen: LabelledRows,
    labelled: np.ndarray,
    rest: LabelledRows,
    subjects_seen,
    subjects_rest,
    seed: int,
) -> np.ndarray:
    """Strong-need scores of the `rest` rows from method `name`, given the stream so far (`seen`:
    every prompt's shape and embedding, labels NaN where none came; `labelled` has some)."""
    if name == "cold" or not labelled.size:
        return heldout_gain(cold, None, rest)
    if name == "shipped":
        return heldout_gain(*fit(tables, seen), rest)
    if name == "shipped_guarded":
        return heldout_gain(*guarded_fit(tables, cold, seen), rest)
    if name == "shipped_guarded_1se":  # the margin the guard had first (issue 52): one SE
        return heldout_gain(*guarded_fit(tables, cold, seen, margin_se=1.0), rest)
    if name == "head_refit_only":
        head, _ = fit(tables, LabelledRows(seen.shape, seen.labels))
        return heldout_gain(head, None, rest)
    traffic = seen.take(labelled)
    predicted = cold.predict(traffic.shape)
    if name == "topic_correction_only":
        return heldout_gain(cold, fit_topic_correction(seen.embedding, labelled, traffic.labels, predicted), rest)
    if name == "knn_memory":
        correction = _knn_corrections(traffic, predicted, rest)
    elif name == "cluster_means":
        centres, assignment = _kmeans(seen.embedding, 15, seed)
        groups_rest = np.argmax(rest.embedding @ centres.T, axis=1)
        correction = _residual_means(traffic.labels, predicted, assignment[labelled], groups_rest)
    elif name == "subject_means_oracle":
        correction = _residual_means(
            traffic.labels, predicted, np.asarray(subjects_seen)[labelled], np.asarray(subjects_rest)
        )
    else:
        raise ValueError(f"unknown method {name!r}")
    tiers = cold.predict(rest.shape) + correction
    return tiers[:, 1] - tiers[:, 0]


METHODS = (
    "cold",
    "shipped",
    "shipped_guarded",
    "shipped_guarded_1se",
    "topic_correction_only",
    "head_refit_only",
    "knn_memory",
    "cluster_means",
    "subject_means_oracle",
)


def revealed_labels(stream: LabelledRows, cold, cut: float, traffic: Traffic, rng) -> np.ndarray:
    """[n, 2] labels as the product would learn them (NaN where nothing was said). Feedback says
    how the tier that answered did. A shadow sample under the shipped judge (`exact_match`,
    sdk.traffic.judges) labels only the local answer, by agreement of its final answer with the
    cloud's: right when both tiers are right, wrong when one is, and when both are wrong, right
    (they agree) one time in three (three wrong choices of four, picked alike). Under
    `best_case` it reveals both tiers' true labels."""
    served_cloud = heldout_gain(cold, None, stream) >= cut
    draw = rng.random(len(stream))
    feedback = draw < traffic.feedback
    shadow = (rng.random(len(stream)) < traffic.shadow) & ~served_cloud  # only local answers are shadowed
    labels = np.full((len(stream), 2), np.nan)
    by_feedback_weak, by_feedback_strong = feedback & ~served_cloud, feedback & served_cloud
    labels[by_feedback_weak, 0] = stream.labels[by_feedback_weak, 0]
    labels[by_feedback_strong, 1] = stream.labels[by_feedback_strong, 1]
    if traffic.judge == "best_case":
        labels[shadow] = stream.labels[shadow]
    elif traffic.judge == "exact_match":
        weak, strong = stream.labels[:, 0] > 0.5, stream.labels[:, 1] > 0.5
        agree = (weak & strong) | (~weak & ~strong & (rng.random(len(stream)) < 1 / 3))
        shadowed_only = shadow & ~by_feedback_weak  # a served local answer's feedback is the truer label
        labels[shadowed_only, 0] = agree[shadowed_only]
    else:
        raise ValueError(f"unknown judge {traffic.judge!r}")
    return labels


def simulate(
    examples: list[RoutingExample],
    embeddings: np.ndarray,
    seed: int,
    traffic: Traffic,
    methods=METHODS,
    checkpoints=CHECKPOINTS,
    min_rest: int = MIN_REST,
) -> dict:
    """One seed: {checkpoint: {method: APGR on the rest, "num_labels", "position"}}."""
    rng = np.random.default_rng(seed)
    rows = table_rows(examples)
    rows.embedding = embeddings
    train, held, _ = subject_split(examples, 0.25, seed)
    if traffic.blocked:
        subjects = sorted({rows.groups[i] for i in held})
        rng.shuffle(subjects)
        order = np.concatenate([rng.permutation([i for i in held if rows.groups[i] == s]) for s in subjects])
    else:
        order = rng.permutation(held)
    tables = rows.take(train)
    tables.embedding = None
    cold, cut = cold_router(tables, traffic.cloud_share)
    stream = rows.take(order)
    labels = revealed_labels(stream, cold, cut, traffic, rng)
    stream_examples = [examples[i] for i in order]
    out = {}
    for share in checkpoints:
        position = position_at(labels, int(round(share * len(stream))))
        if len(stream) - position < min_rest:
            out[share] = None
            continue
        seen = LabelledRows(
            stream.shape[:position], labels[:position], stream.embedding[:position], stream.groups[:position]
        )
        labelled = np.flatnonzero(~np.isnan(seen.labels).all(1))
        rest = stream.take(np.arange(position, len(stream)))
        out[share] = {"num_labels": int(labelled.size), "position": position}
        for name in methods:
            scores = method_scores(
                name, tables, cold, seen, labelled, rest, stream.groups[:position], rest.groups, seed
            )
            out[share][name] = evaluate(scores, stream_examples[position:])["apgr"]
    return out


def summarize_runs(runs: list[dict], methods=METHODS) -> dict:
    """Per checkpoint and method: mean APGR, SE, and the paired difference to cold."""
    table = {}
    for share in runs[0]:
        done = [run[share] for run in runs if run[share] is not None]
        if not done:
            continue
        entry = {"num_seeds": len(done), "num_labels_mean": float(np.mean([d["num_labels"] for d in done]))}
        for name in methods:
            mean, se = mean_and_se([d[name] for d in done])
            entry[name] = {"apgr": mean, "apgr_se": se}
            if name != "cold":
                diff, diff_se = mean_and_se([d[name] - d["cold"] for d in done])
                entry[name] |= {"minus_cold": diff, "minus_cold_se": diff_se}
        table[f"{share:g}"] = entry
    return table


def labels_to_reach(curve: dict, method: str, level: float = 0.60) -> float | None:
    """Mean labels at the first checkpoint whose mean APGR reaches `level`; None if none does."""
    for entry in curve.values():
        if entry[method]["apgr"] >= level:
            return entry["num_labels_mean"]
    return None
