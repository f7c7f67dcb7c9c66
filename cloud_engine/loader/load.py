"""`load_model`: one call from a path (or the embedded default) to a ready model and tokenizer."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cloud_engine.loader.gguf import read_gguf_checkpoint
from cloud_engine.loader.gguf_cache import load_cached_checkpoint, storing_weights
from cloud_engine.loader.hf import InvalidModelError, read_hf_checkpoint
from cloud_engine.loader.tokenizer import (
    encode_prompt,
    end_of_generation_ids,
    load_gguf_tokenizer,
    load_hf_tokenizer,
    tokenizer_adds_bos,
)
from cloud_engine.model.config import ModelConfig
from cloud_engine.model.registry import get_architecture
from sdk.engine_common.model_files import DEFAULT_MODEL_NAME, ModelNotFoundError, default_model_path, model_name_for

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class LoadedModel:
    """A model ready for the runner, with everything needed to turn text into its tokens."""

    model: nn.Module  # forward(input_ids, positions, attn_metadata), compute_logits, bind_kv_caches
    config: ModelConfig
    tokenizer: Any  # a transformers tokenizer
    chat_template: str | None  # Jinja source (render with sdk.engine_common.chat_template.render_chat)
    name: str  # served model id
    eos_token_ids: set[int]  # any of these ends generation (eos plus end-of-turn specials)
    bos_token_id: int | None
    add_bos: bool  # prompts should start with BOS (encode() adds it when missing)
    bos_token: str | None = None  # BOS text, for templates that write {{ bos_token }}
    eos_token: str | None = None  # EOS text, for templates that write {{ eos_token }}
    source: str = ""  # the directory or file loaded

    def encode(self, text: str, parse_special: bool = False) -> list[int]:
        """Prompt ids for raw text (special-token text stays plain unless parse_special), BOS per add_bos."""
        return encode_prompt(self.tokenizer, text, self.add_bos, self.bos_token_id, parse_special=parse_special)

    def encode_chat(self, messages: Sequence[dict]) -> list[int]:
        """Prompt ids for chat messages rendered with the model's template, assistant turn opened."""
        from sdk.engine_common.chat_template import render_chat

        prompt = render_chat(self.chat_template, messages, self.bos_token or "", self.eos_token or "")
        return self.encode(prompt, parse_special=True)


def load_model(
    source: str | None = None, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LoadedModel:
    """Load an HF model directory, a .gguf file, or (source=None) the embedded SmolLM2-135M-Instruct GGUF."""
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {dtype} is not supported; use one of {', '.join(map(str, SUPPORTED_DTYPES))}")
    if source is None:
        return _load_gguf(default_model_path(), DEFAULT_MODEL_NAME, dtype, device)
    path = os.path.abspath(os.path.expanduser(source))
    if os.path.isdir(path):
        return _load_hf_dir(path, os.path.basename(os.path.normpath(path)), dtype, device)
    if os.path.isfile(path):
        return _load_gguf(path, model_name_for(path), dtype, device)
    raise ModelNotFoundError(f"model not found: {source} (expected a Hugging Face model directory or a .gguf file)")


def build_model(
    config: ModelConfig,
    weights: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> nn.Module:
    """The registered model class for config.architecture, with weights copied in, in eval mode without grads."""
    spec = get_architecture(config.architecture)
    with torch.device("meta"):  # no memory and no random init for weights about to be overwritten
        model = spec.model_class(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    with torch.no_grad():
        model.load_weights((spec.hf_name(name), tensor) for name, tensor in weights)
    return model.requires_grad_(False).eval()


def _load_hf_dir(model_dir: str, name: str, dtype: torch.dtype, device) -> LoadedModel:
    checkpoint = read_hf_checkpoint(model_dir)
    config = checkpoint.config
    tokenizer = load_hf_tokenizer(model_dir)
    model = build_model(config, checkpoint.weights(), dtype, device)
    bos_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else config.bos_token_id
    template = tokenizer.chat_template
    if isinstance(template, dict):  # several named templates: the default one serves chat
        template = template.get("default")
    return LoadedModel(
        model=model,
        config=config,
        tokenizer=tokenizer,
        chat_template=template,
        name=name,
        eos_token_ids=end_of_generation_ids(tokenizer, (*config.eos_token_ids, *checkpoint.generation_eos_ids), bos_id),
        bos_token_id=bos_id,
        add_bos=tokenizer_adds_bos(tokenizer),
        bos_token=tokenizer.bos_token,
        eos_token=tokenizer.eos_token,
        source=model_dir,
    )


def _load_gguf(path: str, name: str, dtype: torch.dtype, device) -> LoadedModel:
    # Parsing and dequantizing the file was most of the cloud tier's start; an unchanged file's
    # checkpoint comes from the cache (gguf_cache), and a first load fills it as the model loads.
    cached = load_cached_checkpoint(path)
    checkpoint = cached or read_gguf_checkpoint(path)
    config, metadata = checkpoint.config, checkpoint.metadata
    tokenizer = load_gguf_tokenizer(path)
    model = build_model(config, cached.weights() if cached else storing_weights(checkpoint), dtype, device)
    bos_id = config.bos_token_id
    # llama.cpp's rule: the file says; without a flag, SentencePiece vocabularies add BOS.
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", metadata.get("tokenizer.ggml.model") == "llama"))
    return LoadedModel(
        model=model,
        config=config,
        tokenizer=tokenizer,
        chat_template=metadata.get("tokenizer.chat_template"),
        name=name,
        eos_token_ids=end_of_generation_ids(tokenizer, config.eos_token_ids, bos_id),
        bos_token_id=bos_id,
        add_bos=add_bos and bos_id is not None,
        bos_token=tokenizer.convert_ids_to_tokens(bos_id) if bos_id is not None else None,
        eos_token=tokenizer.convert_ids_to_tokens(config.eos_token_ids[0]) if config.eos_token_ids else None,
        source=path,
    )


__all__ = ["LoadedModel", "load_model", "build_model", "InvalidModelError", "ModelNotFoundError"]
