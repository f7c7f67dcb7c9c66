"""A task with checkable answers for measuring confidence signals: generated arithmetic
of rising difficulty (numpy + stdlib only).

`generate_items(n, seed)` is deterministic per seed. Each item is a chat prompt, the
true integer answer, and a difficulty level (index into LEVELS, easiest first). Items
come out sorted by level, in equal shares per level unless `level_weights` says
otherwise. `is_correct(text, answer)` checks the reply's answer: the number after the
first "=" when the reply restates the sum ("8 + 6 = 14"), else its first integer ("The
answer is 1,234." counts as 1234).

The prompt: a 135M-parameter model told to "answer with just the number" mostly starts
explaining ("To solve this, we need to convert 89 to a mixed number"; 15% right over the
ten levels) or, with bare-number few-shot answers, guesses (2-4% right). Shown three worked examples in the form
"a + b = c" it answers in that form, in one line, and gets about 30% right: writing the
sum out before the result is how it computes. Measured on 100 items per variant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class Level:
    """One difficulty level: a name and how to draw (question text, answer) from an rng."""

    name: str
    draw: Callable[[np.random.Generator], tuple[str, int]]


def _digits(rng: np.random.Generator, num_digits: int) -> int:
    """A uniform integer with exactly `num_digits` digits (1-9 for one digit)."""
    low = 1 if num_digits == 1 else 10 ** (num_digits - 1)
    return int(rng.integers(low, 10**num_digits))


def _binary(op: str, digits_a: int, digits_b: int):
    def draw(rng: np.random.Generator) -> tuple[str, int]:
        a, b = _digits(rng, digits_a), _digits(rng, digits_b)
        if op == "-" and b > a:
            a, b = b, a  # keep answers non-negative
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        symbol = {"+": "+", "-": "-", "*": "×"}[op]
        return f"{a} {symbol} {b}", answer

    return draw


def _mixed(rng: np.random.Generator) -> tuple[str, int]:
    """a + b × c with two-digit a and one-digit b, c (precedence matters)."""
    a, b, c = _digits(rng, 2), _digits(rng, 1), _digits(rng, 1)
    return f"{a} + {b} × {c}", a + b * c


# Easiest first. The difficulty is in the operands' sizes and the operation; a
# 135M-parameter model gets most of level 0 right and almost none of the last ones.
LEVELS: tuple[Level, ...] = (
    Level("1-digit + 1-digit", _binary("+", 1, 1)),
    Level("2-digit + 1-digit", _binary("+", 2, 1)),
    Level("1-digit × 1-digit", _binary("*", 1, 1)),
    Level("2-digit + 2-digit", _binary("+", 2, 2)),
    Level("2-digit - 2-digit", _binary("-", 2, 2)),
    Level("2-digit × 1-digit", _binary("*", 2, 1)),
    Level("3-digit + 3-digit", _binary("+", 3, 3)),
    Level("2-digit + 1-digit × 1-digit", _mixed),
    Level("2-digit × 2-digit", _binary("*", 2, 2)),
    Level("3-digit × 3-digit", _binary("*", 3, 3)),
)


@dataclass(frozen=True)
class ArithmeticItem:
    """One question: the chat messages to send, the true answer, its difficulty level."""

    question: str  # e.g. "23 + 45"
    answer: int
    level: int  # index into LEVELS; higher is harder
    messages: tuple[dict, ...]


# Worked examples shown before each question (user asks, assistant restates and answers).
FEW_SHOT: tuple[tuple[str, int], ...] = (("4 + 3", 7), ("12 × 3", 36), ("58 - 21", 37))
_FEW_SHOT_QUESTIONS = frozenset(example for example, _ in FEW_SHOT)


def prompt_messages(question: str) -> tuple[dict, ...]:
    """The chat for one question: the worked examples, then the question."""
    messages: list[dict] = []
    for example, result in FEW_SHOT:
        messages.append({"role": "user", "content": f"What is {example}?"})
        messages.append({"role": "assistant", "content": f"{example} = {result}"})
    messages.append({"role": "user", "content": f"What is {question}?"})
    return tuple(messages)


def level_counts(n: int, level_weights: Sequence[float] | None = None) -> list[int]:
    """How many of `n` items each level gets: proportional to the weights (equal by
    default), largest remainders first, so the counts always sum to `n`."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    weights = np.ones(len(LEVELS)) if level_weights is None else np.asarray(level_weights, dtype=np.float64)
    if weights.shape != (len(LEVELS),) or (weights < 0).any() or weights.sum() <= 0:
        raise ValueError(f"level_weights must be {len(LEVELS)} non-negative weights, not all 0")
    shares = n * weights / weights.sum()
    counts = np.floor(shares).astype(int)
    remainder_order = np.argsort(-(shares - counts), kind="stable")
    counts[remainder_order[: n - counts.sum()]] += 1
    return [int(c) for c in counts]


def generate_items(n: int, seed: int = 0, level_weights: Sequence[float] | None = None) -> list[ArithmeticItem]:
    """`n` distinct questions, sorted by level (rising difficulty); the same for the same
    arguments. Each level draws from its own stream, so changing one level's count does
    not change the other levels' questions."""
    items: list[ArithmeticItem] = []
    for level, count in enumerate(level_counts(n, level_weights)):
        rng = np.random.default_rng([seed, level])
        seen: set[str] = set()
        attempts = 0
        while len(seen) < count:
            question, answer = LEVELS[level].draw(rng)
            attempts += 1
            if question in seen:
                if attempts > 100 * count + 1000:  # e.g. more 1-digit sums than exist
                    raise ValueError(f"level {level} ({LEVELS[level].name}) has fewer than {count} distinct questions")
                continue
            if question in _FEW_SHOT_QUESTIONS:
                continue  # its answer is in the prompt
            seen.add(question)
            items.append(ArithmeticItem(question, answer, level, prompt_messages(question)))
    return items


# A number: optional minus, digits with optional thousands separators, optional decimals.
_NUMBER = re.compile(r"(?<![\d.])(-?)(\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.(\d+))?")


def extract_answer(text: str) -> int | None:
    """The first number in `text` as an integer ("1,234" and "68.0" count; "3.5" gives
    None, as does text without a number)."""
    match = _NUMBER.search(text)
    if match is None:
        return None
    sign, digits, decimals = match.groups()
    if decimals and decimals.strip("0"):
        return None  # the first number is not an integer: the reply is not one
    return int(sign + digits.replace(",", ""))


def reply_answer(text: str) -> int | None:
    """The answer a reply gives: the number right after its first "=" if it has one
    ("8 + 6 = 14" answers 14, not 8), else its first number (see extract_answer)."""
    _, equals, result = text.partition("=")
    return extract_answer(result if equals else text)


def is_correct(text: str, answer: int) -> bool:
    """Whether the reply's answer (reply_answer) is the true answer."""
    return reply_answer(text) == answer
