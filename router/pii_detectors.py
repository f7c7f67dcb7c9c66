"""Built-in PII detectors: each maps text to the (start, end) spans it flags.

Every regex here is written so that each repetition consumes a character no neighbour
can (digits vs separators, labels vs dots) or is bounded, so scanning hostile text stays
linear; checksums (Luhn, IBAN mod 97) are done in Python on the candidates.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from router.phone_detector import find_phone_numbers

Detector = Callable[[str], list[tuple[int, int]]]

# Local part capped at 64 characters (RFC 5321), so a long run without "@" costs at most
# 64 steps per position; labels are dot-separated and at most 63 characters.
_EMAIL = re.compile(r"[\w.%+-]{1,64}@(?:[^\W_](?:[\w-]{0,61}[^\W_])?\.){1,8}[^\W\d_]{2,63}(?![\w-])")
_CARD_RUN = re.compile(r"(?<!\d)\d(?:[ -]?\d)*")
_DIGIT_GROUP = re.compile(r"\d+")
# Major card networks (Visa 4, Mastercard 2/5, Amex/Diners/JCB 3, Discover/UnionPay 6):
# halves again the share of random Luhn-valid digit strings that would match.
_CARD_FIRST_DIGITS = "23456"
_IBAN_RUN = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9])+")
_IBAN_START = re.compile(r"[A-Z]{2}\d{2}")
_IBAN_CHUNK = re.compile(r"[A-Z0-9]+")


def find_emails(text: str) -> list[tuple[int, int]]:
    """Spans of e-mail addresses (local@domain.tld)."""
    return [match.span() for match in _EMAIL.finditer(text)]


def luhn_is_valid(digits: str) -> bool:
    """True if the digit string passes the Luhn checksum that card numbers carry."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char)
        if position % 2 == 1:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _is_card_number(groups: list[str]) -> bool:
    digits = "".join(groups)
    if not 13 <= len(digits) <= 19 or digits[0] not in _CARD_FIRST_DIGITS:
        return False
    # Written card numbers are one block or groups of 3-6 (4-4-4-4, Amex 4-6-5, 19-digit
    # 4-4-4-4-3); requiring that keeps lists of small numbers from adding up to a "card".
    if len(groups) > 1 and not all(3 <= len(group) <= 6 for group in groups):
        return False
    return luhn_is_valid(digits)


def find_card_numbers(text: str) -> list[tuple[int, int]]:
    """Spans of payment card numbers: 13-19 digits, optionally grouped by spaces or dashes,
    Luhn-valid and starting like a major network's number."""
    spans: list[tuple[int, int]] = []
    for run in _CARD_RUN.finditer(text):
        groups = [m.span() for m in _DIGIT_GROUP.finditer(text, run.start(), run.end())]
        first = 0
        while first < len(groups):
            for last in reversed(_windows_with_length(groups, first, 13, 19)):
                window = groups[first : last + 1]
                if len(window) > 1 and not all(3 <= e - s <= 6 for s, e in window):
                    continue  # checked in _is_card_number too; here it saves slicing long runs
                if _is_card_number([text[s:e] for s, e in window]):
                    spans.append((window[0][0], window[-1][1]))
                    first = last
                    break
            first += 1
    return spans


def _windows_with_length(chunks: list[tuple[int, int]], first: int, min_len: int, max_len: int) -> list[int]:
    """Last indexes of the windows chunks[first:last + 1] holding min_len..max_len
    characters (separators not counted): bounds the work per chunk on long runs."""
    lasts, total = [], 0
    for last in range(first, len(chunks)):
        total += chunks[last][1] - chunks[last][0]
        if total > max_len:
            break
        if total >= min_len:
            lasts.append(last)
    return lasts


def iban_is_valid(compact: str) -> bool:
    """True if an IBAN without spaces has a plausible length and a valid mod-97 check."""
    if not 15 <= len(compact) <= 34:
        return False
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(char, 36)) for char in rearranged)) % 97 == 1


def find_ibans(text: str) -> list[tuple[int, int]]:
    """Spans of IBANs, compact or in groups of four (the last may be shorter), checked with mod 97."""
    spans: list[tuple[int, int]] = []
    for run in _IBAN_RUN.finditer(text):
        chunks = [m.span() for m in _IBAN_CHUNK.finditer(text, run.start(), run.end())]
        first = 0
        while first < len(chunks):
            if _IBAN_START.match(text, chunks[first][0]):
                for last in reversed(_windows_with_length(chunks, first, 15, 34)):
                    # Printed IBANs are compact or in groups of four, the last one shorter.
                    if not all(e - s == 4 for s, e in chunks[first:last]):
                        continue
                    start, end = chunks[first][0], chunks[last][1]
                    if iban_is_valid(text[start:end].replace(" ", "")):
                        spans.append((start, end))
                        first = last
                        break
            first += 1
    return spans


BUILTIN_DETECTORS: dict[str, Detector] = {
    "email": find_emails,
    "phone": find_phone_numbers,
    "card": find_card_numbers,
    "iban": find_ibans,
}
# IBAN is opt-in: most chat traffic has none and its check costs a big-integer modulo.
DEFAULT_DETECTORS = ("email", "phone", "card")
