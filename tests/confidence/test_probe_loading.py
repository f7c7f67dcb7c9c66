"""What loading a saved confidence probe must refuse: another model's probe, tampered or
missing metadata, files that are not probes, rows of the wrong width; also the provider
choice and training setups that cannot work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from confidence import onnx_file
from confidence.probe import (
    ConfidenceProbe,
    ProbeConfig,
    ProbeFeatureMismatchError,
    ProbeFormatError,
    ProbeModelMismatchError,
    load_probe,
)
from confidence.probe_runtime import METADATA_KEY

FEATURE_NAMES = ["mean_logprob", "min_logprob", "entropy_p90", "length", "margin"]
FINGERPRINT = "gguf-sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def saved_path(tmp_path_factory):
    rng = np.random.default_rng(0)
    features = rng.normal(size=(400, len(FEATURE_NAMES))).astype(np.float32)
    labels = rng.random(400) < 1.0 / (1.0 + np.exp(-features[:, 0]))
    path = tmp_path_factory.mktemp("probe") / "probe.onnx"
    ConfidenceProbe(FEATURE_NAMES, FINGERPRINT, ProbeConfig(num_steps=50)).fit(features, labels).save(path)
    return path


def test_mismatched_model_fingerprint_is_refused_naming_both(saved_path):
    other = "gguf-sha256:" + "cd" * 32
    with pytest.raises(ProbeModelMismatchError) as error:
        load_probe(saved_path, other)
    assert FINGERPRINT in str(error.value) and other in str(error.value)


def test_wrong_feature_count_at_predict_time_is_refused(saved_path):
    loaded = load_probe(saved_path, FINGERPRINT)
    with pytest.raises(ProbeFeatureMismatchError, match="expects 5 features"):
        loaded.predict(np.zeros((2, 4), dtype=np.float32))
    with pytest.raises(ProbeFeatureMismatchError):
        loaded.predict(np.zeros(6, dtype=np.float32))


def rewrite_metadata(source, target, edit) -> None:
    """Copy the probe at `source` to `target` with its metadata text passed through `edit`."""
    model = onnx.load(str(source))
    text = {prop.key: prop.value for prop in model.metadata_props}.get(METADATA_KEY)
    del model.metadata_props[:]
    new_text = edit(text)
    if new_text is not None:
        onnx.helper.set_model_props(model, {METADATA_KEY: new_text})
    onnx.save(model, str(target))


def edit_field(key, value):
    def edit(text):
        document = json.loads(text)
        document[key] = value
        return json.dumps(document)

    return edit


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda text: None, "no 'tandem.confidence_probe' metadata"),
        (lambda text: text[:-5], "not valid JSON"),
        (lambda text: "[1, 2]", "JSON object"),
        (edit_field("format_version", 99), "format_version 99"),
        (edit_field("feature_names", FEATURE_NAMES + ["extra"]), "does not fit its metadata"),
        (edit_field("feature_names", ["a", "a", "b", "c", "d"]), "distinct"),
        (edit_field("kind", "forest"), "kind"),
        (edit_field("calibrator", {"kind": "platt", "a": "high"}), "calibrator"),
        (
            lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "metrics"}),
            "lacks",
        ),
    ],
)
def test_tampered_or_missing_metadata_is_refused(saved_path, tmp_path, edit, message):
    rewrite_metadata(saved_path, tmp_path / "tampered.onnx", edit)
    with pytest.raises(ProbeFormatError, match=message):
        load_probe(tmp_path / "tampered.onnx", FINGERPRINT)


def test_a_file_that_is_not_onnx_is_refused(tmp_path):
    (tmp_path / "probe.onnx").write_bytes(b"definitely not protobuf")
    with pytest.raises(ProbeFormatError, match="not a loadable ONNX model"):
        load_probe(tmp_path / "probe.onnx", FINGERPRINT)
    with pytest.raises(FileNotFoundError):
        load_probe(tmp_path / "absent.onnx", FINGERPRINT)


def test_cuda_is_preferred_when_onnxruntime_offers_it(monkeypatch):
    import onnxruntime

    monkeypatch.setattr(
        onnxruntime,
        "get_available_providers",
        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"],
    )
    assert onnx_file.default_providers() == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert onnx_file.default_providers() == ["CPUExecutionProvider"]


@pytest.mark.parametrize(
    "config, labels, message",
    [
        (dict(kind="forest"), None, "kind"),
        (dict(calibration="beta"), None, "calibration"),
        (dict(holdout_fraction=0.0), None, "held-out"),
        (dict(), np.ones(40, dtype=bool), "both classes"),
        (dict(), np.r_[np.zeros(39), 1].astype(bool), "too few"),
    ],
)
def test_bad_training_setups_are_refused(config, labels, message):
    features = np.random.default_rng(0).normal(size=(40, len(FEATURE_NAMES))).astype(np.float32)
    with pytest.raises(ValueError, match=message):
        ConfidenceProbe(FEATURE_NAMES, FINGERPRINT, ProbeConfig(**config)).fit(features, labels)


def test_running_a_probe_needs_neither_torch_nor_onnx(saved_path):
    # The device tier ships numpy + onnxruntime only (DESIGN.md): loading must not pull more.
    script = (
        "import sys; from confidence.probe import load_probe; "
        f"probe = load_probe({str(saved_path)!r}, {FINGERPRINT!r}); probe.predict([0.0] * 5); "
        "print(sorted(m for m in ('torch', 'onnx') if m in sys.modules))"
    )
    repo_root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=repo_root)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
