"""Finds phone numbers in free text without flagging years, dates, prices or plain counts.

The heuristic: a regex collects runs of digit groups joined by at most two of " ().-"
(plus a leading "+" or "("), then each window of consecutive groups is accepted only if
it has one of these shapes:

- international: "+" or "00", then 8 to 15 digits (E.164 caps numbers
  at 15 digits; 8 excludes short codes and small signed numbers);
- North American: groups 3-3-4, optionally after a "1" group, with an area code that
  starts with 2-9 as NANP area codes do ("(555) 123-4567", "555.123.4567", "1-800-...");
- national with a trunk "0": a first group of at least two digits starting with "0" but
  not "00", 9 to 12 digits, every group at least two digits ("020 7946 0958",
  "01 23 45 67 89", "07700900123").

What this leaves out on purpose: unseparated numbers without "+" or a leading 0
("5551234567" looks like any order number), years and year lists ("1999 2000"), dates
("2024-01-15", "15.01.2024": at most 8 digits), decimals ("0.123456789": a lone "0"
first group), thousands-grouped amounts ("1.234.567") and anything right after a
currency sign ("$555-123-4567" reads as an amount). A number must start its run (or
follow a number found in it): "2024 020 7946 0958" is read as one longer digit run.
"""

from __future__ import annotations

import re

# Each repetition consumes exactly one digit and separators are never digits, so a run
# parses one way only and the scan stays linear however hostile the text.
_PHONE_RUN = re.compile(r"(?<![\w+])[+(]?\d(?:[ ().-]{0,2}\d)*")
_DIGIT_GROUP = re.compile(r"\d+")
_CURRENCY_SIGNS = "$€£¥₹"
# More groups than any common written format ("+33 1 23 45 67 89" has six).
_MAX_GROUPS_PER_NUMBER = 7


def find_phone_numbers(text: str) -> list[tuple[int, int]]:
    """(start, end) of each phone number in text, in order, never overlapping."""
    spans: list[tuple[int, int]] = []
    for run in _PHONE_RUN.finditer(text):
        groups = [(m.start(), m.end()) for m in _DIGIT_GROUP.finditer(text, run.start(), run.end())]
        # A number starts a run or follows one found in it: digits glued to a longer run
        # ("DE89 3704 0044 0532", an account number) are part of that run, not a phone.
        first = 0
        while first < len(groups):
            span = _longest_phone_from(text, run.start(), groups, first)
            if span is None:
                break
            spans.append(span[:2])
            first = span[2] + 1
    return spans


def _longest_phone_from(text: str, run_start: int, groups: list[tuple[int, int]], first: int):
    """(start, end, last_group) of the longest phone window starting at groups[first], or None."""
    last_candidate = min(len(groups), first + _MAX_GROUPS_PER_NUMBER) - 1
    for last in range(last_candidate, first - 1, -1):
        window = groups[first : last + 1]
        start = window[0][0]
        # A "+" belongs to the number only at the start of the run; "(" may open any group.
        if start > run_start and text[start - 1] in "+(":
            start -= 1
        end = window[-1][1]
        if text.count("(", start, end) > text.count(")", start, end) and text[end : end + 1] == ")":
            end += 1
        if _looks_like_phone(text, start, end, window):
            return start, end, last
    return None


def _looks_like_phone(text: str, start: int, end: int, window: list[tuple[int, int]]) -> bool:
    opens, closes = text.count("(", start, end), text.count(")", start, end)
    if opens != closes or opens > 1 or _after_currency_sign(text, start):
        return False
    digit_groups = [text[s:e] for s, e in window]
    digits = "".join(digit_groups)
    if text[start] == "+":
        return 8 <= len(digits) <= 15
    if digits.startswith("00"):
        return 8 <= len(digits) - 2 <= 15
    lengths = [len(group) for group in digit_groups]
    if lengths == [1, 3, 3, 4] and digit_groups[0] == "1":
        digit_groups, lengths = digit_groups[1:], lengths[1:]
    if lengths == [3, 3, 4]:
        return digit_groups[0][0] in "23456789"
    return digits.startswith("0") and lengths[0] >= 2 and 9 <= len(digits) <= 12 and min(lengths) >= 2


def _after_currency_sign(text: str, start: int) -> bool:
    before = text[max(0, start - 2) : start].rstrip(" ")
    return before != "" and before[-1] in _CURRENCY_SIGNS
