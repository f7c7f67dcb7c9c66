"""Retraining the prompt router from the record (sdk.traffic.retrain): the candidate is swapped in
only when it ranks the newest labels better than the serving router by more than two standard
errors of the difference (a better calibrated one that ranks worse stays out), and the swap is atomic: a
reader of the router file or of runner.prompt_scorer sees the old router or the new one
whole, never half of either."""

from __future__ import annotations

import dataclasses
import asyncio
import os
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from router.eval_tables import RoutingExample
from router.prompt_router.cold_recipe import SELECTED
from router.prompt_router.embedder_export import model_fingerprint
from router.prompt_router.scorer import load_scorer
from router.prompt_router.training import LabelledRows, RouterParameters, fit, table_rows, table_scale, write_router
from sdk.traffic import store
from sdk.traffic.shared_routers import SharedRouters
from sdk.traffic.stores import connect
from sdk.traffic.retrain import BackgroundRetrainer, Candidate, RetrainResult, compare_rankings, retrain_once
from sdk.traffic.config import TrafficSettings

PROMPTS = [
    f"Question {i}: "
    + ("compute 3 * (4 + 5) = ?" if i % 3 == 0 else "tell me about the history of Rome.") * (1 + i % 4)
    for i in range(40)
]


class ScorerHolder:
    """The serving router's slot as the retrainer sees the cascade runner (sdk.traffic.retrain.ScorerSlot)."""

    def __init__(self, scorer):
        self.prompt_scorer = scorer

    def swap_prompt_scorer(self, fresh, replacing=None) -> bool:
        if replacing is not None and self.prompt_scorer is not replacing:
            return False
        self.prompt_scorer = fresh
        return True


def _router(path, alpha: float = 1.0, flip: bool = False) -> str:
    """A cold router without table statistics; `flip` swaps which prompts the tables call hard,
    so its scores differ."""
    examples = [
        RoutingExample(p, ("compute" not in p) != flip, True, f"mmlu_s{i % 4}") for i, p in enumerate(PROMPTS * 3)
    ]
    head, _ = fit(table_rows(examples), None, dataclasses.replace(SELECTED, alpha=alpha))
    return write_router(head, None, path, {"alpha": alpha}, scale=table_scale(head, examples, "its training rows"))


def _fill(path, rows: int, weak_rate_by_topic: tuple[float, float], seed: int = 0) -> None:
    """A record of `rows` requests in two topics (unit embeddings around two centres) whose local tier
    is right at the given rates, every row judged on both tiers, labels arriving in order. `path`: a
    SQLite file, or a state database's URL (sdk.traffic.stores)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(2, 384))
    conn = connect(str(path))
    embedder = f"{model_fingerprint()}|int8"
    from router.prompt_router.prompt_shape import shape_features

    for i in range(rows):
        topic = i % 2
        vector = centres[topic] + 0.3 * rng.normal(size=384)
        text = PROMPTS[i % len(PROMPTS)]
        store.insert_request(
            conn,
            {
                "id": f"r{i}",
                "created_at": 1000.0 + i,
                "model": "auto",
                "tier": "local",
                "escalated": 0,
                "reason": "confident",
                "shape": store.to_blob(shape_features([text])[0]),
                "shape_version": 1,
                "embedding": store.to_blob(vector / np.linalg.norm(vector)),
                "embedder": embedder,
            },
        )
        weak = float(rng.random() < weak_rate_by_topic[topic])
        store.upsert_label(conn, f"r{i}", "shadow", weak, 1.0, "test", created_at=2000.0 + i)
    conn.close()


def test_nothing_to_go_on_is_a_skip(tmp_path):
    db = tmp_path / "traffic.sqlite3"
    _fill(db, 100, (0.7, 0.7))
    serving = load_scorer()  # the shipped router: it carries the public tables' statistics
    few = retrain_once(str(db), serving, str(tmp_path / "routers"), holdout_labels=100)
    assert (few.outcome, few.num_labels) == ("skipped", 100) and "needs 120" in few.detail
    store.connect(tmp_path / "empty.sqlite3").close()
    assert retrain_once(str(tmp_path / "empty.sqlite3"), serving, str(tmp_path / "routers"), 100).outcome == "skipped"
    bare = load_scorer(_router(tmp_path / "bare.onnx"))  # trained without statistics to refit from
    assert "no table statistics" in retrain_once(str(db), bare, str(tmp_path / "routers"), 10).detail
    assert not (tmp_path / "routers").exists()


def _held_out(n: int = 120, seed: int = 0) -> LabelledRows:
    """Rows whose local tier fails more often the larger their one feature; labels of the local tier only."""
    rng = np.random.default_rng(seed)
    shape = rng.random((n, 1))
    local_right = (rng.random(n) >= shape[:, 0]).astype(float)
    return LabelledRows(shape.astype(np.float32), np.c_[local_right, np.full(n, np.nan)])


def test_a_better_calibrated_candidate_that_ranks_worse_stays_out():
    """The old guard's failure (issue 52): the Brier score prefers predictions near the observed rate,
    whatever order they put the prompts in; the swap rule asks for the order."""
    held = _held_out()
    # serving: its gain rises with the feature (it ranks the local failures first) but it predicts the local
    # tier right far too rarely; candidate: near the observed rate everywhere, in the reverse order
    serving = RouterParameters(np.array([[-0.3, 0.0]]), np.array([0.1, 0.9]), None, None)
    candidate = RouterParameters(np.array([[0.02, 0.0]]), np.array([0.5, 0.9]), None, None)

    def brier(router: RouterParameters) -> float:
        return float(np.mean((np.clip(router.tiers(held.shape, None)[:, 0], 0, 1) - held.labels[:, 0]) ** 2))

    assert brier(candidate) < brier(serving) - 0.1  # what the old guard swapped on
    ranking = compare_rankings(serving, candidate, held)
    assert ranking.auroc_a < 0.5 < ranking.auroc_b and not Candidate(None, None, ranking).wins
    assert Candidate(None, None, compare_rankings(candidate, serving, held)).wins  # the other way round it would swap


def test_a_candidate_better_by_less_than_the_spread_stays_out():
    held = _held_out()
    noise = np.random.default_rng(1).normal(size=(len(held), 1)).astype(np.float32)  # a seed where noise helps a little
    rows = LabelledRows(np.hstack([held.shape, noise]), held.labels)
    serving = RouterParameters(np.array([[-0.3, 0.0], [0.0, 0.0]]), np.array([0.8, 0.9]), None, None)
    candidate = RouterParameters(np.array([[-0.3, 0.0], [-0.02, 0.0]]), np.array([0.8, 0.9]), None, None)  # + noise
    ranking = compare_rankings(serving, candidate, rows)
    assert 0 < ranking.difference < ranking.difference_se and not Candidate(None, None, ranking).wins
    # the serving router ranks by a noisier copy of the feature: the candidate is better by one and a half SEs, not two
    noisier = RouterParameters(np.array([[-0.3, 0.0], [-0.05, 0.0]]), np.array([0.8, 0.9]), None, None)
    plain = RouterParameters(np.array([[-0.3, 0.0], [0.0, 0.0]]), np.array([0.8, 0.9]), None, None)
    noise = np.random.default_rng(3).normal(size=(len(held), 1)).astype(np.float32)
    ranking = compare_rankings(noisier, plain, LabelledRows(np.hstack([held.shape, noise]), held.labels))
    assert ranking.difference_se < ranking.difference < 2 * ranking.difference_se
    assert ranking.a_beats_b(1.0) and not Candidate(None, None, ranking).wins  # one SE would swap it in
    only_right = LabelledRows(rows.shape, np.c_[np.ones(len(held)), np.full(len(held), np.nan)])
    nothing = Candidate(None, None, compare_rankings(serving, serving, only_right))
    assert nothing.ranking.num_positive == 0 and not nothing.wins and "nothing to rank" in nothing.verdict(100)


@pytest.mark.slow
def test_a_better_candidate_is_written_whole_and_swapped_in(tmp_path):
    db = tmp_path / "traffic.sqlite3"
    _fill(db, 600, (0.1, 0.95))  # topic 0: the local tier is wrong far more than the prompt shape says
    runner = ScorerHolder(load_scorer())
    settings = TrafficSettings(record=True, path=str(db), retrain=True, retrain_holdout_labels=100)
    record = SimpleNamespace(num_label_rows=lambda: 600, config=SimpleNamespace(path=str(db)))
    retrainer = BackgroundRetrainer(runner, record, settings)
    result = asyncio.run(retrainer.maybe_retrain())
    assert result.outcome == "swapped", result
    assert result.candidate_auroc - result.serving_auroc > 2 * result.auroc_difference_se > 0
    assert result.num_ranked == 100 and retrainer.outcomes["swapped"] == 1
    assert "better by more than 2 SE" in result.detail and "not" not in result.detail
    fresh = runner.prompt_scorer
    assert (
        fresh.path == result.path and fresh.metadata["topic_correction"]["num_rows"] == 500
    )  # the newest 100 held out
    latest = load_scorer(os.path.join(settings.routers_dir, "latest.onnx"))
    np.testing.assert_allclose(latest.score(PROMPTS), fresh.score(PROMPTS))
    assert asyncio.run(retrainer.maybe_retrain()) is None  # no new labels since
    again = asyncio.run(retrainer.retrain())  # the same labels: the candidate is the serving router again
    assert again.outcome == "kept" and again.candidate_auroc == pytest.approx(again.serving_auroc, abs=1e-9)
    assert "not better by more than 2 SE" in again.detail and fresh.path in again.detail
    assert runner.prompt_scorer is fresh and len(list((tmp_path / "routers").glob("router-*.onnx"))) == 1


def test_replicas_sharing_a_record_retrain_once_and_serve_the_same_router(state_db_url, tmp_path):
    """Two replicas on one state database: the one holding the retrain lock retrains and swaps, the
    other adopts that router at its next check; when the first stops, the second takes the retrains over."""
    from sdk.state.database import StateDatabase

    async def migrate():
        await (await StateDatabase(state_db_url).open()).close()

    asyncio.run(migrate())
    _fill(state_db_url, 600, (0.1, 0.95))
    record = SimpleNamespace(num_label_rows=lambda: 600, config=SimpleNamespace(path=state_db_url))
    replicas = []
    for name in ("a", "b"):
        settings = TrafficSettings(
            record=True, retrain=True, retrain_holdout_labels=100, router_dir=str(tmp_path / name)
        )
        runner = ScorerHolder(load_scorer())
        replicas.append(BackgroundRetrainer(runner, record, settings, shared=SharedRouters(state_db_url, name)))
    first, second = replicas
    try:
        swapped = asyncio.run(first.maybe_retrain())
        assert swapped.outcome == "swapped" and swapped.path.startswith(str(tmp_path / "a"))
        assert asyncio.run(second.maybe_retrain()) is None  # the lock is taken: it does not retrain
        adopted = second.scorers.prompt_scorer
        assert second.outcomes == {"adopted": 1} and adopted.path == str(
            tmp_path / "b" / os.path.basename(swapped.path)
        )
        np.testing.assert_allclose(adopted.score(PROMPTS), first.scorers.prompt_scorer.score(PROMPTS))
        assert asyncio.run(first.maybe_retrain()) is None and first.outcomes == {"swapped": 1}  # nothing new to adopt
        first.shared.close()  # the first replica stops
        took_over = asyncio.run(second.maybe_retrain())
        assert took_over.outcome == "kept"  # the same labels: its candidate is the router it already serves
    finally:
        first.shared.close()
        second.shared.close()


def test_readers_see_one_router_or_the_other_whole(tmp_path):
    """A writer replaces the router file again and again (training.write_router: aside, then
    renamed) while readers load it: every load succeeds and scores like one of the two."""
    first, second = _router(tmp_path / "a.onnx"), _router(tmp_path / "b.onnx", flip=True)
    expected = [load_scorer(first).score(PROMPTS), load_scorer(second).score(PROMPTS)]
    assert np.abs(expected[0] - expected[1]).max() > 0.05
    target = tmp_path / "serving.onnx"
    _router(target)
    stop, failures, loads = threading.Event(), [], [0]

    def write():
        flip = False
        while not stop.is_set():
            _router(target, flip=flip)
            flip = not flip

    def read():
        while not stop.is_set():
            try:
                scores = load_scorer(target).score(PROMPTS)
                if not any(np.allclose(scores, e, atol=1e-6) for e in expected):
                    failures.append("a mixture")
                loads[0] += 1
            except Exception as exc:  # noqa: BLE001
                failures.append(repr(exc))

    threads = [threading.Thread(target=write)] + [threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(3)
    stop.set()
    for thread in threads:
        thread.join()
    assert not failures and loads[0] > 10


async def test_a_swap_mid_traffic_changes_the_router_between_requests(tmp_path):
    """Requests read runner.prompt_scorer once; a swap during traffic gives each request one router."""
    routers = [load_scorer(_router(tmp_path / "a.onnx")), load_scorer(_router(tmp_path / "b.onnx", flip=True))]
    expected = [r.score(PROMPTS) for r in routers]
    runner = ScorerHolder(routers[0])
    seen = []

    async def request(i: int):
        scorer = runner.prompt_scorer  # as CascadeRequest does
        await asyncio.sleep(0)
        seen.append(np.allclose(scorer.score([PROMPTS[i % 40]])[0], expected[routers.index(scorer)][i % 40], atol=1e-6))

    async def swap():
        await asyncio.sleep(0)
        runner.swap_prompt_scorer(routers[1])

    await asyncio.gather(*(request(i) for i in range(50)), swap(), *(request(i) for i in range(50, 100)))
    assert all(seen) and runner.prompt_scorer is routers[1]
    assert RetrainResult("kept", "").path is None
