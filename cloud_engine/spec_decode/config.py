"""Speculative decoding configuration: one validated dataclass and the CLI spelling."""

from __future__ import annotations

import os
from dataclasses import dataclass

METHODS = ("off", "ngram", "draft")


@dataclass
class SpeculativeConfig:
    """How the cloud engine drafts and how much; off by default (opt in per deployment)."""

    method: str = "off"  # off, ngram (prompt lookup) or draft (a smaller model, draft_model)
    draft_model: str | None = None  # HF directory or GGUF sharing the target's tokenizer
    draft_num_layers: int | None = None  # keep only the draft model's first N layers (a layer-skip draft)
    num_speculative_tokens: int = 8  # k: draft tokens per request per step, at most (the adaptive policy varies it)
    ngram_max: int = 4  # prompt lookup tries the last ngram_max tokens first ...
    ngram_min: int = 2  # ... down to ngram_min
    adaptive: bool = True  # lower k or skip drafting at large batch / low acceptance
    max_batch_for_speculation: int = 4  # adaptive: no drafting when more requests decode than this
    # adaptive: a request whose drafts keep fewer accepted tokens than this (smoothed) pauses
    # drafting and probes with 1 token every few steps. Tokens, not a rate: at batch 1 a 9-token
    # verification costs ~1.4x a 1-token step, so a long draft pays with ~0.5 tokens accepted,
    # while its acceptance *rate* is naturally low (a rate floor paused good copy runs).
    min_accepted_tokens: float = 0.5

    def __post_init__(self) -> None:
        checks = [
            (self.method in METHODS, f"speculative method must be one of {', '.join(METHODS)}, got {self.method!r}"),
            (
                self.method != "draft" or bool(self.draft_model),
                "speculative method draft needs a draft model (draft:PATH)",
            ),
            (
                self.draft_num_layers is None or self.draft_num_layers >= 1,
                f"draft_num_layers must be >= 1, got {self.draft_num_layers}",
            ),
            (
                1 <= self.num_speculative_tokens <= 16,
                f"num_speculative_tokens must be in [1, 16], got {self.num_speculative_tokens}",
            ),
            (
                1 <= self.ngram_min <= self.ngram_max,
                f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}",
            ),
            (
                self.max_batch_for_speculation >= 1,
                f"max_batch_for_speculation must be >= 1, got {self.max_batch_for_speculation}",
            ),
            (
                0.0 <= self.min_accepted_tokens <= 16,
                f"min_accepted_tokens must be in [0, 16], got {self.min_accepted_tokens}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        if self.method == "draft" and not os.path.exists(os.path.expanduser(self.draft_model)):
            raise ValueError(
                f"draft model not found: {self.draft_model} (expected a Hugging Face model directory or a .gguf file)"
            )

    @property
    def enabled(self) -> bool:
        return self.method != "off"


def parse_speculative(value: str, num_speculative_tokens: int | None = None, **overrides) -> SpeculativeConfig:
    """`off`, `ngram`, `draft:PATH` or `draft:PATH@LAYERS` (the draft model's first LAYERS layers)."""
    text = (value or "off").strip()
    extra = dict(overrides)
    if num_speculative_tokens is not None:
        extra["num_speculative_tokens"] = num_speculative_tokens
    if text in ("off", "ngram"):
        return SpeculativeConfig(method=text, **extra)
    if text.startswith("draft:"):
        path, _, layers = text[len("draft:") :].rpartition("@") if "@" in text else (text[len("draft:") :], "", "")
        if layers and not layers.isdigit():
            raise ValueError(f"--speculative draft:PATH@LAYERS needs an integer LAYERS, got {layers!r}")
        return SpeculativeConfig(
            method="draft", draft_model=path, draft_num_layers=int(layers) if layers else None, **extra
        )
    raise ValueError(f"--speculative must be off, ngram or draft:PATH, got {value!r}")
