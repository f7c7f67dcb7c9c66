"""A prompt's shape: numbers read off its text that say how hard it is without saying
what it is about.

The zero-shot router scores these instead of a MiniLM embedding. An embedding learns each
topic's difficulty, and a topic the router never saw gets a guess (grouped CV on RouteLLM's
MMLU subjects: the embedding head scored below prompt length there); the shape (how long,
how much arithmetic notation, how the choices look) carries across topics
(bench.router_learning's cold-start table). Pure Python, microseconds per prompt, no model.

SHAPE_VERSION names this definition: a router file and a traffic row record it, and
features of another version are never mixed with these.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

SHAPE_VERSION = 1
# Lines that open a lettered choice: "A. ...", "b) ...", "(C) ...".
_CHOICE = re.compile(r"^[ \t]*\(?([A-Za-z])[.)][ \t]+(.*)$", re.M)
_WORD = re.compile(r"[^\W\d_]+")
_NOTATION = frozenset("=+*/^<>%$\\|{}()[]")  # formulas, code and arithmetic

SHAPE_FEATURES = (
    "log_chars",  # the whole prompt
    "log_stem_chars",  # the text before the first lettered choice (all of it when there is none)
    "log_choice_chars_mean",  # the lettered choices' mean and longest length (0 without choices)
    "log_choice_chars_max",
    "digit_share",  # digits / characters
    "notation_share",  # formula characters / characters
    "log_digits",
    "log_notation",
    "log_lines",  # non-empty lines
    "log_questions",  # question marks
    "word_chars_mean",  # mean letters per word
    "log_words",
    "choices_have_digits",  # 1 when any choice holds a digit (numeric answers)
    "capitalized_share",  # capitalized words / words (names, titles, legal citations)
    "log_commas",
    "log_periods",
)
NUM_SHAPE_FEATURES = len(SHAPE_FEATURES)


def _one(text: str) -> list[float]:
    num_chars = len(text)
    choices = _CHOICE.findall(text)
    first_choice = _CHOICE.search(text)
    stem = text[: first_choice.start()] if first_choice else text
    choice_lengths = [len(body) for _, body in choices] or [0]
    num_digits = sum(ch.isdigit() for ch in text)
    num_notation = sum(ch in _NOTATION for ch in text)
    words = _WORD.findall(text)
    num_words = max(len(words), 1)
    return [
        math.log1p(num_chars),
        math.log1p(len(stem)),
        math.log1p(sum(choice_lengths) / len(choice_lengths)),
        math.log1p(max(choice_lengths)),
        num_digits / max(num_chars, 1),
        num_notation / max(num_chars, 1),
        math.log1p(num_digits),
        math.log1p(num_notation),
        math.log1p(sum(1 for line in text.split("\n") if line.strip())),
        math.log1p(text.count("?")),
        sum(len(word) for word in words) / num_words,
        math.log1p(len(words)),
        float(any(ch.isdigit() for _, body in choices for ch in body)),
        sum(word[0].isupper() for word in words) / num_words,
        math.log1p(text.count(",")),
        math.log1p(text.count(".")),
    ]


def shape_features(texts: Sequence[str]) -> np.ndarray:
    """[len(texts), NUM_SHAPE_FEATURES] float32, one row per prompt text."""
    if isinstance(texts, str):
        raise TypeError("shape_features takes a list of texts")
    if not texts:
        return np.zeros((0, NUM_SHAPE_FEATURES), dtype=np.float32)
    return np.asarray([_one(text) for text in texts], dtype=np.float32)
