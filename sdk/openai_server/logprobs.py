"""Token events as OpenAI's two logprobs formats: chat's per-token list and the legacy columns."""

from __future__ import annotations

from typing import Sequence

from sdk.protocol.engine import TokenEvent
from sdk.protocol.openai_schema import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprobEntry


def token_text(event: TokenEvent) -> str:
    """The chosen token as text; the engine's own rendering when it listed it (special tokens by name)."""
    for alt in event.top_logprobs:
        if alt.token_id == event.token_id:
            return alt.text
    return event.token_bytes.decode("utf-8", errors="replace")


def chat_logprobs(events: Sequence[TokenEvent]) -> ChatLogprobs:
    """choices[].logprobs for chat: one entry per token with its alternatives."""
    content = []
    for event in events:
        content.append(
            ChatTokenLogprob(
                token=token_text(event),
                logprob=event.logprob,
                # The raw bytes let clients rebuild characters split across tokens.
                bytes=list(event.token_bytes) if event.token_bytes else list(token_text(event).encode()),
                top_logprobs=[
                    TopLogprobEntry(
                        token=alt.text, logprob=alt.logprob, bytes=list(alt.token_bytes or alt.text.encode())
                    )
                    for alt in event.top_logprobs
                ],
            )
        )
    return ChatLogprobs(content=content)


def completion_logprobs(events: Sequence[TokenEvent], start_offset: int = 0) -> CompletionLogprobs:
    """choices[].logprobs for completions; `start_offset` continues text_offset across stream chunks.

    As in OpenAI's API the chosen token is always in its position's top_logprobs,
    so a position lists up to logprobs + 1 tokens.
    """
    out = CompletionLogprobs()
    offset = start_offset
    for event in events:
        text = token_text(event)
        top = {alt.text: alt.logprob for alt in event.top_logprobs}
        top.setdefault(text, event.logprob)
        out.tokens.append(text)
        out.token_logprobs.append(event.logprob)
        out.top_logprobs.append(top)
        out.text_offset.append(offset)
        offset += len(text)
    return out
