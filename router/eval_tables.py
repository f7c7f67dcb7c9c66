"""Routing tables: per prompt, whether the weak (local) and the strong (cloud) tier answered
right, in RouteLLM's format (`../shared/data/routellm/`) or tandem's own.

Accepted as is: CSV or JSONL with a `prompt` column and either `weak_correct` /
`strong_correct` columns, or RouteLLM's two model-named columns (weak = Mixtral-8x7B,
strong = GPT-4 by default; name others with weak_column / strong_column). Booleans may be
True/False, true/false or 1/0. Extra columns (responses, subject) are kept in `extra`.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROUTELLM_WEAK = "mistralai/Mixtral-8x7B-Instruct-v0.1"
ROUTELLM_STRONG = "gpt-4-1106-preview"
# The shared data next to the repository (DESIGN.md); commands take --data-dir too.
DEFAULT_DATA_DIR = str(Path(__file__).resolve().parents[2] / "shared" / "data" / "routellm")
_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


class TableError(ValueError):
    """A table that cannot be read as a routing table; the message names the file and row."""


@dataclass(frozen=True)
class RoutingExample:
    prompt: str
    weak_correct: bool
    strong_correct: bool
    source: str  # the table it came from: "gsm8k", "mmlu_anatomy", or the file's stem
    extra: dict = field(default_factory=dict, compare=False)


def _bool(value, path, row_number: int, column: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise TableError(f"{path}: row {row_number}: column {column!r} must be a boolean, got {value!r}")


def _rows(path: Path) -> Iterable[dict]:
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    yield json.loads(line)
        return
    csv.field_size_limit(sys.maxsize)  # RouteLLM's CSVs hold whole model responses
    with open(path, newline="", encoding="utf-8") as handle:
        yield from csv.DictReader(handle)


def load_table(
    path: str | os.PathLike, source: str | None = None, weak_column: str | None = None, strong_column: str | None = None
) -> list[RoutingExample]:
    """One table file (.csv or .jsonl)."""
    path = Path(path)
    if not path.is_file():
        raise TableError(f"{path}: no such table")
    source = source or path.stem
    examples = []
    for number, row in enumerate(_rows(path), start=1):
        weak = weak_column or ("weak_correct" if "weak_correct" in row else ROUTELLM_WEAK)
        strong = strong_column or ("strong_correct" if "strong_correct" in row else ROUTELLM_STRONG)
        missing = [name for name in ("prompt", weak, strong) if name not in row]
        if missing:
            raise TableError(f"{path}: row {number} has no column(s) {missing}; columns: {sorted(row)}")
        extra = {k: v for k, v in row.items() if k not in ("prompt", weak, strong)}
        examples.append(
            RoutingExample(
                str(row["prompt"]),
                _bool(row[weak], path, number, weak),
                _bool(row[strong], path, number, strong),
                source,
                extra,
            )
        )
    return examples


def contaminated_prompts(data_dir: str | os.PathLike = DEFAULT_DATA_DIR) -> set[str]:
    """Evaluation prompts RouteLLM flagged as contaminated (near-duplicates of training data)."""
    prompts: set[str] = set()
    for name in ("gsm8k_contaminated_prompts.jsonl", "mmlu_contaminated_prompts.jsonl"):
        path = Path(data_dir) / name
        if path.is_file():
            prompts.update(str(row["eval_prompt"]) for row in _rows(path))
    return prompts


def load_routellm(
    data_dir: str | os.PathLike = DEFAULT_DATA_DIR,
    datasets: Sequence[str] = ("gsm8k", "mmlu"),
    drop_contaminated: bool = True,
) -> list[RoutingExample]:
    """RouteLLM's GSM8K table and its MMLU subject tables (source = "mmlu_<subject>")."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise TableError(f"{data_dir}: no RouteLLM data directory; pass --data-dir")
    examples: list[RoutingExample] = []
    for dataset in datasets:
        if dataset == "gsm8k":
            examples += load_table(data_dir / "gsm8k_responses.csv", source="gsm8k")
        elif dataset == "mmlu":
            for path in sorted((data_dir / "mmlu").glob("mmlu_*.csv")):
                examples += load_table(path)
        else:
            raise TableError(f"unknown dataset {dataset!r}; known: gsm8k, mmlu")
    if drop_contaminated:
        flagged = contaminated_prompts(data_dir)
        examples = [example for example in examples if example.prompt not in flagged]
    return examples
