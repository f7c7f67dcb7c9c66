"""Judges of shadow samples: how right the local and the cloud answer to one prompt were.

- ExactMatchJudge, for checkable tasks (arithmetic, multiple choice, short facts): each
  answer's final answer (the last number, else a lone choice letter, else the normalized
  last line) is compared; the cloud's is the reference, so the local tier is labelled right
  or wrong and the cloud tier is not labelled (a reference cannot grade itself).
- OpenAIJudge: an OpenAI-compatible chat endpoint (a larger model) grades both answers 0-10
  as JSON; which answer comes first is random per call (judges favour a position).
The embedded 135M model is not a judge: it cannot tell right from wrong reliably.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Protocol

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_CHOICE = re.compile(r"(?:^|[^A-Za-z])\(?([A-D])\)?(?:[.):]|\s*$)")


@dataclass(frozen=True)
class Judgment:
    weak: float | None  # how right the local answer was, in [0, 1]; None: not judged
    strong: float | None  # the cloud answer, likewise
    detail: str  # the judge, for the record


def final_answer(text: str) -> str:
    """What an answer settles on: its last number, else a lone choice letter, else its last line."""
    numbers = _NUMBER.findall(text)
    if numbers:
        value = numbers[-1].replace(",", "")
        return value.rstrip("0").rstrip(".") if "." in value else value
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    choice = _CHOICE.search(last)
    if choice:
        return choice.group(1)
    return re.sub(r"[\W_]+", " ", last).strip().lower()


class Judge(Protocol):
    """What the shadow sampler needs of a judge (sdk.traffic.shadow)."""

    name: str

    async def judge(self, prompt: str, local_answer: str, cloud_answer: str) -> Judgment | None:
        """How right each answer was; None when it cannot tell."""
        ...

    async def close(self) -> None:
        """Release what the judge holds (a connection); nothing by default."""


class ExactMatchJudge(Judge):
    name = "exact_match"

    async def judge(self, prompt: str, local_answer: str, cloud_answer: str) -> Judgment | None:
        reference = final_answer(cloud_answer)
        if not reference:
            return None  # nothing to compare against
        return Judgment(float(final_answer(local_answer) == reference), None, self.name)


JUDGE_PROMPT = """You grade two answers to the same request. Score each from 0 (wrong or useless) to 10 \
(fully correct and helpful).
Reply with JSON only: {{"A": <score>, "B": <score>}}

Request:
{prompt}

Answer A:
{first}

Answer B:
{second}"""


class OpenAIJudge(Judge):
    """Grades with an OpenAI-compatible chat endpoint (httpx, temperature 0)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        rng: random.Random | None = None,
    ):
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)
        self.model = model
        self.rng = rng or random.Random()
        self.name = f"openai:{model}"

    async def judge(self, prompt: str, local_answer: str, cloud_answer: str) -> Judgment | None:
        local_first = self.rng.random() < 0.5
        first, second = (local_answer, cloud_answer) if local_first else (cloud_answer, local_answer)
        body = {
            "model": self.model,
            "temperature": 0,
            "max_tokens": 32,
            "messages": [{"role": "user", "content": JUDGE_PROMPT.format(prompt=prompt, first=first, second=second)}],
        }
        response = await self.client.post("/chat/completions", json=body)
        response.raise_for_status()
        scores = _scores(response.json()["choices"][0]["message"]["content"] or "")
        if scores is None:
            return None  # the judge did not answer in the format asked: no label rather than a guessed one
        a, b = scores
        local, cloud = (a, b) if local_first else (b, a)
        return Judgment(local, cloud, self.name)

    async def close(self) -> None:
        await self.client.aclose()


def _scores(content: str) -> tuple[float, float] | None:
    match = re.search(r"\{[^{}]*\}", content)
    if match is None:
        return None
    try:
        document = json.loads(match.group(0))
        a, b = float(document["A"]), float(document["B"])
    except (ValueError, KeyError, TypeError):
        return None
    if not (0 <= a <= 10 and 0 <= b <= 10):
        return None
    return a / 10.0, b / 10.0


def make_judge(spec: str, model: str | None = None, api_key: str | None = None):
    """`exact_match` or an OpenAI-compatible base URL (with `model`)."""
    if spec == "exact_match":
        return ExactMatchJudge()
    if not model:
        raise ValueError("an OpenAI-compatible judge needs a model id")
    return OpenAIJudge(spec, model, api_key)
