"""What `tandem eval` and `tandem calibrate` read: a routing table and a router's scores.

Score direction (one convention, the cascade's): a router either gives a confidence in the
local tier c (higher = local more sure: `--higher-means local`, e.g. `tandem.confidence`)
or a strong-need score s (higher = cloud: `--higher-means cloud`, e.g. `tandem router
score`). They are the same signal through c = 1 - s, exactly as PromptRouterPolicy compares
a prompt score with the threshold. A missing value (empty, NaN) counts as not confident and
escalates, like `should_escalate` with a NaN confidence.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from router.eval_tables import (
    DEFAULT_DATA_DIR,
    RoutingExample,
    TableError,
    contaminated_prompts,
    load_routellm,
    load_table,
)
from router.evaluation.metrics import Outcomes, oracle_scores

ROUTER_FORMS = "random, oracle, column:NAME (a column of the table) or scores:FILE.csv (prompt,score)"


@dataclass(frozen=True)
class LoadedTable:
    """The prompts to evaluate, and what was left out."""

    examples: list[RoutingExample]
    num_dropped_contaminated: int
    sources: list[str]  # where the rows came from: files, or "routellm:<dataset>"


@dataclass(frozen=True)
class RouterScores:
    """One router's signal per prompt, in both directions (module docstring)."""

    name: str
    strong_need: np.ndarray  # higher = cloud; missing values are +inf
    confidence: np.ndarray | None  # 1 - strong_need, what the threshold is compared with; None for random/oracle
    # What the router's own scores favour: "local" (a confidence), "cloud" (the prompt router's).
    higher_means: str | None = None


def load_examples(data: str, data_dir: str | None = None, datasets: Sequence[str] = ("gsm8k", "mmlu")) -> LoadedTable:
    """`data` is a table file or "routellm"; prompts RouteLLM flagged as contaminated are dropped."""
    data_dir = data_dir or DEFAULT_DATA_DIR
    if data == "routellm":
        examples = load_routellm(data_dir, datasets, drop_contaminated=False)
        sources = [f"routellm:{name}" for name in datasets]
    else:
        examples, sources = load_table(data), [str(Path(data).resolve())]
    flagged = contaminated_prompts(data_dir) if Path(data_dir).is_dir() else set()
    kept = [example for example in examples if example.prompt not in flagged]
    if not kept:
        raise TableError(f"{data}: no prompts left to evaluate ({len(examples)} read, all flagged as contaminated)")
    return LoadedTable(kept, len(examples) - len(kept), sources)


def router_scores(router: str, examples: Sequence[RoutingExample], higher_means: str | None = None) -> RouterScores:
    """The scores of `router` (ROUTER_FORMS) for these prompts; `higher_means` is "local" or "cloud",
    by default "local" for a column (confidences) and "cloud" for a scores file (the prompt router)."""
    kind, _, arg = router.partition(":")
    if kind in ("random", "oracle") and not arg:
        # random has no scores: metrics.random_curve averages over seeds instead.
        strong_need = oracle_scores(Outcomes.of(examples)) if kind == "oracle" else np.zeros(len(examples))
        return RouterScores(kind, strong_need, None)
    if kind == "column" and arg:
        if all(arg not in example.extra for example in examples):
            raise TableError(
                f"the table has no column {arg!r}; columns besides the labels: {sorted(examples[0].extra)}"
            )
        values = [_number(example.extra.get(arg), f"column {arg!r}") for example in examples]
        direction = higher_means or "local"
    elif kind == "scores" and arg:
        by_prompt = _read_scores(Path(arg))
        missing = [example.prompt for example in examples if example.prompt not in by_prompt]
        if missing:
            raise TableError(f"{arg}: no score for {len(missing)} of {len(examples)} prompts, e.g. {missing[0][:80]!r}")
        values = [by_prompt[example.prompt] for example in examples]
        direction = higher_means or "cloud"
    else:
        raise ValueError(f"unknown router {router!r}; use {ROUTER_FORMS}")
    if direction not in ("local", "cloud"):
        raise ValueError(f"higher_means must be 'local' or 'cloud', got {direction!r}")
    raw = np.array(values, dtype=float)
    confidence = raw if direction == "local" else 1.0 - raw
    confidence = np.where(np.isnan(confidence), -np.inf, confidence)
    return RouterScores(router, 1.0 - confidence, confidence, direction)


def _number(value, what: str) -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        return float("nan")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TableError(f"{what}: {value!r} is not a number") from None


def _read_scores(path: Path) -> dict[str, float]:
    """A `prompt,score` CSV, as `tandem router score` writes it."""
    if not path.is_file():
        raise TableError(f"{path}: no such scores file")
    csv.field_size_limit(sys.maxsize)
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if not {"prompt", "score"} <= set(reader.fieldnames or ()):
            raise TableError(f"{path}: a scores file needs columns prompt,score; got {reader.fieldnames}")
        return {row["prompt"]: _number(row["score"], f"{path}: score") for row in reader}
