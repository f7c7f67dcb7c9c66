"""Hugging Face model directories: config.json plus safetensors (single file or sharded)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from cloud_engine.model.config import ModelConfig
from cloud_engine.model.registry import get_architecture

SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"


class InvalidModelError(ValueError):
    """The path exists but does not hold a model tandem can load."""


@dataclass
class HFCheckpoint:
    """What a model directory says about its model, and where its tensors are."""

    model_dir: str
    hf_config: dict[str, Any]  # config.json as read
    config: ModelConfig
    weight_files: list[str]  # safetensors files, in load order
    generation_eos_ids: tuple[int, ...]  # generation_config.json eos_token_id (Llama 3 lists several)

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) pairs streamed from the safetensors files, one tensor in memory at a time."""
        from safetensors import safe_open

        for path in self.weight_files:
            with safe_open(path, framework="pt", device="cpu") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)


def read_hf_checkpoint(model_dir: str) -> HFCheckpoint:
    """Parse config.json and locate the safetensors files; raise InvalidModelError with a fix when absent."""
    config_path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(config_path):
        raise InvalidModelError(f"{model_dir} has no config.json; pass a Hugging Face model directory or a .gguf file")
    with open(config_path, encoding="utf-8") as f:
        hf_config = json.load(f)
    # The architecture first: an unsupported model should say so, not fail on a missing field.
    if hf_config.get("architectures"):
        get_architecture(hf_config["architectures"][0])
    return HFCheckpoint(
        model_dir=model_dir,
        hf_config=hf_config,
        config=ModelConfig.from_hf_config(hf_config),
        weight_files=_weight_files(model_dir),
        generation_eos_ids=_generation_eos_ids(model_dir),
    )


def _weight_files(model_dir: str) -> list[str]:
    index_path = os.path.join(model_dir, SHARD_INDEX)
    if os.path.isfile(index_path):
        with open(index_path, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map") or {}
        files = [os.path.join(model_dir, name) for name in dict.fromkeys(weight_map.values())]
        absent = [p for p in files if not os.path.isfile(p)]
        if not files or absent:
            raise InvalidModelError(f"{index_path} lists missing shards {absent[:3]}; the download is incomplete")
        return files
    single = os.path.join(model_dir, SINGLE_FILE)
    if os.path.isfile(single):
        return [single]
    if any(name.endswith(".bin") for name in os.listdir(model_dir)):
        raise InvalidModelError(
            f"{model_dir} holds PyTorch .bin weights only; convert them to safetensors "
            "(transformers: model.save_pretrained(dir, safe_serialization=True))"
        )
    raise InvalidModelError(f"{model_dir} has no {SINGLE_FILE} or {SHARD_INDEX}")


def _generation_eos_ids(model_dir: str) -> tuple[int, ...]:
    path = os.path.join(model_dir, "generation_config.json")
    if not os.path.isfile(path):
        return ()
    with open(path, encoding="utf-8") as f:
        eos = json.load(f).get("eos_token_id")
    if eos is None:
        return ()
    return (eos,) if isinstance(eos, int) else tuple(eos)
