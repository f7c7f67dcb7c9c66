"""Where and how big the cloud engine runs: the device and dtype a config names ("auto" resolved),
and the context limit the model, the KV pool and the config together allow."""

from __future__ import annotations

import torch

from cloud_engine.config import CloudEngineConfig
from cloud_engine.cpu_features import has_native_bf16
from cloud_engine.kv_cache import KVCacheBudgetError

# The default context limit when the model's own is larger.
DEFAULT_MAX_MODEL_LEN = 8192
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but CUDA is not available; use --device cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" or has_native_bf16() else torch.float32
    return _DTYPES[name]


def resolve_max_model_len(config: CloudEngineConfig, mc, num_blocks: int) -> int:
    """The context limit: the configured one, else the smallest of the model's positions, the KV pool and
    DEFAULT_MAX_MODEL_LEN; ValueError/KVCacheBudgetError when the configuration cannot hold it."""
    pool_tokens = num_blocks * config.block_size
    max_model_len = config.max_model_len or min(mc.max_position_embeddings, pool_tokens, DEFAULT_MAX_MODEL_LEN)
    if mc.sliding_window and not mc.local_layers and max_model_len > mc.sliding_window:
        # This family's window is not enforced (attention is full); past it the model would see more than it was
        # trained to. Families whose local layers attend within the window (Gemma 3) take any length.
        if config.max_model_len:
            raise ValueError(f"max_model_len {max_model_len} exceeds the model's sliding window {mc.sliding_window}")
        max_model_len = mc.sliding_window
    if max_model_len > pool_tokens:
        raise KVCacheBudgetError(
            f"the KV cache holds {pool_tokens} tokens ({num_blocks} blocks of {config.block_size}), less than "
            f"max_model_len={max_model_len}; raise --kv-cache-gb or lower --max-model-len"
        )
    if max_model_len > mc.max_position_embeddings:
        raise ValueError(f"max_model_len {max_model_len} exceeds the model's {mc.max_position_embeddings} positions")
    if not config.enable_chunked_prefill and config.max_num_batched_tokens < max_model_len:
        raise ValueError(
            f"without chunked prefill a whole prompt must fit one step: max_num_batched_tokens "
            f"({config.max_num_batched_tokens}) must be >= max_model_len ({max_model_len})"
        )
    return max_model_len
