"""Loading and running a saved confidence probe with onnxruntime (numpy + onnxruntime
only: this is the part that ships to the device; training lives in confidence.probe).

A saved probe is one ONNX file. Its metadata_props hold, under METADATA_KEY, a JSON
document: {format_version, kind, feature_names, model_fingerprint, trained_at,
calibrator, metrics}. The graph outputs the uncalibrated logit and probability; the
calibrator (JSON) is applied here, after the graph, to the logit."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import onnxruntime

from confidence.calibration import calibrator_from_dict
from confidence.onnx_file import (
    OnnxFileFormat,
    check_document_header,
    open_session,
    read_metadata_document,
)

METADATA_KEY = "tandem.confidence_probe"
FORMAT_VERSION = 1
PROBE_KINDS = ("logistic", "mlp")
REQUIRED_METADATA_KEYS = (
    "kind",
    "feature_names",
    "model_fingerprint",
    "trained_at",
    "calibrator",
    "metrics",
)
INPUT_NAME, LOGIT_OUTPUT, PROBABILITY_OUTPUT = "features", "logit", "probability"


class ProbeError(ValueError):
    """A probe file or a probe input that cannot be used."""


class ProbeFormatError(ProbeError):
    """The file is not a probe this version of tandem can read."""


class ProbeModelMismatchError(ProbeError):
    """The probe was trained on another local model's signals than the one in use."""


class ProbeFeatureMismatchError(ProbeError):
    """The features given do not match the ones the probe was trained on."""


PROBE_FILE = OnnxFileFormat(
    noun="probe",
    description="a tandem probe",
    metadata_key=METADATA_KEY,
    format_version=FORMAT_VERSION,
    version_note="",
    retrain_hint="retrain the probe with this version",
    required_keys=REQUIRED_METADATA_KEYS,
    format_error=ProbeFormatError,
)


def validate_probe_metadata(document) -> dict:
    """`document` (parsed JSON) checked field by field; raises ProbeFormatError."""
    check_document_header(document, PROBE_FILE)
    if document["kind"] not in PROBE_KINDS:
        raise ProbeFormatError(f"probe kind {document['kind']!r} unknown; known: {PROBE_KINDS}")
    names = document["feature_names"]
    if not (
        isinstance(names, list)
        and names
        and all(isinstance(n, str) and n for n in names)
        and len(set(names)) == len(names)
    ):
        raise ProbeFormatError("probe feature_names must be a non-empty list of distinct names")
    for key in ("model_fingerprint", "trained_at"):
        if not (isinstance(document[key], str) and document[key]):
            raise ProbeFormatError(f"probe {key} must be a non-empty string")
    if not isinstance(document["metrics"], dict):
        raise ProbeFormatError("probe metrics must be a JSON object")
    if document["calibrator"] is not None:
        try:
            calibrator_from_dict(document["calibrator"])
        except ValueError as exc:
            raise ProbeFormatError(f"probe calibrator is invalid: {exc}") from exc
    return document


class OnnxProbe:
    """A loaded probe: `predict(features)` -> calibrated P(local answer acceptable)."""

    def __init__(self, session: onnxruntime.InferenceSession, metadata: dict, path: str):
        self.session = session
        self.path = path  # the file it came from, for messages
        self.kind: str = metadata["kind"]
        self.feature_names: tuple[str, ...] = tuple(metadata["feature_names"])
        self.model_fingerprint: str = metadata["model_fingerprint"]
        self.trained_at: str = metadata["trained_at"]
        self.metrics: dict = metadata["metrics"]  # held-out AUROC and split sizes
        self.calibrator = None if metadata["calibrator"] is None else calibrator_from_dict(metadata["calibrator"])
        self.provider: str = session.get_providers()[0]  # the execution provider in use

    @property
    def num_features(self) -> int:
        return len(self.feature_names)

    def _as_matrix(self, features) -> np.ndarray:
        matrix = np.asarray(features, dtype=np.float32)
        if matrix.ndim == 1:
            matrix = matrix[None, :]
        if matrix.ndim != 2 or matrix.shape[1] != self.num_features:
            raise ProbeFeatureMismatchError(
                f"probe {self.path} expects {self.num_features} features per row "
                f"{list(self.feature_names)}, got shape {np.shape(features)}"
            )
        return np.ascontiguousarray(matrix)

    def predict_logit(self, features) -> np.ndarray:
        """Uncalibrated logits, shape [n] (a [d] vector counts as one row)."""
        return self.session.run([LOGIT_OUTPUT], {INPUT_NAME: self._as_matrix(features)})[0]

    def predict(self, features):
        """P(acceptable) per row: shape [n] for [n, d] input, a float for one [d] vector.
        NaN features mean "missing" and are imputed inside the graph."""
        logits, probabilities = self.session.run(
            [LOGIT_OUTPUT, PROBABILITY_OUTPUT], {INPUT_NAME: self._as_matrix(features)}
        )
        if self.calibrator is not None:
            probabilities = self.calibrator.predict(logits.astype(np.float64))
        probabilities = np.asarray(probabilities, dtype=np.float64)
        return float(probabilities[0]) if np.ndim(features) == 1 else probabilities

    def score_features(self, values: Mapping[str, float]) -> float:
        """P(acceptable) of one answer described by its features by name (RunningConfidence.features_dict())."""
        return float(self.predict(self.features_from_mapping(dict(values))))

    def features_from_mapping(self, values: dict[str, float]) -> np.ndarray:
        """A [d] row in this probe's feature order; names it lacks become NaN (imputed),
        names it does not use are ignored."""
        return np.array([values.get(name, np.nan) for name in self.feature_names], dtype=np.float32)


def load_probe(path: str | os.PathLike, model_fingerprint: str, providers: list[str] | None = None) -> OnnxProbe:
    """The probe saved at `path`, refused unless it was trained for `model_fingerprint`."""
    path = os.fspath(path)
    # A few hundred multiply-adds per row: threads only add overhead, and the local LLM
    # beside the probe wants every core.
    session = open_session(path, PROBE_FILE, providers, threads=1)
    metadata = validate_probe_metadata(read_metadata_document(session, path, PROBE_FILE))
    if metadata["model_fingerprint"] != model_fingerprint:
        raise ProbeModelMismatchError(
            f"probe {path} was trained for model {metadata['model_fingerprint']!r}, but the "
            f"model in use is {model_fingerprint!r}; train a probe for this model or load "
            "the model the probe was trained on"
        )
    graph_inputs = session.get_inputs()
    graph_outputs = {output.name for output in session.get_outputs()}
    if (
        len(graph_inputs) != 1
        or graph_inputs[0].name != INPUT_NAME
        or graph_inputs[0].shape[-1] != len(metadata["feature_names"])
        or not {LOGIT_OUTPUT, PROBABILITY_OUTPUT} <= graph_outputs
    ):
        raise ProbeFormatError(
            f"{path}: graph takes {[(i.name, i.shape) for i in graph_inputs]} and gives "
            f"{sorted(graph_outputs)}, which does not fit its metadata "
            f"({len(metadata['feature_names'])} features)"
        )
    return OnnxProbe(session, metadata, path)
