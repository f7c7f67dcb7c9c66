"""Per-model sampling defaults: what a tier uses for a sampling field the request left out.

A field a request does not send stays unset (None in `SamplingParams`) all the way down to
the engine that runs it (through gRPC and the OpenAI-HTTP cloud client too), and each tier
resolves it, first match wins:

1. the request;
2. the tier's configuration (`[local.sampling]` / `[cloud.sampling]`, `TANDEM_*_SAMPLING_*`, flags);
3. the model's own metadata: a GGUF's `general.sampling.*` keys (llama.cpp's), or the
   `generation_config.json` beside an HF checkpoint (as vLLM's `--generation-config auto`,
   which also ignores `do_sample`);
4. a built-in table for models we ship or know (SmolLM2-Instruct: its model card samples at
   temperature 0.2, top_p 0.9; at OpenAI's 1.0 the 135M model rambles);
5. OpenAI's defaults (temperature 1, top_p 1; top_k, min_p, penalties off).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from typing import Any

from sdk.protocol.engine import InvalidRequestError, SamplingParams
from sdk.engine_common.gguf_header import gguf_metadata
from sdk.protocol.sampling_params import TUNABLES, SamplingDefaults

# The fields a tier may default, as SamplingParams declares them (logit_bias and min_tokens are the request's alone).
SAMPLING_FIELDS = tuple(TUNABLES)
OPENAI_DEFAULTS: dict[str, float | int] = {name: knob.off for name, knob in TUNABLES.items()}
# Where the last resort comes from: OpenAI's API for its own fields, "off" for the extensions.
LAST_RESORT_SOURCES = {
    name: "OpenAI's default" if knob.openai else "off (no other default)" for name, knob in TUNABLES.items()
}

# (pattern over the model's file or directory name, values, where they come from)
BUILTIN_DEFAULTS: tuple[tuple[re.Pattern, dict[str, float | int], str], ...] = (
    (
        re.compile(r"^smollm2-[0-9.]+[mb]-instruct\b", re.IGNORECASE),
        {"temperature": 0.2, "top_p": 0.9},
        "built-in: the SmolLM2-Instruct model card",
    ),
)

GGUF_KEYS = {knob.gguf_key: name for name, knob in TUNABLES.items() if knob.gguf_key}
GENERATION_CONFIG = "generation_config.json"


# OpenAI's defaults and nothing else: for code that samples outside an engine (tests, offline tools).
OPENAI_SAMPLING = SamplingDefaults(dict(OPENAI_DEFAULTS), dict(LAST_RESORT_SOURCES))


def check_sampling_config(configured: Mapping[str, Any]) -> None:
    """ValueError naming what is wrong with a tier's configured sampling defaults."""
    unknown = sorted(set(configured) - set(SAMPLING_FIELDS))
    if unknown:
        raise ValueError(f"unknown sampling keys {unknown}; known: {', '.join(SAMPLING_FIELDS)}")
    try:
        SamplingParams(max_tokens=1, **{k: v for k, v in configured.items() if v is not None})
    except InvalidRequestError as exc:
        raise ValueError(f"sampling.{exc.param}: {exc}") from None


def resolve_sampling_defaults(
    configured: Mapping[str, Any] | None, model_source: str | None, source_label: str | Mapping[str, str] = "config"
) -> SamplingDefaults:
    """The defaults of a tier configured with `configured` (field -> value, None = unset) serving the
    model at `model_source` (a GGUF file or an HF directory; None: nothing known about the model).
    `source_label` names where the configured values came from (one label, or one per field)."""
    values: dict[str, float | int] = {}
    sources: dict[str, str] = {}

    def take(found: Mapping[str, Any], source: str | Mapping[str, str]) -> None:
        for name, value in found.items():
            if name in SAMPLING_FIELDS and value is not None and name not in values:
                values[name] = value
                sources[name] = source if isinstance(source, str) else source[name]

    take(configured or {}, source_label)
    if model_source is not None:
        found, where = model_sampling_metadata(model_source)
        take(found, where)
        for pattern, table, source in BUILTIN_DEFAULTS:
            if pattern.search(model_identity(model_source)):
                take(table, source)
                break
    take(OPENAI_DEFAULTS, LAST_RESORT_SOURCES)
    try:  # the engines' own checks, so a bad value from a model file is named before serving
        SamplingParams(max_tokens=1, **values)
    except InvalidRequestError as exc:
        raise ValueError(f"sampling defaults {values} (from {sources}) are invalid: {exc}") from None
    return SamplingDefaults(values, sources)


def model_identity(model_source: str) -> str:
    """The file or directory name the built-in table matches (quantization suffix kept)."""
    name = os.path.basename(os.path.normpath(model_source))
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


def model_sampling_metadata(model_source: str) -> tuple[dict[str, float | int], dict[str, str]]:
    """Sampling defaults the model itself declares, and the key each came from."""
    if os.path.isdir(model_source):
        return _generation_config(os.path.join(model_source, GENERATION_CONFIG))
    if model_source.lower().endswith(".gguf") and os.path.isfile(model_source):
        return _gguf_sampling(model_source)
    return {}, {}


def _gguf_sampling(path: str) -> tuple[dict[str, float | int], dict[str, str]]:
    values: dict[str, float | int] = {}
    sources: dict[str, str] = {}
    for key, raw in gguf_metadata(path, GGUF_KEYS).items():
        value = _normalized(GGUF_KEYS[key], raw)
        if value is not None:
            values[GGUF_KEYS[key]], sources[GGUF_KEYS[key]] = value, f"model: GGUF {key}"
    return values, sources


def _generation_config(path: str) -> tuple[dict[str, float | int], dict[str, str]]:
    if not os.path.isfile(path):
        return {}, {}
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    values: dict[str, float | int] = {}
    for name in (name for name, knob in TUNABLES.items() if knob.in_generation_config):
        value = _normalized(name, config.get(name))
        if value is not None:
            values[name] = value
    return values, {name: f"model: {GENERATION_CONFIG}" for name in values}


def _normalized(name: str, value: Any) -> float | int | None:
    """A metadata value in SamplingParams' terms; None for what is absent or not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if TUNABLES[name].type is int:
        return max(int(value), int(TUNABLES[name].low))  # top_k <= 0 disables it in llama.cpp and HF alike
    return float(value)
