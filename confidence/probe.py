"""The learned confidence probe: a small model over per-answer features (signals,
aggregates, hidden-state summaries) predicting P(the local answer is acceptable).

Training (torch, CPU, seeded: confidence.probe_training) and export (onnx:
confidence.probe_graph) are imported lazily: a device that only runs probes needs numpy
and onnxruntime (`load_probe`, re-exported here from confidence.probe_runtime along with
the errors and `model_fingerprint_for_gguf`).

Calibration: the calibrator is fitted on a held-out split to the probe's logit and
stored as JSON in the file's metadata, applied after the graph. Platt could be folded
into the graph, but keeping both kinds outside keeps one code path, keeps the graph
identical to the trained network, and lets a calibrator be refitted without re-export."""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass

import numpy as np

from confidence.auroc import auroc
from confidence.binary_inputs import as_binary_labels
from confidence.calibration import CALIBRATOR_CLASSES
from confidence.gguf_fingerprint import model_fingerprint_for_gguf
from confidence.probe_training import (
    forward_logits,
    preprocessing_from,
    stratified_split,
    train_layers,
)
from confidence.probe_runtime import (
    FORMAT_VERSION,
    METADATA_KEY,
    PROBE_KINDS,
    OnnxProbe,
    ProbeError,
    ProbeFeatureMismatchError,
    ProbeFormatError,
    ProbeModelMismatchError,
    load_probe,
    validate_probe_metadata,
)

__all__ = [
    "ConfidenceProbe",
    "ProbeConfig",
    "OnnxProbe",
    "load_probe",
    "model_fingerprint_for_gguf",
    "ProbeError",
    "ProbeFormatError",
    "ProbeModelMismatchError",
    "ProbeFeatureMismatchError",
]


@dataclass
class ProbeConfig:
    """How a probe is trained."""

    kind: str = "logistic"  # "logistic" or "mlp" (one hidden ReLU layer)
    hidden_units: int = 16  # width of the mlp's hidden layer
    num_steps: int = 300  # full-batch Adam steps
    learning_rate: float = 0.05
    weight_decay: float = 1e-3  # L2 on the weights (not biases), added to the mean log-loss;
    # 1e-4 let the mlp overfit 2,250 rows (AUROC -0.013 against the generating model)
    holdout_fraction: float = 0.25  # share of each class held out for calibration and AUROC
    calibration: str | None = "platt"  # "platt", "isotonic" or None
    seed: int = 0

    def __post_init__(self):
        if self.kind not in PROBE_KINDS:
            raise ValueError(f"kind must be one of {PROBE_KINDS}, got {self.kind!r}")
        if self.calibration is not None and self.calibration not in CALIBRATOR_CLASSES:
            raise ValueError(f"calibration must be None or one of {sorted(CALIBRATOR_CLASSES)}")
        if not 0.0 <= self.holdout_fraction < 0.9:
            raise ValueError(f"holdout_fraction must be in [0, 0.9), got {self.holdout_fraction}")
        if self.calibration is not None and self.holdout_fraction == 0.0:
            raise ValueError("a calibrator needs held-out data: set holdout_fraction > 0 or calibration=None")
        if min(self.hidden_units, self.num_steps) < 1 or self.learning_rate <= 0:
            raise ValueError("hidden_units and num_steps must be >= 1, learning_rate > 0")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")


class ConfidenceProbe:
    """Train with `fit`, check with `predict`, ship with `save` (one ONNX file)."""

    def __init__(self, feature_names: list[str], model_fingerprint: str, config: ProbeConfig | None = None):
        names = list(feature_names)
        if not names or len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
            raise ValueError("feature_names must be a non-empty list of distinct strings")
        if not (isinstance(model_fingerprint, str) and model_fingerprint):
            raise ValueError("model_fingerprint must name the local model (see model_fingerprint_for_gguf)")
        self.feature_names = names  # column order of every feature matrix
        self.model_fingerprint = model_fingerprint  # the local model whose signals these are
        self.config = config or ProbeConfig()
        self.preprocessing: dict[str, np.ndarray] | None = None  # set by fit
        self.layers: list[tuple[np.ndarray, np.ndarray]] = []  # (weight [in, out], bias [out])
        self.calibrator = None
        self.metrics: dict = {}
        self.trained_at: str | None = None

    def _as_features(self, features) -> np.ndarray:
        matrix = np.asarray(features, dtype=np.float32)
        if matrix.ndim != 2 or matrix.shape[1] != len(self.feature_names):
            raise ProbeFeatureMismatchError(
                f"expected features of shape [n, {len(self.feature_names)}] ({self.feature_names}), got {matrix.shape}"
            )
        return matrix

    def fit(self, features, labels) -> ConfidenceProbe:
        import torch

        matrix, label_array = self._as_features(features), as_binary_labels(labels)
        if label_array.size != matrix.shape[0] or label_array.all() or not label_array.any():
            raise ValueError(
                f"need one 0/1 label per row ({matrix.shape[0]} rows, {label_array.size} "
                "labels) and examples of both classes"
            )
        config, self.calibrator = self.config, None
        train_rows, holdout_rows = stratified_split(label_array, config.holdout_fraction, config.seed)
        self.preprocessing = preprocessing_from(matrix[train_rows].astype(np.float64))
        self.layers = train_layers(torch, matrix[train_rows], label_array[train_rows], self.preprocessing, config)
        self.metrics = {
            "heldout_auroc": None,
            "num_train": int(train_rows.size),
            "num_heldout": int(holdout_rows.size),
        }
        if holdout_rows.size:
            holdout_logits = self.predict_logit(matrix[holdout_rows]).astype(np.float64)
            self.metrics["heldout_auroc"] = auroc(holdout_logits, label_array[holdout_rows])
            if config.calibration is not None:
                self.calibrator = CALIBRATOR_CLASSES[config.calibration]().fit(
                    holdout_logits, label_array[holdout_rows]
                )
        self.trained_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        return self

    def predict_logit(self, features) -> np.ndarray:
        """Uncalibrated logits [n] from the trained network, computed with torch."""
        import torch

        if self.preprocessing is None:
            raise RuntimeError("ConfidenceProbe is not trained; call fit(features, labels) first")
        layers = [(torch.from_numpy(w), torch.from_numpy(b)) for w, b in self.layers]
        with torch.no_grad():
            logits = forward_logits(torch, self._as_features(features), self.preprocessing, layers)
        return logits.numpy()

    def predict(self, features) -> np.ndarray:
        """Calibrated P(acceptable) [n] (the uncalibrated sigmoid when there is no calibrator)."""
        logits = self.predict_logit(features).astype(np.float64)
        if self.calibrator is not None:
            return self.calibrator.predict(logits)
        return 1.0 / (1.0 + np.exp(-logits))

    def metadata(self) -> dict:
        """The JSON document stored in the saved file."""
        return {
            "format_version": FORMAT_VERSION,
            "kind": self.config.kind,
            "feature_names": self.feature_names,
            "model_fingerprint": self.model_fingerprint,
            "trained_at": self.trained_at,
            "calibrator": None if self.calibrator is None else self.calibrator.to_dict(),
            "metrics": self.metrics,
        }

    def to_onnx(self):
        """The probe as an onnx.ModelProto, metadata included."""
        from onnx import helper

        from confidence.probe_graph import build_probe_model

        if self.preprocessing is None:
            raise RuntimeError("ConfidenceProbe is not trained; call fit(features, labels) first")
        model = build_probe_model(self.preprocessing, self.layers)
        document = validate_probe_metadata(self.metadata())
        helper.set_model_props(model, {METADATA_KEY: json.dumps(document, allow_nan=False)})
        return model

    def save(self, path: str | os.PathLike) -> None:
        """Write the probe to `path` as one ONNX file (replaced atomically)."""
        path = os.fspath(path)
        partial_path = f"{path}.partial"
        with open(partial_path, "wb") as file:
            file.write(self.to_onnx().SerializeToString())
        os.replace(partial_path, path)  # a reader never sees a half-written probe
