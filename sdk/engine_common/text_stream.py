"""Turns a stream of token bytes into final text deltas, honouring stop strings.

Both engines use it so the two tiers cut stop strings and split multi-byte
characters identically. Text is held back while it could still be the start of
a stop string or an incomplete UTF-8 character, so nothing emitted is ever
taken back.
"""

from __future__ import annotations

import codecs
from typing import Sequence


class TextStream:
    """Incremental detokenizer with stop-string detection for one request."""

    def __init__(self, stop: Sequence[str] = ()):
        self._stop = [s for s in stop if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""  # decoded text not yet emitted (a possible stop-string prefix)
        self.stopped = False  # a stop string was found; later pushes are ignored

    def push(self, token_bytes: bytes) -> str:
        """Add one token's bytes; return the text that became final.

        After a stop string is found, `stopped` is True and the text before it
        is the last thing returned.
        """
        if self.stopped:
            return ""
        self._held += self._decoder.decode(token_bytes, final=False)
        if not self._stop:
            out, self._held = self._held, ""
            return out
        cut = self._first_stop_index()
        if cut is not None:
            self.stopped = True
            out, self._held = self._held[:cut], ""
            return out
        keep = self._longest_stop_prefix_suffix()
        out = self._held[: len(self._held) - keep]
        self._held = self._held[len(self._held) - keep :]
        return out

    def flush(self) -> str:
        """The generation ended without a stop string: release everything held."""
        if self.stopped:
            return ""
        out = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return out

    def _first_stop_index(self) -> int | None:
        hits = [i for i in (self._held.find(s) for s in self._stop) if i >= 0]
        return min(hits) if hits else None

    def _longest_stop_prefix_suffix(self) -> int:
        """Length of the longest tail of held text that begins some stop string."""
        best = 0
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(self._held)), best, -1):
                if self._held.endswith(stop[:n]):
                    best = n
                    break
        return best
