"""Replacing what privacy rules match with typed placeholders ("[EMAIL]").

Replacing text changes the context the rules see: "AA+44 20 7946 0958" hides its phone
number behind the letters before "+", and redacting the e-mail in "a@b.AA+44 20 7946
0958" turns those letters into "]", after which the number is plain to see. So redaction
re-checks its own output and widens the redacted spans until nothing new matches; the
spans only grow and are bounded by the text, so this ends (usually after one re-check).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


class _Match(Protocol):
    rule: str
    start: int
    end: int


@dataclass(frozen=True)
class Redaction:
    """One span replaced by a placeholder; offsets are in the original text."""

    rule: str  # the rule of the match starting first (longest on ties) in a merged span
    placeholder: str
    start: int
    end: int
    message_index: int | None = None  # set by redact_messages
    part_index: int | None = None  # None when the message content is a string


def placeholder_for(rule: str) -> str:
    """The typed placeholder that replaces a match: "email" -> "[EMAIL]"."""
    return f"[{rule.upper()}]"


def redact_text(text: str, find: Callable[[str], Sequence[_Match]]) -> tuple[str, list[Redaction]]:
    """text with every match of `find` replaced, and the replacements, in order.

    Overlapping matches merge into one span so that no part of any match survives."""
    redactions = _merge(find(text))
    while True:
        redacted = _apply(text, redactions)
        leftovers = [_to_original(match, redactions) for match in find(redacted)]
        widened = _merge([*redactions, *leftovers])
        if _num_covered(widened) == _num_covered(redactions):
            return redacted, redactions
        redactions = widened


def _merge(matches: Sequence[_Match]) -> list[Redaction]:
    merged: list[Redaction] = []
    for match in sorted(matches, key=lambda m: (m.start, -m.end)):
        if merged and match.start < merged[-1].end:
            last = merged[-1]
            merged[-1] = Redaction(last.rule, last.placeholder, last.start, max(last.end, match.end))
        else:
            merged.append(Redaction(match.rule, placeholder_for(match.rule), match.start, match.end))
    return merged


def _apply(text: str, redactions: list[Redaction]) -> str:
    pieces, cursor = [], 0
    for redaction in redactions:
        pieces += [text[cursor : redaction.start], redaction.placeholder]
        cursor = redaction.end
    pieces.append(text[cursor:])
    return "".join(pieces)


def _to_original(match: _Match, redactions: list[Redaction]) -> Redaction:
    """A match in the redacted text, moved to the original text; a match touching a
    placeholder grows to cover the whole span that placeholder replaced."""
    start = _original_offset(match.start, redactions, inside_maps_to_start=True)
    end = _original_offset(match.end - 1, redactions, inside_maps_to_start=False) + 1
    return Redaction(match.rule, placeholder_for(match.rule), start, end)


def _original_offset(position: int, redactions: list[Redaction], inside_maps_to_start: bool) -> int:
    shift = 0  # how much longer the redacted text is than the original, so far
    for redaction in redactions:
        placeholder_start = redaction.start + shift
        if position < placeholder_start:
            break
        if position < placeholder_start + len(redaction.placeholder):
            return redaction.start if inside_maps_to_start else redaction.end - 1
        shift += len(redaction.placeholder) - (redaction.end - redaction.start)
    return position - shift


def _num_covered(redactions: list[Redaction]) -> int:
    return sum(redaction.end - redaction.start for redaction in redactions)
