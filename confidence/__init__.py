"""Confidence for routing: per-token signals from the engines' token events, sequence
aggregators over them, an incremental tracker the router reads during generation,
calibrators (Platt, isotonic), AUROC, and learned probes trained with torch
(`confidence.probe`), exported to ONNX and run with onnxruntime on the device
(`confidence.probe_runtime`, numpy + onnxruntime only).

This package's top level is numpy only (plus the stdlib-only engine protocol), so the
device tier can import it; the probe modules are imported explicitly.
"""

from confidence.aggregate import (
    DEFAULT_WINDOW,
    FEATURE_NAMES,
    QUANTILE_LEVELS,
    features_dict,
    quantile_of_sorted,
    sequence_features,
)
from confidence.auroc import auroc
from confidence.calibration import IsotonicCalibrator, PlattCalibrator, calibrator_from_dict
from confidence.running import RunningConfidence
from confidence.signals import SignalArrays, TokenSignals, signals_from_events, token_signals

__all__ = [
    "IsotonicCalibrator",
    "PlattCalibrator",
    "auroc",
    "calibrator_from_dict",
    "DEFAULT_WINDOW",
    "FEATURE_NAMES",
    "QUANTILE_LEVELS",
    "RunningConfidence",
    "SignalArrays",
    "TokenSignals",
    "features_dict",
    "quantile_of_sorted",
    "sequence_features",
    "signals_from_events",
    "token_signals",
]
