"""Model loading for the cloud engine: HF directories and GGUF files to a ready model and tokenizer."""

from cloud_engine.loader.hf import InvalidModelError
from cloud_engine.loader.load import LoadedModel, build_model, load_model
from cloud_engine.model.registry import UnsupportedArchitectureError
from sdk.engine_common.model_files import ModelNotFoundError

__all__ = [
    "InvalidModelError",
    "LoadedModel",
    "ModelNotFoundError",
    "UnsupportedArchitectureError",
    "build_model",
    "load_model",
]
