"""Training a router: the linear head on prompt shapes from routing tables and labelled
traffic, plus, when traffic brings embeddings, the topic correction (topic_correction).

    report = train_router(load_routellm(), "router.onnx", traffic=rows)  # rows: the traffic record's, as LabelledRows

A router without traffic is the prompt-shape head alone (the shipped default is one); with
traffic it carries the MiniLM export and the correction, so the file stays the whole scorer.
Every file carries its score scale (score_scale): trained on tables, the gains it predicts for
their prompts; from traffic alone, its base router's scale.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from router.eval_tables import RoutingExample
from router.prompt_router.cold_recipe import DEFAULT, ColdRecipe
from router.prompt_router.cross_validation import evaluate, group_of, locked_figures, subject_split, tier_labels
from router.prompt_router.embedder_export import DEFAULT_PRECISION, check_precision, ensure_embedder, model_fingerprint
from router.prompt_router.linear_head import HeadStatistics, LinearHead
from router.prompt_router.locked_split import is_locked
from router.prompt_router.prompt_shape import SHAPE_VERSION, shape_features
from router.prompt_router.score_scale import ScoreScale
from router.prompt_router.topic_correction import DEFAULT_ALPHA as TOPIC_ALPHA
from router.prompt_router.topic_correction import DEFAULT_DIMS, TopicCorrection, fit_topic_correction


@dataclass
class LabelledRows:
    """Rows a router learns from: prompt shapes, what each tier scored (NaN: unknown; traffic
    rows without any label still give the topic directions), and MiniLM embeddings (traffic
    rows; None for public tables)."""

    shape: np.ndarray  # [n, k] float32
    labels: np.ndarray  # [n, 2] weak, strong in [0, 1]; NaN where unknown
    embedding: np.ndarray | None = None  # [n, 384]
    groups: list[str] = field(default_factory=list)  # subject or source per row, for splits

    def __post_init__(self):
        if len(self.shape) != len(self.labels) or (
            self.embedding is not None and len(self.embedding) != len(self.labels)
        ):
            raise ValueError("shape, labels and embedding rows must match")
        if not self.groups:
            self.groups = ["traffic"] * len(self.labels)

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, rows) -> LabelledRows:
        rows = np.asarray(rows, dtype=np.int64)
        embedding = None if self.embedding is None else self.embedding[rows]
        return LabelledRows(self.shape[rows], self.labels[rows], embedding, [self.groups[i] for i in rows])


def table_rows(examples: Sequence[RoutingExample]) -> LabelledRows:
    """A routing table's rows (both tiers' labels known, no embeddings)."""
    return LabelledRows(
        shape_features([e.prompt for e in examples]), tier_labels(examples), None, [group_of(e) for e in examples]
    )


DEFAULT_TRAFFIC_WEIGHT = 3.0  # an app's own judged row counts as three public-table rows (bench.router_learning tuning)


def prior_statistics(prior: LabelledRows | HeadStatistics | None) -> HeadStatistics | None:
    """The head statistics of public tables (their rows, or statistics a router file carries)."""
    if prior is None or isinstance(prior, HeadStatistics):
        return prior
    return HeadStatistics.of(prior.shape, prior.labels) if len(prior) else None


def fit(
    prior: LabelledRows | HeadStatistics | None,
    traffic: LabelledRows | None,
    recipe: ColdRecipe = DEFAULT,
    traffic_weight: float = DEFAULT_TRAFFIC_WEIGHT,
    dims: int = DEFAULT_DIMS,
    topic_alpha: float = TOPIC_ALPHA,
    topic_rows: LabelledRows | None = None,
) -> tuple[LinearHead, TopicCorrection | None]:
    """The head (`recipe`: its features and ridge penalty) on the public tables (`prior`: their
    rows or statistics) plus the traffic rows where both tiers were judged (weighted
    `traffic_weight`), then the topic correction of its residuals on every labelled traffic row
    and every `topic_rows` row (an app's labelled tables, already in the head through `prior`);
    None without embedded rows.

    Rows labelled for one tier only (feedback on the answer given) do not refit the head: which
    tier answered was the head's own choice, so those rows are selected by its score and would
    pull it toward its own decisions (bench.router_learning: feedback-only labels made a refit
    head worse than the cold one); the topic correction, which compares prompts of one topic,
    takes them."""
    statistics = prior_statistics(prior)
    if traffic is not None and len(traffic):
        judged = ~np.isnan(traffic.labels).any(1)
        if judged.any():
            rows = traffic.take(np.flatnonzero(judged))
            extra = HeadStatistics.of(rows.shape, rows.labels, np.full(len(rows), traffic_weight))
            statistics = extra if statistics is None else statistics + extra
    if statistics is None:
        raise ValueError("nothing to train the head on: no table rows and no traffic judged for both tiers")
    head = recipe.solve(statistics)
    embedded = [
        rows.take(np.flatnonzero(np.isfinite(rows.embedding).all(1)))  # rows without a vector: head only
        for rows in (traffic, topic_rows)
        if rows is not None and rows.embedding is not None and len(rows)
    ]
    if not embedded:
        return head, None
    together = LabelledRows(
        np.vstack([r.shape for r in embedded]),
        np.vstack([r.labels for r in embedded]),
        np.vstack([r.embedding for r in embedded]),
        sum((r.groups for r in embedded), []),
    )
    labelled = np.flatnonzero(~np.isnan(together.labels).all(1))
    correction = fit_topic_correction(
        together.embedding,
        labelled,
        together.labels[labelled],
        head.predict(together.shape[labelled]),
        dims,
        topic_alpha,
    )
    return head, correction


def heldout_gain(head: LinearHead, correction: TopicCorrection | None, rows: LabelledRows) -> np.ndarray:
    """What the router file computes (numpy reference): predicted p_strong - p_weak."""
    tiers = head.predict(rows.shape)
    if correction is not None and rows.embedding is not None:
        tiers = tiers + correction.corrections(rows.embedding)
    return tiers[:, 1] - tiers[:, 0]


def trained_at() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def shipped_scale() -> ScoreScale:
    """The shipped default router's score scale (the design tables' prompts): a router written
    without a reference of its own scores on it."""
    import json

    import onnx

    from router.prompt_router.scorer import DEFAULT_ROUTER, METADATA_KEY

    props = {p.key: p.value for p in onnx.load(str(DEFAULT_ROUTER), load_external_data=False).metadata_props}
    return ScoreScale.from_json(json.loads(props[METADATA_KEY])["score_scale"])


def table_scale(head: LinearHead, examples: Sequence[RoutingExample], reference: str) -> ScoreScale:
    """The scale of a router trained on tables: the head's gains on their prompts (table rows carry
    no MiniLM vectors, so a topic correction does not enter; its gains are placed on the head's)."""
    return ScoreScale.of(heldout_gain(head, None, table_rows(examples)), reference)


def router_metadata(
    correction: TopicCorrection | None,
    metrics: dict,
    precision: str | None,
    prior: HeadStatistics | None = None,
    recipe: ColdRecipe = DEFAULT,
    scale: ScoreScale | None = None,
) -> dict:
    """The router file's JSON document; `scale` None: the shipped router's (shipped_scale)."""
    from router.prompt_router.scorer import FORMAT_VERSION, KIND, MAX_TOKENS

    scale = scale if scale is not None else shipped_scale()

    return {
        "format_version": FORMAT_VERSION,
        "kind": KIND,
        "shape_version": SHAPE_VERSION,
        "model_fingerprint": model_fingerprint() if correction is not None else None,
        "embedder_precision": precision if correction is not None else None,
        "max_tokens": MAX_TOKENS,
        "trained_at": trained_at(),
        "metrics": metrics,
        "topic_correction": None if correction is None else correction.describe(),
        "prior_statistics": None
        if prior is None
        else prior.as_json(),  # the public tables' share of the head: retrains add traffic to it
        "head_recipe": recipe.as_json(),  # retrains solve the same features at the same penalty
        "score_scale": scale.as_json(),  # what the score means: the share of these reference prompts ranked lower
    }


def write_router(
    head: LinearHead,
    correction: TopicCorrection | None,
    out,
    metrics: dict,
    precision: str = DEFAULT_PRECISION,
    prior: HeadStatistics | None = None,
    recipe: ColdRecipe = DEFAULT,
    scale: ScoreScale | None = None,
) -> str:
    """The router file at `out`, written to a temporary name and renamed (a reader never sees
    half a file); `scale` None: the shipped router's."""
    import onnx

    from router.prompt_router.router_graph import build_router_graph, merge_embedder

    check_precision(precision)
    metadata = router_metadata(correction, metrics, precision, prior, recipe, scale)
    model = build_router_graph(head, correction, ScoreScale.from_json(metadata["score_scale"]), metadata)
    if correction is not None:
        model = merge_embedder(onnx.load(str(ensure_embedder(precision=precision))), model, metadata)
    out = os.fspath(out)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    partial = f"{out}.{os.getpid()}.partial"
    try:
        onnx.save(model, partial)
        os.replace(partial, out)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return out


def split_report(
    examples: Sequence[RoutingExample], rows: LabelledRows, holdout_fraction: float, seed: int, recipe: ColdRecipe
) -> dict:
    """The head trained on the training subjects, scored on the held-out ones (all, and MMLU only)."""
    train_rows, held_rows, held = subject_split(examples, holdout_fraction, seed)
    head, _ = fit(rows.take(train_rows), None, recipe)
    scores = heldout_gain(head, None, rows.take(held_rows))
    held_examples = [examples[i] for i in held_rows]
    report = {"heldout_groups": held, "num_train": int(train_rows.size), "heldout": evaluate(scores, held_examples)}
    mmlu = [i for i, e in enumerate(held_examples) if e.source.startswith("mmlu_")]
    if mmlu:
        report["heldout_mmlu"] = evaluate(scores[mmlu], [held_examples[i] for i in mmlu])
    return report


def locked_test(
    head: LinearHead,
    correction: TopicCorrection | None,
    trained_on: Sequence[RoutingExample],
    locked: Sequence[RoutingExample] | None,
) -> dict:
    """The router's own figures on the locked subjects beside prompt length's, or why there are none."""
    if not locked:
        return {"not_measured": "no locked subjects given (RouteLLM's data directory was not found)"}
    if any(is_locked(group_of(e)) for e in trained_on):
        return {"not_measured": "the training tables hold rows of locked subjects: a figure on them would be in sample"}
    if correction is not None:
        return {
            "not_measured": "the router carries a topic correction, which needs MiniLM on every locked prompt: "
            "bench.router_learning measures it"
        }
    rows = table_rows(locked)
    return locked_figures(heldout_gain(head, None, rows), rows.shape[:, 0], locked)


def train_router(
    examples: Sequence[RoutingExample],
    out,
    traffic: LabelledRows | None = None,
    holdout_fraction: float = 0.25,
    seed: int = 0,
    precision: str = DEFAULT_PRECISION,
    recipe: ColdRecipe = DEFAULT,
    traffic_weight: float = DEFAULT_TRAFFIC_WEIGHT,
    base: HeadStatistics | None = None,
    topic_rows: LabelledRows | None = None,
    locked: Sequence[RoutingExample] | None = None,
    base_scale: ScoreScale | None = None,
) -> dict:
    """Report the head's APGR on held-out subjects of the tables, then fit on the tables (plus
    `base`, the statistics of another router's tables), the traffic and `topic_rows` (labelled
    tables with MiniLM embeddings, whose rows are among `examples`: they teach the topic
    correction), write `out`, and score it on the `locked` subjects when it can. Returns the
    report (also stored in the file). The file's score scale: the head's gains on the tables'
    prompts; without tables, `base_scale` (the base router's), else the traffic prompts'."""
    tables = table_rows(examples) if examples else None
    report: dict = {}
    if tables is not None and holdout_fraction > 0:
        report = split_report(examples, tables, holdout_fraction, seed, recipe)
    prior = prior_statistics(tables)
    if base is not None:
        prior = base if prior is None else prior + base
    head, correction = fit(prior, traffic, recipe, traffic_weight, topic_rows=topic_rows)
    num_judged = 0 if traffic is None else int((~np.isnan(traffic.labels).any(1)).sum())
    trained_on: dict[str, int] = {}
    for example in examples:
        trained_on[group_of(example)] = trained_on.get(group_of(example), 0) + 1
    report.update(
        num_table_rows=len(examples),
        num_base_rows=0 if base is None else int(base.num_rows),
        num_traffic_rows=0 if traffic is None else len(traffic),
        num_traffic_judged=num_judged,
        num_topic_rows=0 if topic_rows is None else len(topic_rows),
        trained_on=trained_on,
        holdout_fraction=holdout_fraction,
        seed=seed,
        recipe={
            "features": f"prompt shape v{SHAPE_VERSION}",
            "head": "ridge per tier",
            **recipe.as_json(),
            "traffic_weight": traffic_weight,
            "topic_correction": None if correction is None else correction.describe(),
        },
        locked_test=locked_test(head, correction, examples, locked),
    )
    if examples:
        scale = table_scale(head, examples, f"the {len(examples)} prompts of the tables it was trained on")
    elif base_scale is not None:
        scale = base_scale
    else:
        reference = f"the {len(traffic)} traffic prompts it was trained on"
        scale = ScoreScale.of(heldout_gain(head, correction, traffic), reference)
    report["score_scale"] = {"reference": scale.reference, "num_reference": scale.num_reference}
    write_router(head, correction, out, report, precision, prior, recipe, scale)
    return report


def shape_heldout_scorer(examples: Sequence[RoutingExample], recipe: ColdRecipe = DEFAULT):
    """The shipped cold-start recipe as cross_validation.grouped_cv's score_heldout: the head
    trained on the train rows scores the held ones (predicted gain)."""
    rows = table_rows(examples)

    def score_heldout(train_rows, held_rows):
        head, _ = fit(rows.take(train_rows), None, recipe)
        return heldout_gain(head, None, rows.take(held_rows))

    return score_heldout


@dataclass(frozen=True)
class RouterParameters:
    """A router file's numbers, read back for numpy evaluation (a retrain compares the serving
    router with a candidate on fresh labels without running MiniLM again)."""

    head_weight: np.ndarray  # [k, 2] on raw shape features
    head_bias: np.ndarray  # [2]
    topic_weight: np.ndarray | None  # [384, 2]
    topic_bias: np.ndarray | None  # [2]

    def tiers(self, shape: np.ndarray, embedding: np.ndarray | None) -> np.ndarray:
        """[n, 2] predicted chance each tier answers right; rows with no embedding get the head alone."""
        tiers = np.asarray(shape, np.float64) @ self.head_weight + self.head_bias
        if self.topic_weight is not None and embedding is not None:
            embedding = np.asarray(embedding, np.float64)
            known = np.isfinite(embedding).all(1)
            tiers[known] += embedding[known] @ self.topic_weight + self.topic_bias
        return tiers

    def as_stored(self) -> RouterParameters:
        """The same parameters rounded to float32, as a router file holds them."""

        def f32(array):
            return None if array is None else np.asarray(array, np.float32).astype(np.float64)

        return RouterParameters(
            f32(self.head_weight), f32(self.head_bias), f32(self.topic_weight), f32(self.topic_bias)
        )

    @classmethod
    def of(cls, head: LinearHead, correction: TopicCorrection | None) -> RouterParameters:
        weight, bias = head.folded()
        return cls(
            weight,
            bias,
            None if correction is None else correction.weight,
            None if correction is None else correction.bias,
        )

    @classmethod
    def read(cls, path) -> RouterParameters:
        import onnx
        from onnx import numpy_helper

        found = {
            t.name: numpy_helper.to_array(t).astype(np.float64)
            for t in onnx.load(os.fspath(path)).graph.initializer
            if t.name in ("head_weight", "head_bias", "topic_weight", "topic_bias")
        }
        if "head_weight" not in found:
            raise ValueError(f"{path} has no router head")
        return cls(found["head_weight"], found["head_bias"], found.get("topic_weight"), found.get("topic_bias"))
