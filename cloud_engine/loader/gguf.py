"""GGUF files: metadata to ModelConfig, tensors dequantized to float and renamed to HF names.

llama.cpp's converter stores Q and K rows of Llama-type models with each head's two
rotary halves interleaved (its "normal" rope pairs neighbouring dimensions); our model
uses HF's rotate-half layout, so those rows are permuted back here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cloud_engine.loader.hf import InvalidModelError
from cloud_engine.model.config import ModelConfig
from cloud_engine.model.registry import ArchitectureSpec, get_architecture, gguf_to_hf_name

GGUF_MAGIC = b"GGUF"
ROPE_FREQS_TENSOR = "rope_freqs.weight"  # Llama 3.x rope scaling, stored as per-frequency divisors
# Big tokenizer arrays the config never needs; the tokenizer reads them itself.
SKIPPED_METADATA = (
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.scores",
)


@dataclass
class GGUFCheckpoint:
    """A parsed GGUF file: its config, metadata and a reader for its tensors."""

    path: str
    metadata: dict[str, Any]  # key -> Python value (big tokenizer arrays left out)
    config: ModelConfig
    spec: ArchitectureSpec
    reader: Any  # gguf.GGUFReader (memory-maps the file)
    # What the config was derived from besides the metadata (gguf_cache rebuilds it from these).
    tensor_names: list[str]
    rope_freq_factors: list[float] | None

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, float32 tensor) pairs, dequantized one at a time, rope rows restored to HF layout
        and norms unshifted where the architecture's converter shifts them."""
        for tensor, hf_name in self._mapped_tensors():
            weight = _dequantize(tensor)
            if self.spec.gguf_rope_interleaved:
                weight = self._restore_rope_layout(hf_name, weight)
            if self.spec.gguf_norm_shift and hf_name.endswith("norm.weight"):
                weight = weight - self.spec.gguf_norm_shift
            yield hf_name, weight

    def weight_plan(self) -> list[tuple[str, list[int]]]:
        """(HF name, shape) of every tensor weights() yields, in its order, without dequantizing any."""
        return [(hf_name, _hf_shape(tensor)) for tensor, hf_name in self._mapped_tensors()]

    def _mapped_tensors(self) -> Iterator[tuple[Any, str]]:
        for tensor in self.reader.tensors:
            if tensor.name == ROPE_FREQS_TENSOR:  # already folded into config.rope_scaling
                continue
            hf_name = gguf_to_hf_name(tensor.name, self.spec)
            if hf_name is None:
                raise InvalidModelError(
                    f"GGUF tensor {tensor.name!r} has no mapping for architecture {self.config.architecture!r}; "
                    "the file may be for a variant tandem does not support"
                )
            yield tensor, hf_name

    def _restore_rope_layout(self, hf_name: str, weight: torch.Tensor) -> torch.Tensor:
        if ".self_attn.q_proj." in hf_name:
            return unpermute_rope_rows(weight, self.config.num_attention_heads)
        if ".self_attn.k_proj." in hf_name:
            return unpermute_rope_rows(weight, self.config.num_key_value_heads)
        return weight


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's per-head interleaving of rotary halves (rows or a bias vector).

    The converter maps HF row (head h, half j, index i) to GGUF row (h, i, j); this maps back.
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape).contiguous()


def read_gguf_checkpoint(path: str) -> GGUFCheckpoint:
    """Open a GGUF file and derive its ModelConfig; raise InvalidModelError for non-GGUF or unusable files."""
    import gguf

    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise InvalidModelError(
                f"{path} is not a GGUF file (bad magic); pass a .gguf model or an HF model directory"
            )
    reader = gguf.GGUFReader(path)
    metadata = {key: field.contents() for key, field in reader.fields.items() if key not in SKIPPED_METADATA}
    tensors = {t.name: t for t in reader.tensors}
    arch = metadata.get("general.architecture")
    if not arch:
        raise InvalidModelError(f"{path} has no general.architecture; it is not a model GGUF")
    spec = get_architecture(arch)
    if not metadata.get(f"{arch}.vocab_size") and "token_embd.weight" in tensors:
        # Older converters leave vocab_size out; the embedding's rows are the vocabulary.
        metadata[f"{arch}.vocab_size"] = int(tensors["token_embd.weight"].shape[-1])
    rope_freqs = tensors.get(ROPE_FREQS_TENSOR)
    factors = _dequantize(rope_freqs).tolist() if rope_freqs is not None else None
    config = ModelConfig.from_gguf(metadata, tensor_names=tensors.keys(), rope_freq_factors=factors)
    return GGUFCheckpoint(
        path=path,
        metadata=metadata,
        config=config,
        spec=spec,
        reader=reader,
        tensor_names=list(tensors),
        rope_freq_factors=factors,
    )


def _hf_shape(tensor) -> list[int]:
    """GGUF lists dims innermost first; reversed they are HF's [out_features, in_features]."""
    return [int(d) for d in reversed(tensor.shape)]


def _dequantize(tensor) -> torch.Tensor:
    from gguf.quants import dequantize

    array = dequantize(tensor.data, tensor.tensor_type).reshape(_hf_shape(tensor))
    return torch.from_numpy(np.array(array, dtype=np.float32, copy=True))  # off the read-only memory map
