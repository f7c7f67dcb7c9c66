"""Finished sequences whose KV cells stay in their slots until the slot or blocks are needed.

llama.cpp keeps cells per sequence slot, so a prompt's cells outlive its request only if its
slot does. llama-server keeps each idle slot's last prompt and reuses its common prefix for the
next request; this is the same idea over tandem's books: a finished request's slot and blocks
move to an entry here (its blocks stay held, under the entry's key, and stay findable by hash),
and the scheduler evicts entries, least recently used first, before it would refuse or preempt
anyone. A chat's next turn resends the conversation so far, and finds it here.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class CachedKey:
    """The block manager's holder key of an entry (never equal to a request id)."""

    number: int


@dataclass
class CachedPrompt:
    """A finished sequence's cells: `slot` holds the KV of `all_token_ids[:num_computed_tokens]`."""

    key: CachedKey
    slot: int
    all_token_ids: list[int]
    num_computed_tokens: int


class PromptCache:
    """Entries in least-recently-used order."""

    def __init__(self) -> None:
        self._entries: OrderedDict[CachedKey, CachedPrompt] = OrderedDict()
        self._next_number = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[CachedPrompt]:
        return iter(list(self._entries.values()))

    def get(self, key: object) -> CachedPrompt | None:
        return self._entries.get(key) if isinstance(key, CachedKey) else None

    def add(self, slot: int, all_token_ids: list[int], num_computed_tokens: int) -> CachedPrompt:
        key = CachedKey(self._next_number)
        self._next_number += 1
        entry = CachedPrompt(key, slot, all_token_ids, num_computed_tokens)
        self._entries[key] = entry
        return entry

    def touch(self, entry: CachedPrompt) -> None:
        """Mark `entry` as just used (a prefix was copied from it)."""
        self._entries.move_to_end(entry.key)

    def remove(self, key: CachedKey) -> CachedPrompt:
        """Take an entry out (its slot was taken over by a new request)."""
        return self._entries.pop(key)

    def pop_least_recent(self, keep: set[CachedKey]) -> CachedPrompt | None:
        """Remove and return the least recently used entry not in `keep`; None when there is none."""
        for key in self._entries:
            if key not in keep:
                return self._entries.pop(key)
        return None
