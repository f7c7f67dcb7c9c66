"""Prompts whose right answers are long, repetitive in shape and strictly checkable: what the loop
stop must leave alone (bench.loop_stop). Stdlib only; every family is fixed by SEED.

SmolLM2-135M-Instruct is weak, so the families are those it gets right often enough at its
sampling defaults (temperature 0.2, top_p 0.9). Exploration (6-24 prompts per variant, 256-320
tokens, the stop off; the prompts, right counts and answer lengths noted here are all that was
tuned: the stop's rules were not touched):

- `word_problems`: "a bags with b items each, c more: how many?" with the working shown, after
  one worked example of the same shape; right = the last number in the reply is a x b + c.
  23 of 24 right, answers 63-75 tokens. Items have two words ("glass marbles"): with one-word
  items the right answers were 61-64 tokens. Factors stay 2-5 (7 x 9 came out as 60).
- `word_problem_pairs`: two such problems in one prompt after two worked ones; right = the
  numbers after "The answer is" are exactly the two answers, in order. 6 of 16 right, answers
  about 140 tokens: two passes of the same sentence shapes with other names and numbers, the
  case an exact-repetition stop must not mistake for a loop. Three problems: 0 of 16.
- `alphabet`: the 26 letters with their positions ("A = 1" ... "Z = 26"), one per line; right =
  the letter-position pairs in the reply are exactly A..Z with 1..26, once. It writes the list
  right almost every time, then often writes it again (a loop of about 140 tokens, longer than
  the tracker's 64-token unit). Two prompts only (other phrasings and the formats "A - 1" and
  "A (1)" got no list at all), so most right replies are the same text.
- `spelling`: six words letter by letter after one worked example: it mostly falls into a loop
  of letters (6 of 8), the long answers the stop is for; right = each word spelled exactly.

Tried and dropped (right too rarely, or right answers under 64 tokens): times tables, with or
without a worked table ("10 x 4 = 60"); counting from a to b (it runs past b, or stops where the
worked example stopped); counting by 2s/5s/10s; running totals of 7-10 one-digit numbers, or of
five days' counts after a worked example (it restarts the total each line); three-step word
problems (it drops the third step: 1 of 16); shopping sums over three items (0 of 16); letter
ranges ("from F to T"); copying 7-9 sentences (1 of 24 when the sentences share words); the
months with their days; numbered word lists (2 of 8).
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass
from typing import Callable

SEED = 36  # fixed: the same prompts every run


@dataclass(frozen=True)
class Task:
    messages: tuple[dict, ...]
    check: Callable[[str], bool] | None  # True only for an exactly right reply; None: nothing to check


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> float | None:
    numbers = _NUMBER.findall(text)
    try:
        return float(numbers[-1].replace(",", "")) if numbers else None
    except ValueError:
        return None


# --- word problems with the working shown ----------------------------------------------------

_NAMES = ("Sam", "Mia", "Tom", "Lena", "Omar", "Ava", "Ben", "Zoe", "Ravi", "Nora", "Leo", "Ines")
_ITEMS = (
    "glass marbles",
    "red apples",
    "toy cars",
    "baseball cards",
    "sea shells",
    "colored pencils",
    "oatmeal cookies",
    "paper stars",
    "green grapes",
    "wooden blocks",
)
_CONTAINERS = (("bags", "bag"), ("boxes", "box"), ("jars", "jar"), ("baskets", "basket"))
# Worked examples: (question, answer); their items are not in _ITEMS.
_WORKED = (
    (
        "Ben has 4 boxes with 3 blue buttons in each box. Ben finds 5 more blue buttons. "
        "How many blue buttons does Ben have now? Show your working.",
        "Ben has 4 boxes with 3 blue buttons in each box, so he has 4 x 3 = 12 blue buttons in the boxes.\n"
        "He finds 5 more blue buttons, so he has 12 + 5 = 17 blue buttons now.\nThe answer is 17.",
    ),
    (
        "Mia has 2 jars with 5 red beads in each jar. Mia gets 3 more red beads. "
        "How many red beads does Mia have now? Show your working.",
        "Mia has 2 jars with 5 red beads in each jar, so she has 2 x 5 = 10 red beads in the jars.\n"
        "She gets 3 more red beads, so she has 10 + 3 = 13 red beads now.\nThe answer is 13.",
    ),
)
_ANSWER_IS = re.compile(r"The answer is (-?\d+)")


def _word_problem(rng: random.Random) -> tuple[str, int]:
    name, item, (boxes, box) = rng.choice(_NAMES), rng.choice(_ITEMS), rng.choice(_CONTAINERS)
    a, b, c = rng.randint(2, 5), rng.randint(2, 5), rng.randint(2, 9)
    question = (
        f"{name} has {a} {boxes} with {b} {item} in each {box}. {name} gets {c} more {item}. "
        f"How many {item} does {name} have now? Show your working."
    )
    return question, a * b + c


def word_problems(count: int, seed: int = SEED) -> list[Task]:
    rng, tasks, seen = random.Random(f"word_problems-{seed}"), [], set()
    while len(tasks) < count:
        question, answer = _word_problem(rng)
        if question not in seen:
            seen.add(question)
            check = lambda reply, answer=answer: last_number(reply) == answer  # noqa: E731
            tasks.append(Task((_user(_WORKED[0][0]), _assistant(_WORKED[0][1]), _user(question)), check))
    return tasks


def _numbered(texts: list[str]) -> str:
    return "Solve these 2 problems.\n\n" + "\n\n".join(f"Problem {i}: {text}" for i, text in enumerate(texts, 1))


def word_problem_pairs(count: int, seed: int = SEED) -> list[Task]:
    rng, tasks = random.Random(f"word_problem_pairs-{seed}"), []
    example = (
        _user(_numbered([q for q, _ in _WORKED])),
        _assistant("\n\n".join(f"Problem {i}: {a}" for i, (_, a) in enumerate(_WORKED, 1))),
    )
    for _ in range(count):
        (first, one), (second, two) = _word_problem(rng), _word_problem(rng)
        check = lambda reply, expected=[one, two]: [int(n) for n in _ANSWER_IS.findall(reply)] == expected  # noqa: E731
        tasks.append(Task((*example, _user(_numbered([first, second]))), check))
    return tasks


# --- the alphabet with positions -------------------------------------------------------------

_FORMATS = ("{letter} = {n}", "{letter}: {n}")
_ALPHABET_PROMPT = (
    "Write the alphabet from A to Z, one letter per line, each followed by its position, like this: {first}"
)


def _alphabet_exactly(fmt: str) -> Callable[[str], bool]:
    pair = re.compile(re.escape(fmt).replace(r"\{letter\}", r"\b([A-Z])\b").replace(r"\{n\}", r"(\d+)\b"))
    expected = [(letter, str(n)) for n, letter in enumerate(string.ascii_uppercase, 1)]
    return lambda reply: pair.findall(reply) == expected


def alphabet(count: int, seed: int = SEED) -> list[Task]:
    """`count` prompts alternating between the formats (the seed of each request differs)."""
    del seed  # two fixed prompts
    return [
        Task(
            (_user(_ALPHABET_PROMPT.format(first=_FORMATS[i % 2].format(letter="A", n=1))),),
            _alphabet_exactly(_FORMATS[i % 2]),
        )
        for i in range(count)
    ]


# --- spelling ------------------------------------------------------------------------------

_WORDS = (
    "apple river candle garden pencil window rabbit orange castle meadow silver button forest ladder "
    "pepper rocket tunnel violin wallet yellow anchor basket cactus dragon engine falcon guitar hammer "
    "island jacket kettle lemon magnet needle ocean parrot saddle tiger umbrella valley walnut"
).split()


def _spelled(words: list[str]) -> str:
    return "\n".join(f"{word}: {'-'.join(word)}" for word in words)


def spelling(count: int, seed: int = SEED) -> list[Task]:
    rng, tasks, example = random.Random(f"spelling-{seed}"), [], ["cat", "house"]
    for _ in range(count):
        words = rng.sample(_WORDS, 6)
        expected = _spelled(words).splitlines()
        check = lambda reply, expected=expected: (
            [line.strip() for line in reply.strip().splitlines() if line.strip()] == expected
        )  # noqa: E731
        tasks.append(
            Task(
                (
                    _user(f"Spell these words letter by letter: {', '.join(example)}."),
                    _assistant(_spelled(example)),
                    _user(f"Spell these words letter by letter: {', '.join(words)}."),
                ),
                check,
            )
        )
    return tasks


FAMILIES: dict[str, Callable[[int, int], list[Task]]] = {
    "word_problems": word_problems,
    "word_problem_pairs": word_problem_pairs,
    "alphabet": alphabet,
    "spelling": spelling,
}
