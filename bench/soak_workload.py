"""The soak's seeded request mix: prompt lengths, answer budgets, models, privacy, client
cancels and deliberately invalid requests (see bench/soak.py).

Prompts come from RouteLLM's data when it is there (short: MT-Bench first turns under
160 characters; medium: a GSM8K question, a paragraph; long: two to four GSM8K
questions with their worked solutions, up to LONG_CHARS characters, to summarise), else
from sentences built from a fixed word list. Either way the same seed gives the same
requests.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import asdict, dataclass

DEFAULT_DATA_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data", "routellm"
)
LONG_CHARS = (1200, 2000)  # ~300-500 tokens: with a 96-token answer, well inside a 1024-token context
PROMPT_KINDS = {"short": 0.4, "medium": 0.35, "long": 0.25}
# Routed models and their shares of the valid requests. `private` is `auto` or `auto:1` with
# "private": true (must stay local); `direct` is the local model's own name (no routing).
MODEL_MIX = {"auto": 0.5, "auto:1": 0.1, "cloud": 0.1, "local": 0.1, "private": 0.1, "direct": 0.1}
# Requests the server must refuse: the body and the status it must answer with.
INVALID_BODIES = {
    "n_2_routed": ({"model": "auto", "n": 2}, 400),
    "logprobs_routed": ({"model": "auto", "logprobs": True}, 400),
    "empty_messages": ({"model": "auto", "messages": []}, 400),
    "max_tokens_0": ({"model": "auto", "max_tokens": 0}, 400),
    "temperature_9": ({"model": "local", "temperature": 9.0}, 400),
    "unknown_model": ({"model": "no-such-model"}, 404),
}
WORDS = (
    "river mountain engine garden letter market window science history planet music silver harbour "
    "winter question number travel kitchen signal forest bridge paper ocean theory village"
).split()


@dataclass
class SoakRequest:
    """One request of the soak and what the client will do with it."""

    index: int
    body: dict  # the JSON sent (stream: true)
    model_kind: str  # a MODEL_MIX key, or "invalid"
    prompt_kind: str  # short | medium | long | invalid:<name>
    cancel_after_chunks: int = 0  # > 0: close the stream after this many content chunks
    expect_status: int = 200

    def summary(self) -> dict:
        out = asdict(self)
        del out["body"]
        out.update(
            model=self.body.get("model"),
            max_tokens=self.body.get("max_tokens"),
            private=bool(self.body.get("private")),
            prompt_chars=_prompt_chars(self.body),
        )
        return out


def _prompt_chars(body: dict) -> int:
    return sum(len(m.get("content") or "") for m in body.get("messages") or [])


def _read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class PromptPool:
    """Short, medium and long prompt texts, fixed for a given data directory."""

    def __init__(self, data_dir: str = DEFAULT_DATA_DIR):
        mt_bench, gsm8k = os.path.join(data_dir, "mt_bench_questions.jsonl"), os.path.join(data_dir, "gsm8k_test.jsonl")
        if os.path.exists(mt_bench) and os.path.exists(gsm8k):
            self.source = f"RouteLLM data in {os.path.normpath(data_dir)}"
            short = [row["turns"][0] for row in _read_jsonl(mt_bench) if len(row["turns"][0]) < 160]
            rows = _read_jsonl(gsm8k)[:600]
            self.short = short + [row["question"] for row in rows if len(row["question"]) < 160]
            self.medium = [row["question"] for row in rows if 200 <= len(row["question"]) <= 700]
            self.passages = [
                row["question"].strip() + "\n" + re.sub(r"<<[^>]*>>", "", row["answer"]).strip() for row in rows
            ]
        else:
            self.source = "built from a word list (RouteLLM data not found)"
            rng = random.Random(1234)
            self.short = [_sentence(rng, 6, 14) + "?" for _ in range(200)]
            self.medium = [" ".join(_sentence(rng, 8, 16) + "." for _ in range(rng.randint(3, 6))) for _ in range(200)]
            self.passages = [
                " ".join(_sentence(rng, 8, 16) + "." for _ in range(rng.randint(5, 9))) for _ in range(300)
            ]

    def prompt(self, kind: str, rng: random.Random) -> str:
        if kind == "short":
            return rng.choice(self.short)
        if kind == "medium":
            return rng.choice(self.medium) + "\nExplain your reasoning briefly."
        budget = rng.randint(*LONG_CHARS)
        parts: list[str] = []
        while len(parts) < 4:
            passage = rng.choice(self.passages)
            if parts and sum(map(len, parts)) + len(passage) > budget:
                break
            parts.append(passage[:budget])
        return "Summarise the following notes in a few sentences.\n\n" + "\n\n".join(parts)


def _sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))).capitalize()


def _pick(rng: random.Random, shares: dict[str, float]) -> str:
    return rng.choices(list(shares), weights=list(shares.values()))[0]


def build_workload(
    num: int,
    seed: int,
    max_tokens: tuple[int, int],
    cancel_fraction: float,
    invalid_fraction: float,
    local_model_name: str,
    pool: PromptPool,
    prompt_shares: dict[str, float] | None = None,
) -> list[SoakRequest]:
    """`num` requests; the same arguments give the same requests."""
    prompt_shares = prompt_shares or PROMPT_KINDS
    rng = random.Random(seed)
    requests = []
    for index in range(num):
        if rng.random() < invalid_fraction:
            name = rng.choice(sorted(INVALID_BODIES))
            overrides, status = INVALID_BODIES[name]
            body = {
                "messages": [{"role": "user", "content": rng.choice(pool.short)}],
                "max_tokens": 8,
                "stream": True,
                **overrides,
            }
            requests.append(SoakRequest(index, body, "invalid", f"invalid:{name}", expect_status=status))
            continue
        model_kind, prompt_kind = _pick(rng, MODEL_MIX), _pick(rng, prompt_shares)
        budget = rng.randint(*max_tokens)
        model = {"private": rng.choice(("auto", "auto:1")), "direct": local_model_name}.get(model_kind, model_kind)
        body = {
            "model": model,
            "messages": [{"role": "user", "content": pool.prompt(prompt_kind, rng)}],
            "max_tokens": budget,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if rng.random() < 0.5:
            body.update(temperature=0.8, seed=rng.randrange(2**31))
        else:
            body["temperature"] = 0.0
        if model_kind == "private":
            body["private"] = True
        cancel = rng.randint(1, max(1, budget // 2)) if rng.random() < cancel_fraction else 0
        requests.append(SoakRequest(index, body, model_kind, prompt_kind, cancel_after_chunks=cancel))
    return requests


def describe_mix(requests: list[SoakRequest]) -> dict:
    """What the workload holds, counted."""

    def count(key) -> dict:
        out: dict = {}
        for r in requests:
            out[key(r)] = out.get(key(r), 0) + 1
        return dict(sorted(out.items()))

    valid = [r for r in requests if r.expect_status == 200]
    return {
        "model_kinds": count(lambda r: r.model_kind),
        "prompt_kinds": count(lambda r: r.prompt_kind),
        "planned_cancels": sum(r.cancel_after_chunks > 0 for r in requests),
        "invalid": sum(r.expect_status != 200 for r in requests),
        "max_tokens_total": sum(r.body["max_tokens"] for r in valid),
        "prompt_chars_mean": sum(_prompt_chars(r.body) for r in valid) / max(1, len(valid)),
    }
