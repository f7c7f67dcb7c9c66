"""Counts of what privacy rules kept on the device: the evidence that they work, and the
price of them (the escalations that did not happen)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PrivacySnapshot:
    """Totals at one moment, JSON-friendly via `as_dict`."""

    num_requests_kept_local: int = 0  # requests that would have escalated and did not
    num_requests_redacted: int = 0  # requests escalated with placeholders instead
    num_redactions: int = 0  # spans replaced by placeholders, over all redacted requests
    num_chars_withheld: int = 0  # text of the kept-local requests that was not sent
    num_tokens_withheld: int = 0  # the same in prompt tokens, where the caller knew them
    kept_local_by_reason: dict[str, int] = field(default_factory=dict)  # rule name or "private_flag"

    def as_dict(self) -> dict:
        return {
            "num_requests_kept_local": self.num_requests_kept_local,
            "num_requests_redacted": self.num_requests_redacted,
            "num_redactions": self.num_redactions,
            "num_chars_withheld": self.num_chars_withheld,
            "num_tokens_withheld": self.num_tokens_withheld,
            "kept_local_by_reason": dict(self.kept_local_by_reason),
        }


class PrivacyCounters:
    """Accumulates privacy outcomes; a lock makes it safe to share across threads.

    A request kept local for several reasons (an e-mail and a card number) counts once in
    `num_requests_kept_local` and once under each reason."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_reason: Counter[str] = Counter()
        self._num_kept_local = 0
        self._num_redacted = 0
        self._num_redactions = 0
        self._num_chars = 0
        self._num_tokens = 0

    def record_kept_local(self, reasons: Iterable[str], num_chars: int, num_tokens: int = 0) -> None:
        """A request that stayed local only because of privacy; sizes are what it would have sent."""
        reasons = tuple(dict.fromkeys(reasons))
        if not reasons:
            raise ValueError("record_kept_local needs at least one reason (a rule name or 'private_flag')")
        if num_chars < 0 or num_tokens < 0:
            raise ValueError(f"sizes cannot be negative (num_chars={num_chars}, num_tokens={num_tokens})")
        with self._lock:
            self._num_kept_local += 1
            self._by_reason.update(reasons)
            self._num_chars += num_chars
            self._num_tokens += num_tokens

    def record_redacted(self, num_redactions: int) -> None:
        """A request escalated after its matches were replaced by placeholders."""
        with self._lock:
            self._num_redacted += 1
            self._num_redactions += num_redactions

    def snapshot(self) -> PrivacySnapshot:
        with self._lock:
            return PrivacySnapshot(
                self._num_kept_local,
                self._num_redacted,
                self._num_redactions,
                self._num_chars,
                self._num_tokens,
                dict(sorted(self._by_reason.items())),
            )
