"""Retraining the prompt router from the traffic record, and swapping it in only when it ranks
prompts better on labels it never saw.

`retrain_once` (a thread: numpy and file I/O) holds the newest `holdout_labels` labelled rows
out, fits a candidate on the rest (the serving router's public-table statistics + the
traffic: training.fit), and compares how the two rank the held-out rows that say how the local
tier did (feedback on a local answer, shadow judgments): the AUROC of each router's predicted
gain (its score, before the score scale) for "the local answer was wrong", paired on the same
rows, with DeLong's standard error of the difference (router.evaluation.paired_auc). The
candidate is swapped in only when its AUROC beats the serving router's by more than
SWAP_MARGIN_SE (two) of those standard errors; otherwise the serving router stays and the result
says why.

Ranking, not calibration: a threshold acts on the order of the scores, and routing pays off by
sending the prompts the local tier fails first. The Brier score of the per-tier predictions that
this replaced (issue 52) rewarded better-calibrated predictions that ranked worse: it swapped in
routers that routed worse than the cold one (bench.router_learning). The held-out rows are the
newest because the serving router may have been trained on older ones. A swapped-in router is
written under a new name and copied to latest.onnx (written aside, then renamed), on the serving
router's score scale (score_scale: a prompt's score moves only as far as its predicted gain);
the caller loads it whole and then swaps it in (the runner's `swap_prompt_scorer`, one assignment), so a
request sees the old router or the new one, never a mixture. Each request reads the scorer once.

`BackgroundRetrainer` runs that every CHECK_EVERY_S when `retrain_every_labels` new labels
have come in; outcomes are logged and counted (/metrics: tandem:router_retrains_total). When the
replicas of a server share the record (`state_db`), only the one holding the retrain lock
retrains, and every replica adopts the routers it swaps in (sdk.traffic.shared_routers; counted
as the outcome "adopted").
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
from typing import Protocol

import numpy as np

from router.evaluation.paired_auc import PairedAuroc, paired_auroc
from router.prompt_router.cold_recipe import ColdRecipe
from router.prompt_router.embedder_export import DEFAULT_PRECISION, model_fingerprint
from router.prompt_router.linear_head import HeadStatistics, LinearHead
from router.prompt_router.score_scale import ScoreScale
from router.prompt_router.topic_correction import TopicCorrection
from router.prompt_router.training import LabelledRows, RouterParameters, fit, write_router
from sdk.traffic.rows import load_traffic_rows
from sdk.traffic.stores import described

logger = logging.getLogger("tandem.traffic")

CHECK_EVERY_S = 60.0
MIN_TRAINING_LABELS = 20  # besides the held-out ones
# A candidate must rank the held-out labels better by more than this many standard errors of the paired
# difference. One SE swapped on noise about one retrain in six: in the design subjects' simulation (20 seeds, 10%
# labels) it swapped 8 learners in, one of them worse (-0.024 APGR on the rest); two SEs swapped the other 7 (mean
# +0.045). Chosen after the one-SE rule had been scored on the locked subjects
# (docs/benchmarks.md: "Learning from labels").
SWAP_MARGIN_SE = 2.0


@dataclass(frozen=True)
class RetrainResult:
    outcome: str  # "swapped", "kept" (the candidate ranked no better by SWAP_MARGIN_SE), "skipped" (too few labels)
    detail: str
    path: str | None = None  # the new router, when swapped
    serving_auroc: float | None = None  # for "the local answer was wrong", on the held-out rows that know it
    candidate_auroc: float | None = None
    auroc_difference_se: float | None = None  # of candidate - serving, paired (DeLong)
    num_ranked: int = 0  # held-out rows that say how the local tier did
    num_labels: int = 0


def compare_rankings(serving: RouterParameters, candidate: RouterParameters, held: LabelledRows) -> PairedAuroc:
    """How the candidate (a) and the serving router (b) rank the `held` rows that know how the local
    tier did: AUROC of each one's predicted gain for "the local answer was wrong" (a label below 0.5)."""
    knows_local = np.flatnonzero(~np.isnan(held.labels[:, 0]))
    rows = held.take(knows_local)

    def gain(parameters: RouterParameters) -> np.ndarray:
        tiers = parameters.tiers(rows.shape, rows.embedding)
        return tiers[:, 1] - tiers[:, 0]

    return paired_auroc(gain(candidate), gain(serving), rows.labels[:, 0] < 0.5)


@dataclass(frozen=True)
class Candidate:
    """A retrained router beside the serving one, both ranking the labels it was not trained on."""

    head: LinearHead
    correction: TopicCorrection | None
    ranking: PairedAuroc  # a: the candidate, b: the serving router

    @property
    def wins(self) -> bool:
        """It ranks the held-out labels better by more than SWAP_MARGIN_SE standard errors of the difference."""
        return self.ranking.a_beats_b(SWAP_MARGIN_SE)

    def figures(self) -> dict:
        ranking = self.ranking
        return {
            "serving_auroc": ranking.auroc_b,
            "candidate_auroc": ranking.auroc_a,
            "auroc_difference_se": ranking.difference_se,
            "num_ranked": ranking.num_positive + ranking.num_negative,
        }

    def verdict(self, holdout_labels: int) -> str:
        """What was compared and what it gave, in words (logged, and the RetrainResult's detail)."""
        ranking, where = self.ranking, f"on the local tier's labels among the newest {holdout_labels}"
        counts = f"{ranking.num_positive} wrong and {ranking.num_negative} right local answers"
        if not (ranking.num_positive and ranking.num_negative):
            return f"nothing to rank {where}: {counts} (a ranking needs both)"
        outcome = ("better" if self.wins else "not better") + f" by more than {SWAP_MARGIN_SE:g} SE"
        return (
            f"AUROC for a wrong local answer {ranking.auroc_a:.3f} (candidate) vs {ranking.auroc_b:.3f} (serving), "
            f"difference {ranking.difference:+.3f} +- {ranking.difference_se:.3f} (SE, paired) {where} ({counts}): "
            f"{outcome}"
        )


def refit_against_serving(
    prior: HeadStatistics | LabelledRows,
    rows: LabelledRows,
    newest: np.ndarray,
    serving: RouterParameters,
    recipe: ColdRecipe,
) -> Candidate:
    """The router refitted on the tables (`prior`) and every row but `newest` (the newest labelled
    ones), and how it and `serving` rank those (compare_rankings): the swap rule of the background
    retrain (bench.router_simulation.guarded_fit replays it on simulated traffic)."""
    held = rows.take(newest)
    head, correction = fit(prior, rows.take(np.setdiff1d(np.arange(len(rows)), newest)), recipe)
    candidate = RouterParameters.of(head, correction).as_stored()  # the numbers the file will hold
    return Candidate(head, correction, compare_rankings(serving, candidate, held))


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
        return RetrainResult(
            "skipped",
            f"{labelled.size} labelled rows; a retrain needs {holdout_labels + MIN_TRAINING_LABELS}",
            num_labels=int(labelled.size),
        )
    newest = labelled[np.argsort(traffic.labelled_at[labelled], kind="stable")][-holdout_labels:]
    recipe = ColdRecipe.from_json(serving.metadata.get("head_recipe"))  # the serving router's features and penalty
    candidate = refit_against_serving(prior, traffic.rows, newest, RouterParameters.read(serving.path), recipe)
    head, correction = candidate.head, candidate.correction
    figures = {**candidate.figures(), "num_labels": int(labelled.size)}
    if not candidate.wins:
        return RetrainResult("kept", f"{candidate.verdict(holdout_labels)}; still serving {serving.path}", **figures)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    os.makedirs(router_dir, mode=0o700, exist_ok=True)
    path = str(Path(router_dir) / f"router-{stamp}.onnx")
    metrics = {
        "retrained_from": described(db_path),
        "holdout_labels": holdout_labels,
        "replaced": serving.path,
        **figures,
        "num_traffic_rows": len(traffic.rows) - len(newest),
        "topic_correction": None if correction is None else correction.describe(),
    }
    scale = ScoreScale.from_json(serving.metadata["score_scale"])  # a swap moves scores only as far as the gains move
    write_router(head, correction, path, metrics, precision, prior, recipe, scale)
    latest = Path(router_dir) / "latest.onnx"
    partial = latest.with_name(f"latest.onnx.{os.getpid()}.partial")
    shutil.copyfile(path, partial)
    os.replace(partial, latest)  # whoever points cascade.prompt_router at latest.onnx gets it whole on restart
    return RetrainResult("swapped", candidate.verdict(holdout_labels), path, **figures)


class ScorerSlot(Protocol):
    """Where the serving prompt router is (the cascade runner): read it, and swap a fresh one in whole."""

    @property
    def prompt_scorer(self): ...

    def swap_prompt_scorer(self, fresh, replacing=None) -> bool:
        """Serve `fresh` from the next request on; with `replacing`, only if that one is still serving."""
        ...


class BackgroundRetrainer:
    def __init__(self, scorers: ScorerSlot, record, settings, check_every_s: float = CHECK_EVERY_S, shared=None):
        self.scorers = scorers
        self.record = record  # sdk.traffic.record.TrafficRecord
        self.settings = settings  # sdk.traffic.config.TrafficSettings
        self.check_every_s = check_every_s
        self.shared = shared  # sdk.traffic.shared_routers.SharedRouters when replicas share the record
        self.outcomes: Counter[str] = Counter()
        self.last: RetrainResult | None = None
        self._labels_at_last_attempt = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.check_every_s)
            await self.maybe_retrain()

    async def maybe_retrain(self) -> RetrainResult | None:
        if self.shared is not None:
            await self.adopt_shared()
            try:
                if not await asyncio.to_thread(self.shared.leads):
                    return None  # another replica retrains; this one adopts what it swaps in
            except Exception as exc:  # the database is away: nobody can retrain from it now
                logger.warning("router retrain: cannot reach the shared record (%s); trying again later", exc)
                return None
        labels = await asyncio.to_thread(self.record.num_label_rows)
        if labels - self._labels_at_last_attempt < self.settings.retrain_every_labels:
            return None
        self._labels_at_last_attempt = labels
        return await self.retrain()

    async def retrain(self) -> RetrainResult:
        from router.prompt_router.scorer import load_scorer

        serving = self.scorers.prompt_scorer
        started = time.monotonic()
        try:
            result = await asyncio.to_thread(
                retrain_once,
                self.record.config.path,
                serving,
                self.settings.routers_dir,
                self.settings.retrain_holdout_labels,
            )
            if result.outcome == "swapped":
                fresh = await asyncio.to_thread(load_scorer, result.path)  # whole before anyone can see it
                self.scorers.swap_prompt_scorer(fresh, replacing=serving)  # unless another swap came first
                if self.shared is not None:
                    await asyncio.to_thread(self.shared.publish, result.path, result.detail)
        except Exception as exc:  # a broken record, a full disk: the serving router stays
            logger.exception("router retrain failed")
            result = RetrainResult("failed", f"{type(exc).__name__}: {exc}")
        self.outcomes[result.outcome] += 1
        self.last = result
        logger.info(
            "router retrain (%.1f s): %s, %s%s",
            time.monotonic() - started,
            result.outcome,
            result.detail,
            f"; now serving {result.path}" if result.outcome == "swapped" else "",
        )
        return result

    async def adopt_shared(self) -> bool:
        """Serve the newest router another replica swapped in, if there is one this replica has not seen."""
        from router.prompt_router.scorer import load_scorer

        try:
            newest = await asyncio.to_thread(self.shared.newest_unseen)
            if newest is None:
                return False
            router_id, name, onnx = newest
            path = await asyncio.to_thread(self.shared.save, name, onnx, self.settings.routers_dir)
            fresh = await asyncio.to_thread(load_scorer, path)  # whole before anyone can see it
        except Exception as exc:  # the database away, a full disk: the serving router stays, the next check retries
            logger.warning("router retrain: cannot adopt the replicas' newest router (%s)", exc)
            return False
        self.shared.last_seen = router_id
        self.scorers.swap_prompt_scorer(fresh)
        self.outcomes["adopted"] += 1
        logger.info("router retrain: now serving %s, swapped in by a replica", path)
        return True
