"""Retraining the prompt router from the traffic record, and swapping it in only when it does
better on labels it never saw.

`retrain_once` (a thread: numpy and file I/O) holds the newest `holdout_labels` labelled rows
out, fits a candidate on the rest (the serving router's public-table statistics + the
traffic: training.fit), and compares the two on the held-out rows by the Brier score of their
per-tier predictions against the labels there (every label counts, one tier's or both).
The held-out rows are the newest because the serving router may have been trained on older
ones. A candidate that scores lower is written under a new name and copied to latest.onnx
(written aside, then renamed); the caller loads it whole and then replaces
`runner.prompt_scorer` in one assignment, so a request sees the old router or the new one,
never a mixture. Each request reads the scorer once.

`BackgroundRetrainer` runs that every CHECK_EVERY_S when `retrain_every_labels` new labels
have come in; outcomes are logged and counted (/metrics: tandem:router_retrains_total).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from router.prompt_router.cold_recipe import ColdRecipe
from router.prompt_router.embedder_export import DEFAULT_PRECISION, model_fingerprint
from router.prompt_router.linear_head import HeadStatistics, LinearHead
from router.prompt_router.score_scale import ScoreScale
from router.prompt_router.topic_correction import TopicCorrection
from router.prompt_router.training import LabelledRows, RouterParameters, fit, write_router
from sdk.traffic.rows import load_traffic_rows

logger = logging.getLogger("tandem.traffic")

CHECK_EVERY_S = 60.0
MIN_TRAINING_LABELS = 20  # besides the held-out ones
MIN_IMPROVEMENT = 1e-6  # Brier: a candidate no better than rounding is the same router


@dataclass(frozen=True)
class RetrainResult:
    outcome: str  # "swapped", "kept" (the serving router did as well or better), "skipped" (not enough to go on)
    detail: str
    path: str | None = None  # the new router, when swapped
    serving_brier: float | None = None
    candidate_brier: float | None = None
    num_labels: int = 0


def brier(tiers: np.ndarray, labels: np.ndarray) -> float:
    """Mean squared error of predicted per-tier correctness over the labels known."""
    known = ~np.isnan(labels)
    return float(np.mean((np.clip(tiers, 0.0, 1.0)[known] - labels[known]) ** 2))


@dataclass(frozen=True)
class Candidate:
    """A retrained router beside the serving one, both scored on the labels it was not trained on."""

    head: LinearHead
    correction: TopicCorrection | None
    serving_brier: float
    candidate_brier: float

    @property
    def wins(self) -> bool:
        return self.candidate_brier < self.serving_brier - MIN_IMPROVEMENT


def refit_against_serving(prior: HeadStatistics | LabelledRows, rows: LabelledRows, newest: np.ndarray, serving: RouterParameters,
                          recipe: ColdRecipe) -> Candidate:  # fmt: skip
    """The router refitted on the tables (`prior`) and every row but `newest` (the newest labelled
    ones), and the Brier score of it and of `serving` on those: the swap rule of the background
    retrain (bench.router_simulation.guarded_fit replays it on simulated traffic)."""
    held = rows.take(newest)
    head, correction = fit(prior, rows.take(np.setdiff1d(np.arange(len(rows)), newest)), recipe)
    candidate = RouterParameters.of(head, correction).as_stored()  # the numbers the file will hold
    return Candidate(head, correction, brier(serving.tiers(held.shape, held.embedding), held.labels),
                     brier(candidate.tiers(held.shape, held.embedding), held.labels))  # fmt: skip


def retrain_once(db_path: str, serving, router_dir: str, holdout_labels: int) -> RetrainResult:
    """One attempt (see the module docstring); `serving` is the PromptScorer in use."""
    document = serving.metadata.get("prior_statistics")
    if document is None:
        return RetrainResult("skipped", f"the serving router {serving.path} carries no table statistics to refit from")
    prior = HeadStatistics.from_json(document)
    precision = serving.metadata["embedder_precision"] or DEFAULT_PRECISION
    traffic = load_traffic_rows(db_path, embedder=f"{model_fingerprint()}|{precision}")
    labelled = np.flatnonzero(~np.isnan(traffic.rows.labels).all(1))
    if labelled.size < holdout_labels + MIN_TRAINING_LABELS:
        return RetrainResult("skipped", f"{labelled.size} labelled rows; a retrain needs {holdout_labels + MIN_TRAINING_LABELS}",
                             num_labels=int(labelled.size))  # fmt: skip
    newest = labelled[np.argsort(traffic.labelled_at[labelled], kind="stable")][-holdout_labels:]
    recipe = ColdRecipe.from_json(serving.metadata.get("head_recipe"))  # the serving router's features and penalty
    candidate = refit_against_serving(prior, traffic.rows, newest, RouterParameters.read(serving.path), recipe)
    head, correction = candidate.head, candidate.correction
    serving_score, candidate_score = candidate.serving_brier, candidate.candidate_brier
    figures = {"serving_brier": serving_score, "candidate_brier": candidate_score, "num_labels": int(labelled.size)}
    if not candidate.wins:
        return RetrainResult("kept", f"Brier {candidate_score:.4f} (candidate) vs {serving_score:.4f} (serving) on the newest "
                             f"{holdout_labels} labels", **figures)  # fmt: skip
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    os.makedirs(router_dir, mode=0o700, exist_ok=True)
    path = str(Path(router_dir) / f"router-{stamp}.onnx")
    metrics = {"retrained_from": db_path, "holdout_labels": holdout_labels, "replaced": serving.path, **figures,
               "num_traffic_rows": len(traffic.rows) - len(newest), "topic_correction": None if correction is None else correction.describe()}  # fmt: skip
    scale = ScoreScale.from_json(serving.metadata["score_scale"])  # a swap moves scores only as far as the gains move
    write_router(head, correction, path, metrics, precision, prior, recipe, scale)
    latest = Path(router_dir) / "latest.onnx"
    partial = latest.with_name(f"latest.onnx.{os.getpid()}.partial")
    shutil.copyfile(path, partial)
    os.replace(partial, latest)  # whoever points cascade.prompt_router at latest.onnx gets it whole on restart
    return RetrainResult("swapped", f"Brier {candidate_score:.4f} (candidate) < {serving_score:.4f} (serving) on the newest "
                         f"{holdout_labels} labels", path, **figures)  # fmt: skip


class BackgroundRetrainer:
    def __init__(self, runner, record, settings, check_every_s: float = CHECK_EVERY_S):
        self.runner = runner
        self.record = record  # sdk.traffic.record.TrafficRecord
        self.settings = settings  # sdk.traffic.config.TrafficSettings
        self.check_every_s = check_every_s
        self.outcomes: Counter[str] = Counter()
        self.last: RetrainResult | None = None
        self._labels_at_last_attempt = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.check_every_s)
            await self.maybe_retrain()

    async def maybe_retrain(self) -> RetrainResult | None:
        labels = await asyncio.to_thread(self.record.num_label_rows)
        if labels - self._labels_at_last_attempt < self.settings.retrain_every_labels:
            return None
        self._labels_at_last_attempt = labels
        return await self.retrain()

    async def retrain(self) -> RetrainResult:
        from router.prompt_router.scorer import load_scorer

        serving = self.runner.prompt_scorer
        started = time.monotonic()
        try:
            result = await asyncio.to_thread(retrain_once, self.settings.record_path, serving, self.settings.routers_dir,
                                             self.settings.retrain_holdout_labels)  # fmt: skip
            if result.outcome == "swapped":
                fresh = await asyncio.to_thread(load_scorer, result.path)  # whole before anyone can see it
                if self.runner.prompt_scorer is serving:  # nobody swapped meanwhile
                    self.runner.prompt_scorer = fresh
        except Exception as exc:  # a broken record, a full disk: the serving router stays
            logger.exception("router retrain failed")
            result = RetrainResult("failed", f"{type(exc).__name__}: {exc}")
        self.outcomes[result.outcome] += 1
        self.last = result
        logger.info("router retrain (%.1f s): %s, %s%s", time.monotonic() - started, result.outcome, result.detail,
                    f"; now serving {result.path}" if result.outcome == "swapped" else "")  # fmt: skip
        return result
