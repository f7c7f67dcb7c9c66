"""MiniLM embeddings outside a router's graph: `Embedder` for the traffic record (which
embeds recorded prompts off the request path, so a router can later learn topic
directions from them), and cached matrices of many prompts for training and benchmarks.

Every prompt is embedded with the cached MiniLM export (the same graph a router with a
traffic memory runs, so training and serving see identical embeddings) and the matrix is
cached as .npy under the cache directory, keyed by the prompts and the embedder: 11k
prompts take minutes on 2 cores.
"""

from __future__ import annotations

import hashlib

import numpy as np

from router.prompt_router.embedder_export import (
    DEFAULT_PRECISION,
    EMBEDDING_OUTPUT,
    EXPORT_VERSION,
    cache_dir,
    check_precision,
    ensure_embedder,
    model_fingerprint,
)
from router.prompt_router.scorer import MAX_TOKENS, batch_size_for, load_tokenizer, open_session, run_batched


class Embedder:
    """The cached MiniLM export of `precision` (exported on first use: needs torch and
    transformers once per machine); `embedder(texts)` -> [n, 384] float32, one prompt per run
    for int8 (a batch would change each prompt's vector, see scorer.batch_size_for)."""

    def __init__(self, precision: str = DEFAULT_PRECISION, threads: int | None = 1):
        self.precision = check_precision(precision)
        self.session = open_session(ensure_embedder(precision=precision), threads=threads)
        self.tokenizer = load_tokenizer(MAX_TOKENS)
        self.fingerprint = f"{model_fingerprint()}|{precision}"  # what a stored vector was made with

    def __call__(self, texts: list[str], progress=None) -> np.ndarray:
        def run_one(rows, inputs):
            if progress is not None:
                progress(len(rows))
            return self.session.run([EMBEDDING_OUTPUT], inputs)[0]

        rows = run_batched(self.tokenizer, list(texts), run_one, batch_size_for(self.precision))
        return np.asarray(rows, np.float32).reshape(len(texts), -1)


def embed_prompts(
    prompts: list[str], threads: int | None = None, progress=None, precision: str = DEFAULT_PRECISION
) -> np.ndarray:
    """[n, 384] float32 embeddings from the cached export (threads None: all cores)."""
    return Embedder(precision, threads)(prompts, progress)


def cached_embeddings(prompts: list[str], progress=None, precision: str = DEFAULT_PRECISION) -> np.ndarray:
    """embed_prompts, computed once per (prompts, embedder) and kept as .npy."""
    check_precision(precision)
    key = f"{model_fingerprint()}|{EXPORT_VERSION}|{MAX_TOKENS}" + (
        "" if precision == "fp32" else f"|{precision}-single"
    )
    digest = hashlib.sha256(key.encode())
    for prompt in prompts:
        digest.update(prompt.encode("utf-8", "surrogatepass") + b"\x00")
    path = cache_dir() / f"embeddings-{digest.hexdigest()[:16]}.npy"
    if path.is_file():
        return np.load(path)
    matrix = embed_prompts(prompts, progress=progress, precision=precision)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial.npy")
    np.save(partial, matrix)
    partial.replace(path)
    return matrix
