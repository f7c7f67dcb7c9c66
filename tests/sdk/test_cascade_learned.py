"""The cascade with its learned parts: a confidence probe scoring the running local answer
(checked against the local GGUF's fingerprint) and the prompt router before generation.
Real tiers on loopback, as in test_cascade."""

from __future__ import annotations

import numpy as np
import pytest

from confidence import FEATURE_NAMES, RunningConfidence
from confidence.gguf_fingerprint import model_fingerprint_for_gguf
from confidence.probe import ConfidenceProbe, ProbeConfig
from confidence.probe_runtime import ProbeModelMismatchError, load_probe
from sdk.engine_common.model_files import resolve_model_path
from sdk.cascade.runner import CascadeConfig, CascadeRunner
from sdk.protocol.engine import GenerationRequest
from tests.cloud_engine.grpc_helpers import long_tiny_dir, serve  # noqa: F401  (fixtures)
from tests.sdk.test_cascade import (  # noqa: F401  (fixtures)
    GREEDY,
    QUESTION,
    cloud_engine,
    local_engine,
    make_runner,
    recording,
)

pytestmark = pytest.mark.slow


def train_probe(path, fingerprint: str) -> str:
    """A small probe over every feature (random labels tied to mean_prob): what matters here
    is that the cascade runs the file it is given, not how good it is."""
    rng = np.random.default_rng(0)
    features = rng.random((300, len(FEATURE_NAMES))).astype(np.float32)
    labels = features[:, FEATURE_NAMES.index("mean_prob")] > 0.5
    ConfidenceProbe(list(FEATURE_NAMES), fingerprint, ProbeConfig(num_steps=30)).fit(features, labels).save(path)
    return str(path)


@pytest.fixture(scope="module")
def probe_path(tmp_path_factory, local_engine):  # noqa: F811
    fingerprint = model_fingerprint_for_gguf(resolve_model_path(local_engine.config.model_path))
    return train_probe(tmp_path_factory.mktemp("probe") / "probe.onnx", fingerprint)


async def test_the_probe_decides_at_token_k_with_its_own_score(
    make_runner,  # noqa: F811
    local_engine,  # noqa: F811
    probe_path,
    recording,  # noqa: F811
):
    k = 4
    events = [
        e
        async for e in local_engine.generate(
            GenerationRequest("ref", local_engine.apply_chat_template(QUESTION), GREEDY)
        )
    ]
    running = RunningConfidence()
    for event in events[:k]:
        running.update(event)
    expected = load_probe(probe_path, model_fingerprint_for_gguf(resolve_model_path(None))).score_features(
        running.features_dict()
    )
    threshold = min(0.9999, expected + 1e-3)  # just above the probe's verdict at K: escalate there
    runner = await make_runner(min_tokens_k=k, probe=probe_path)
    routing = (await runner.complete(QUESTION, GREEDY, model=f"auto:{threshold!r}")).routing
    assert (routing.tier, routing.escalated, routing.decided_at_token) == ("cloud", True, k)
    assert routing.confidence == pytest.approx(expected, abs=1e-6) and "probe" in routing.detail
    assert len(recording.received) == 1


def test_a_probe_for_another_model_is_refused(tmp_path, local_engine):  # noqa: F811
    path = train_probe(tmp_path / "other.onnx", "gguf-sha256:" + "cd" * 32)
    with pytest.raises(ProbeModelMismatchError, match="trained for model"):
        CascadeRunner(local_engine, None, CascadeConfig(probe=path))


class CountingScorer:
    """The shipped prompt router, counting the prompts it is asked to score."""

    def __init__(self, scorer):
        self.scorer, self.prompts = scorer, []
        self.metadata, self.path = scorer.metadata, scorer.path

    def outputs(self, prompts):
        self.prompts += list(prompts)
        return self.scorer.outputs(prompts)


async def test_prompt_router_decides_before_generation(make_runner, recording):  # noqa: F811
    eager = await make_runner(prompt_router="default", prompt_router_threshold=1.0)  # any score > 0 escalates
    eager.prompt_scorer = CountingScorer(eager.prompt_scorer)
    score = float(eager.prompt_scorer.scorer.score([QUESTION[0]["content"]])[0])
    result = await eager.complete(QUESTION, GREEDY, model="auto:0.5")
    routing = result.routing
    assert (routing.tier, routing.escalated, routing.reason, routing.decided_by) == (
        "cloud",
        True,
        "prompt_router",
        "prompt_router",
    )
    assert routing.confidence == pytest.approx(1.0 - score, abs=1e-6) and routing.decided_at_token is None
    assert "local" not in routing.cost and len(recording.received) == 1  # the local model never ran
    # Requests the policies before it settle are never scored: private, forced, threshold 1.
    for model, private in (("auto:0.5", True), ("local", False), ("auto:1", False)):
        await eager.complete(QUESTION, GREEDY, model=model, private=private)
    assert eager.prompt_scorer.prompts == [QUESTION[0]["content"]]

    never = await make_runner(prompt_router="default", prompt_router_threshold=0.0)
    routing = (await never.complete(QUESTION, GREEDY, model="auto:0")).routing
    assert (routing.tier, routing.reason) == ("local", "confident") and routing.decided_by == "streaming"
