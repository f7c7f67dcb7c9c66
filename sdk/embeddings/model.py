"""all-MiniLM-L6-v2 for apps: `EmbeddingModel().embed(texts)` -> unit vectors [n, 384].

The fp32 ONNX export (router.prompt_router.embedder_export: mean pooling and L2
normalization in the graph, parity with PyTorch within 1e-4), not the router's int8 one:
dynamic quantization picks one activation scale per batch, so an int8 vector would depend
on what it was batched with; fp32 vectors agree batched or alone (tested to 1e-5). Texts
are sorted by length and run in batches of at most TOKEN_BUDGET padded tokens (and MAX_BATCH
texts): attention costs grow with the square of the padded length, so a long text's padding
must not be paid by 31 short ones.

The window is 256 tokens ([CLS] and [SEP] included), sentence-transformers' max_seq_length
for this model: a longer text is refused naming its index, unless the caller asks to
truncate (then, as sentence-transformers does, the first 255 tokens and [SEP] are kept).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from router.prompt_router.embedder_export import EMBEDDING_OUTPUT, ensure_embedder, package_model_dir
from router.prompt_router.scorer import _encode, open_session
from sdk.protocol.engine import InvalidRequestError
from sdk.protocol.openai_schema.embeddings import EMBEDDING_MODEL_ID as MODEL_ID
from sdk.protocol.openai_schema.embeddings import EMBEDDING_WINDOW as WINDOW

MAX_BATCH = 64  # texts in one onnxruntime run
TOKEN_BUDGET = 2048  # padded tokens in one run: texts of similar length go together, so little is padding


@dataclass(frozen=True)
class Embeddings:
    vectors: np.ndarray  # [n, 384] float32, unit length
    num_tokens: list[int]  # per text, as embedded (after truncation)


class EmbeddingModel:
    """Loaded once per process (the export is made on first use: ~20 s, needs torch once)."""

    def __init__(self, threads: int | None = None):
        from tokenizers import Tokenizer

        self.session = open_session(ensure_embedder(precision="fp32"), threads=threads)
        self.tokenizer = Tokenizer.from_file(str(package_model_dir() / "tokenizer.json"))
        self.tokenizer.no_truncation()  # counted whole, to refuse what does not fit
        self.tokenizer.no_padding()
        self.truncating = Tokenizer.from_file(str(package_model_dir() / "tokenizer.json"))
        self.truncating.enable_truncation(max_length=WINDOW)
        self.truncating.no_padding()
        self._lock = threading.Lock()  # one run at a time: onnxruntime already uses the cores it was given

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(encoding.ids) for encoding in self.tokenizer.encode_batch(list(texts))]

    def embed(self, texts: list[str], truncate: bool = False) -> Embeddings:
        """InvalidRequestError (param `input[i]`) for an empty text, or one over the window without `truncate`."""
        texts = list(texts)
        for index, text in enumerate(texts):
            if not isinstance(text, str) or not text:
                raise InvalidRequestError(f"input[{index}] must be a non-empty string", f"input[{index}]")
        counts = self.count_tokens(texts)
        if not truncate:
            for index, count in enumerate(counts):
                if count > WINDOW:
                    raise InvalidRequestError(
                        f"input[{index}] is {count} tokens; {MODEL_ID} reads at most {WINDOW} (its window, "
                        '[CLS] and [SEP] included): shorten it, or send "truncate": true to embed its first tokens',
                        f"input[{index}]",
                    )
        counts = [min(count, WINDOW) for count in counts]
        vectors = np.zeros((len(texts), 384), np.float32)
        with self._lock:
            for rows in batches(counts):
                inputs = _encode(self.truncating, [texts[i] for i in rows])
                vectors[rows] = self.session.run([EMBEDDING_OUTPUT], inputs)[0]
        return Embeddings(vectors, counts)


def batches(counts: list[int], token_budget: int = TOKEN_BUDGET, max_batch: int = MAX_BATCH) -> list[list[int]]:
    """Indices of `counts` (token lengths) grouped shortest first: a group pads to at most
    `token_budget` tokens, and its longest text is at most a quarter (plus 8 tokens) longer than
    its shortest, so padding stays a small share of what runs."""
    groups: list[list[int]] = []
    for index in np.argsort(counts, kind="stable").tolist():
        group = groups[-1] if groups else None
        # sorted ascending: this text is the group's longest, so the group would pad to its length
        if (
            group is None
            or len(group) >= max_batch
            or (len(group) + 1) * counts[index] > token_budget
            or counts[index] > 1.25 * counts[group[0]] + 8
        ):
            groups.append([index])
        else:
            group.append(index)
    return groups
