"""Build a routing table by asking both tiers of a live `tandem serve` deployment.

For each prompt: the local answer (model "auto:0": threshold 0 never escalates, yet the
cascade's policies still run and report the confidence they would compare with the
threshold; model "local" skips them and reports none) and the cloud answer (model
"cloud"), both at temperature 0. Scoring, by the prompt's kind:
- "number" (GSM8K): the last number of the answer equals the gold number;
- "letter" (multiple choice): the first option letter A-D given equals the gold letter;
- no gold label (RouteLLM's MMLU CSVs carry none; free-form sets): the local answer is
  right iff it agrees with the cloud's (same number / letter / text), and the cloud counts
  as right, so the table measures agreement with the cloud, not accuracy.
"""

from __future__ import annotations

import asyncio
import csv
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

from router.eval_tables import DEFAULT_DATA_DIR, contaminated_prompts

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
_LETTER_PATTERNS = (
    re.compile(r"answer\s*(?:is)?\s*[:\-]?\s*\(?([A-D])\b", re.IGNORECASE),  # "The answer is (B)", "Answer: c"
    re.compile(r"^\s*\(?([A-D])(?:[\).:]|\s*$|\s*\n)"),  # the reply starts with the letter ("A lesion" does not)
    re.compile(r"\(([A-D])\)"),  # "(C)" anywhere
)
_INSTRUCTIONS = {
    "number": "Solve the problem. End with the final answer as a number on its own line.",
    "letter": "Answer with the letter (A, B, C or D) of the correct option.",
    "text": "Answer briefly.",
}


class LiveError(RuntimeError):
    """The deployment did not answer from the tier asked for, or the prompt set is unusable."""


@dataclass(frozen=True)
class LivePrompt:
    """One prompt to send to both tiers."""

    prompt: str
    gold: str | None  # the normalized gold answer (number or letter); None: agreement with the cloud
    kind: str  # "number", "letter" or "text"
    source: str


def last_number(text: str | None) -> str | None:
    """The last number in `text`, normalized ("1,000.50" -> "1000.5"); None if there is none."""
    matches = _NUMBER.findall(text or "")
    if not matches:
        return None
    try:
        return format(Decimal(matches[-1].replace(",", "")).normalize(), "f")
    except InvalidOperation:
        return None


def option_letter(text: str | None) -> str | None:
    """The option letter A-D an answer gives, or None."""
    for pattern in _LETTER_PATTERNS:
        match = pattern.search(text or "")
        if match:
            return match.group(1).upper()
    return None


def _normalized(text: str | None, kind: str) -> str | None:
    if kind == "number":
        return last_number(text)
    if kind == "letter":
        return option_letter(text)
    return " ".join((text or "").lower().split()) or None


def is_correct(answer: str | None, gold: str, kind: str) -> bool:
    """Exact match of the answer's number or letter with the (normalized) gold one."""
    return _normalized(answer, kind) == gold


def agrees(local_answer: str | None, cloud_answer: str | None, kind: str) -> bool:
    """The two answers give the same number / letter / text (nothing extracted never agrees)."""
    local = _normalized(local_answer, kind)
    return local is not None and local == _normalized(cloud_answer, kind)


def load_prompts(prompt_set: str, data_dir: str | None = None, limit: int | None = None) -> list[LivePrompt]:
    """ "gsm8k" (gold numbers), "mmlu" (no gold: agreement) or a .jsonl/.csv file with `prompt` and optionally
    `answer` and `kind`; the first `limit` prompts, prompts flagged as contaminated left out."""
    data_dir = Path(data_dir or DEFAULT_DATA_DIR)
    if prompt_set == "gsm8k":
        rows = _rows(data_dir / "gsm8k_test.jsonl")
        prompts = [
            LivePrompt(r["question"], last_number(r["answer"].split("####")[-1]), "number", "gsm8k") for r in rows
        ]
    elif prompt_set == "mmlu":
        prompts = [
            LivePrompt(r["prompt"], None, "letter", path.stem)
            for path in sorted((data_dir / "mmlu").glob("mmlu_*.csv"))
            for r in _rows(path)
        ]
    else:
        path = Path(prompt_set)
        prompts = [_file_prompt(r, path, n) for n, r in enumerate(_rows(path), start=1)]
    flagged = contaminated_prompts(data_dir) if data_dir.is_dir() else set()
    prompts = [p for p in prompts if p.prompt not in flagged][:limit]
    if not prompts:
        raise LiveError(f"{prompt_set}: no prompts to run")
    return prompts


def _file_prompt(row: dict, path: Path, number: int) -> LivePrompt:
    if "prompt" not in row:
        raise LiveError(f"{path}: row {number} has no `prompt` column")
    answer = str(row.get("answer") or "").strip() or None
    kind = row.get("kind") or (
        "letter"
        if answer and option_letter(answer) == answer.upper()
        else "number"
        if answer and last_number(answer)
        else "text"
    )
    if kind not in _INSTRUCTIONS:
        raise LiveError(f"{path}: row {number}: kind must be number, letter or text, got {kind!r}")
    return LivePrompt(str(row["prompt"]), _normalized(answer, kind) if answer else None, kind, path.stem)


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        raise LiveError(f"{path}: no such prompt file")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    csv.field_size_limit(sys.maxsize)
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


async def _ask(client, model: str, tier: str, item: LivePrompt, max_tokens: int) -> tuple[str, dict]:
    messages = [{"role": "system", "content": _INSTRUCTIONS[item.kind]}, {"role": "user", "content": item.prompt}]
    reply = await client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0)
    info = reply.tandem
    if info["tier"] != tier or info.get("degraded"):
        # A degraded cloud answered by the local tier must not be labelled as the strong tier's.
        raise LiveError(
            f"asked model {model!r} for the {tier} tier, got tier {info['tier']!r} "
            f"(degraded: {info.get('degraded_reason')}); is the cloud tier up?"
        )
    return reply.choices[0].message.content or "", info


def _row(item: LivePrompt, local: tuple[str, dict], cloud: tuple[str, dict]) -> dict:
    (local_text, local_info), (cloud_text, cloud_info) = local, cloud
    if item.gold is not None:
        weak, strong = is_correct(local_text, item.gold, item.kind), is_correct(cloud_text, item.gold, item.kind)
    else:
        weak, strong = agrees(local_text, cloud_text, item.kind), True
    row = {
        "prompt": item.prompt,
        "weak_correct": weak,
        "strong_correct": strong,
        "confidence": local_info.get("confidence"),
        "source": item.source,
        "label": "gold" if item.gold is not None else "agreement_with_cloud",
        "gold": item.gold,
        "local_answer": local_text,
        "cloud_answer": cloud_text,
    }
    for tier, info in (("local", local_info), ("cloud", cloud_info)):
        usage = info["cost"].get(tier, {})
        row |= {
            f"{tier}_prompt_tokens": usage.get("prompt_tokens", 0),
            f"{tier}_completion_tokens": usage.get("completion_tokens", 0),
            f"{tier}_cost_usd": info["cost"].get("total_cost_usd", 0.0),
        }
    return row


async def build_live_table(
    base_url: str,
    prompts: Sequence[LivePrompt],
    *,
    max_tokens: int = 256,
    concurrency: int = 4,
    api_key: str | None = None,
    on_done: Callable[[], None] | None = None,
) -> list[dict]:
    """One table row per prompt (in order), asking both tiers with at most `concurrency` prompts in flight."""
    from sdk.client.async_client import AsyncClient

    base_url = base_url.rstrip("/")  # `tandem serve`'s address, with or without /v1
    client = AsyncClient(base_url=base_url if base_url.endswith("/v1") else f"{base_url}/v1", api_key=api_key)
    gate = asyncio.Semaphore(concurrency)

    async def one(item: LivePrompt) -> dict:
        async with gate:
            local = await _ask(client, "auto:0", "local", item, max_tokens)
            cloud = await _ask(client, "cloud", "cloud", item, max_tokens)
        if on_done is not None:
            on_done()
        return _row(item, local, cloud)

    try:
        return list(await asyncio.gather(*(one(item) for item in prompts)))
    finally:
        await client.close()


def write_jsonl(rows: Sequence[dict], path: str | Path) -> None:
    """The table as JSONL, readable by router.eval_tables.load_table."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
