"""The confidence probe on synthetic data whose labels follow a known logistic model:
training quality, ONNX/onnxruntime against torch, NaN and ±inf features, the saved
file's round trip (refusals: test_probe_loading.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from confidence.auroc import auroc
from confidence.probe import ConfidenceProbe, ProbeConfig, load_probe
from confidence.probe_runtime import METADATA_KEY

FEATURE_NAMES = ["mean_logprob", "min_logprob", "entropy_p90", "length", "margin"]
TRUE_WEIGHTS = np.array([1.6, -1.1, 0.7, 0.0, 0.4])
TRUE_BIAS = 0.3
FINGERPRINT = "gguf-sha256:" + "ab" * 32


def make_dataset(num_rows: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features, labels, true logits); features on uneven scales so standardization matters."""
    rng = np.random.default_rng(seed)
    standard = rng.normal(size=(num_rows, len(FEATURE_NAMES)))
    true_logits = standard @ TRUE_WEIGHTS + TRUE_BIAS
    labels = rng.random(num_rows) < 1.0 / (1.0 + np.exp(-true_logits))
    features = (standard * [2.0, 0.5, 10.0, 100.0, 1.0] + [-3.0, 0.0, 5.0, 200.0, 0.0]).astype(np.float32)
    return features, labels, true_logits


@pytest.fixture(scope="module")
def train_set():
    return make_dataset(3_000, seed=0)


@pytest.fixture(scope="module")
def test_set():
    features, labels, true_logits = make_dataset(3_000, seed=1)
    features[::5, 1] = np.nan  # missing features
    features[::7, 0] = -np.inf  # log-probs of impossible tokens
    features[3] = np.nan  # a row with nothing known
    return features, labels, true_logits


@pytest.fixture(scope="module", params=[("logistic", "platt"), ("mlp", "isotonic"), ("mlp", None)], ids=str)
def trained(request, train_set):
    kind, calibration = request.param
    features, labels, _ = train_set
    return ConfidenceProbe(FEATURE_NAMES, FINGERPRINT, ProbeConfig(kind=kind, calibration=calibration)).fit(
        features, labels
    )


@pytest.fixture(scope="module")
def saved_path(trained, tmp_path_factory):
    path = tmp_path_factory.mktemp("probe") / "probe.onnx"
    trained.save(path)
    return path


def test_probe_ranks_almost_as_well_as_the_generating_model(trained, test_set):
    features, labels, true_logits = make_dataset(3_000, seed=2)
    assert auroc(trained.predict_logit(features), labels) > auroc(true_logits, labels) - 0.015
    # Calibrated: nearly as close to the outcomes (Brier score) as the true probabilities;
    # isotonic steps fitted on 750 held-out rows overfit a little (+0.003 here).
    true_brier = np.mean((1 / (1 + np.exp(-true_logits)) - labels) ** 2)
    assert np.mean((trained.predict(features) - labels) ** 2) < true_brier + 0.01
    # Missing and -inf features hide part of what generated the label: worse, not useless.
    degraded_features, degraded_labels, _ = test_set
    assert auroc(trained.predict_logit(degraded_features), degraded_labels) > 0.7
    assert trained.metrics["heldout_auroc"] == pytest.approx(0.85, abs=0.05)
    assert trained.metrics["num_train"] + trained.metrics["num_heldout"] == 3_000


def test_onnxruntime_matches_torch(trained, saved_path, test_set):
    features = test_set[0]
    loaded = load_probe(saved_path, FINGERPRINT)
    np.testing.assert_allclose(loaded.predict_logit(features), trained.predict_logit(features), atol=1e-5)
    raw_probabilities = loaded.session.run(["probability"], {"features": features})[0]
    np.testing.assert_allclose(raw_probabilities, 1 / (1 + np.exp(-trained.predict_logit(features))), atol=1e-5)
    if trained.config.calibration != "isotonic":
        # Isotonic interpolation can be steep enough to magnify float32 rounding.
        np.testing.assert_allclose(loaded.predict(features), trained.predict(features), atol=1e-5)
    calibrated = loaded.predict(features)
    assert np.isfinite(calibrated).all() and ((calibrated >= 0) & (calibrated <= 1)).all()


def test_missing_and_infinite_features_are_imputed_and_clipped(trained, saved_path, train_set):
    loaded = load_probe(saved_path, FINGERPRINT)
    row = train_set[0][10].copy()
    with_missing, with_mean = row.copy(), row.copy()
    with_missing[2], with_mean[2] = np.nan, trained.preprocessing["mean"][2]
    assert loaded.predict(with_missing) == pytest.approx(loaded.predict(with_mean), abs=1e-6)
    too_low, at_low = row.copy(), row.copy()
    too_low[0], at_low[0] = -np.inf, trained.preprocessing["low"][0]
    assert loaded.predict(too_low) == pytest.approx(loaded.predict(at_low), abs=1e-6)
    assert np.isfinite(loaded.predict(np.full(len(FEATURE_NAMES), np.nan)))


def test_save_load_round_trip_keeps_the_metadata(trained, saved_path):
    loaded = load_probe(saved_path, FINGERPRINT)
    assert loaded.kind == trained.config.kind
    assert loaded.feature_names == tuple(FEATURE_NAMES)
    assert loaded.model_fingerprint == FINGERPRINT and loaded.trained_at == trained.trained_at
    assert loaded.metrics == trained.metrics
    expected_calibrator = None if trained.calibrator is None else trained.calibrator.to_dict()
    assert (None if loaded.calibrator is None else loaded.calibrator.to_dict()) == expected_calibrator
    assert loaded.provider == loaded.session.get_providers()[0]
    assert loaded.provider in ("CUDAExecutionProvider", "CPUExecutionProvider")
    single = loaded.predict(loaded.features_from_mapping({"mean_logprob": -2.0, "unused": 1.0}))
    assert isinstance(single, float) and 0.0 <= single <= 1.0
    assert loaded.predict(np.zeros((0, len(FEATURE_NAMES)))).shape == (0,)


def test_graph_is_built_from_plain_onnx_ops(saved_path):
    model = onnx.load(str(saved_path))
    allowed = {"IsNaN", "Where", "Max", "Min", "Sub", "Div", "MatMul", "Add", "Relu"}
    allowed |= {"Reshape", "Sigmoid"}
    assert {node.op_type for node in model.graph.node} <= allowed
    assert [prop.key for prop in model.metadata_props] == [METADATA_KEY]


def test_training_is_deterministic(train_set):
    features, labels, _ = train_set
    first, second = (ConfidenceProbe(FEATURE_NAMES, FINGERPRINT).fit(features, labels) for _ in range(2))
    for (w1, b1), (w2, b2) in zip(first.layers, second.layers):
        np.testing.assert_array_equal(w1, w2)
        np.testing.assert_array_equal(b1, b2)
