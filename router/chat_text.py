"""The text of OpenAI-shaped chat messages, as privacy rules read and redact it.

Messages may be dicts or objects with attributes (the SDK's pydantic models); content is a
string, a list of content parts (only parts of type "text" carry text we can check) or
None (e.g. an assistant message with tool calls only).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping


def iter_message_texts(messages: Iterable) -> Iterator[tuple[int, int | None, str]]:
    """(message index, content part index or None, text) of every text in chat messages,
    given as dicts or as objects with a `content` attribute (e.g. the SDK's models)."""
    for message_index, message in enumerate(messages):
        content = _field(message, "content")
        if isinstance(content, str):
            yield message_index, None, content
        elif isinstance(content, (list, tuple)):
            for part_index, part in enumerate(content):
                text = _field(part, "text")
                if _field(part, "type") == "text" and isinstance(text, str):
                    yield message_index, part_index, text


def message_text_length(messages: Iterable) -> int:
    """Characters of text in the messages: what escalating them would send."""
    return sum(len(text) for _, _, text in iter_message_texts(messages))


def _field(item, name: str):
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def message_as_dict(message) -> dict:
    """A shallow dict copy of a message, safe to change without touching the caller's."""
    if isinstance(message, Mapping):
        return dict(message)
    return message.model_dump(exclude_none=True)  # pydantic models (sdk.protocol.openai_schema)


def part_as_dict(part) -> dict:
    """A shallow dict copy of a content part."""
    return dict(part) if isinstance(part, Mapping) else part.model_dump(exclude_none=True)
