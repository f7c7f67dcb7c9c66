"""Where a structured answer stands in its JSON text: in a string or not, and each open object's keys.

llguidance says which tokens may come next but not where in the JSON they are. Two rules need
that (sdk.engine_common.grammar_closing): the closing path searches bytes in an order that depends on
being inside a string (close it) or not (close the container), and an object must not take a key
it already has. A scan is fed every byte of the answer; it copies cheaply, so a search can try
bytes on a copy. Escapes inside a key (`\\u0061`) are kept as written, not decoded.
"""

from __future__ import annotations

import re


class JsonScan:
    """The lexical state after the bytes pushed so far (text outside JSON is passed over)."""

    __slots__ = ("in_string", "is_key", "escape", "key", "stack")

    def __init__(self) -> None:
        self.in_string = False
        self.is_key = False  # the open string is an object's key
        self.escape = False  # the last byte in the string was a backslash
        self.key = bytearray()  # the open key's bytes so far
        # One entry per open container: an object's set of keys (with whether a key comes next),
        # or None for an array.
        self.stack: list[list | None] = []

    def copy(self) -> JsonScan:
        other = JsonScan.__new__(JsonScan)
        other.in_string, other.is_key, other.escape = self.in_string, self.is_key, self.escape
        other.key = bytearray(self.key)
        other.stack = [None if frame is None else [set(frame[0]), frame[1]] for frame in self.stack]
        return other

    @property
    def expects_key(self) -> bool:
        """Outside a string, in an object, where the next string is a key (after `{` or `,`)."""
        return not self.in_string and bool(self.stack) and self.stack[-1] is not None and self.stack[-1][1]

    @property
    def object_keys(self) -> set[bytes]:
        """The keys the innermost open object already has (empty outside objects)."""
        return self.stack[-1][0] if self.stack and self.stack[-1] is not None else set()

    def push(self, data: bytes) -> None:
        for byte in data:
            self._push_byte(byte)

    def _push_byte(self, byte: int) -> None:
        if self.in_string:
            if self.escape:
                self.escape = False
            elif byte == 0x5C:  # backslash
                self.escape = True
            elif byte == 0x22:  # the closing quote
                self.in_string = False
                if self.is_key:
                    self.stack[-1][0].add(bytes(self.key))
                    self.stack[-1][1] = False
                    self.is_key = False
                return
            if self.is_key:
                self.key.append(byte)
            return
        if byte == 0x22:
            self.in_string, self.is_key = True, self.expects_key
            self.key.clear()
        elif byte == 0x7B:  # {
            self.stack.append([set(), True])
        elif byte == 0x5B:  # [
            self.stack.append(None)
        elif byte in (0x7D, 0x5D):  # } ]
            if self.stack:
                self.stack.pop()
        elif byte == 0x2C and self.stack and self.stack[-1] is not None:  # , in an object: a key comes next
            self.stack[-1][1] = True


# A token that ends an open key: the bytes before its first quote (no backslash among them).
_ENDS_KEY = re.compile(rb"^([^\"\\]*)\"", re.DOTALL)
# A token that writes a whole key where one is expected, or a comma then a whole key after a value.
_WHOLE_KEY = re.compile(rb"^[ \t\r\n]*\"([^\"\\]*)\"")
_COMMA_KEY = re.compile(rb"^[ \t\r\n]*,[ \t\r\n]*\"([^\"\\]*)\"")


class DuplicateKeyTokens:
    """Per vocabulary: which token ids would complete a given key, from each place a key can end.

    Built once (one regex pass over the vocabulary's tokens that contain a quote)."""

    def __init__(self, tokens: list[bytes]):
        self.ends_key: dict[bytes, list[int]] = {}
        self.whole_key: dict[bytes, list[int]] = {}
        self.comma_key: dict[bytes, list[int]] = {}
        for token_id, raw in enumerate(tokens):
            if b'"' not in raw:
                continue
            for pattern, table in (
                (_ENDS_KEY, self.ends_key),
                (_WHOLE_KEY, self.whole_key),
                (_COMMA_KEY, self.comma_key),
            ):
                match = pattern.match(raw)
                if match:
                    table.setdefault(match.group(1), []).append(token_id)

    def forbidden(self, scan: JsonScan) -> list[int]:
        """Token ids that would give the innermost object a key it already has, from `scan`'s state."""
        keys = scan.object_keys
        if not keys:
            return []
        out: list[int] = []
        if scan.in_string and scan.is_key:
            if scan.escape:
                return []
            written = bytes(scan.key)
            for key in keys:
                if key.startswith(written):
                    out.extend(self.ends_key.get(key[len(written) :], ()))
        elif scan.expects_key:
            for key in keys:
                out.extend(self.whole_key.get(key, ()))
        elif not scan.in_string and scan.stack and scan.stack[-1] is not None:
            for key in keys:
                out.extend(self.comma_key.get(key, ()))
        return out
