"""The pre-rendered text events of a stream are the events pydantic would have rendered, byte for byte."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.openai_server.streaming import sse, sse_for_text
from sdk.protocol.openai_schema import (
    ChatChunkChoice,
    ChatCompletionChunk,
    CompletionChoice,
    CompletionResponse,
    DeltaMessage,
)


def chat_chunk(text: str) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id="chatcmpl-1",
        created=1700000000,
        model='m "quoted" é',
        choices=[ChatChunkChoice(index=3, delta=DeltaMessage(content=text))],
    )


# Text as tokens detokenize to: any character but lone surrogates (which no UTF-8 text holds), the escapes JSON
# needs (quotes, backslashes, control characters) and characters JSON may or may not escape (DEL, U+2028, non-ASCII).
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40) | st.sampled_from(
    ["", '"', "\\", "\n\t\r\b\f", "\x00\x01\x1f\x7f", "\u2028\u2029", "é中😀", "</script>", "\\u0000"]
)


@settings(max_examples=400, deadline=None)
@given(TEXT)
def test_a_text_event_is_what_pydantic_renders(text):
    assert sse_for_text(chat_chunk)(text) == sse(chat_chunk(text))


@settings(max_examples=100, deadline=None)
@given(TEXT)
def test_a_text_event_carries_the_text(text):
    event = sse_for_text(chat_chunk)(text)
    assert event.startswith("data: ") and event.endswith("\n\n")
    assert json.loads(event[len("data: ") :])["choices"][0]["delta"]["content"] == text


def test_a_model_that_renders_the_text_twice_takes_the_slow_path():
    """The split needs the text exactly once; a chunk that carries it twice is rendered whole each time."""

    def twice(text: str) -> CompletionResponse:
        return CompletionResponse(
            id="cmpl-1",
            created=1,
            model="m",
            choices=[CompletionChoice(index=0, text=text), CompletionChoice(index=1, text=text)],
        )

    assert sse_for_text(twice)('ab"c') == sse(twice('ab"c'))
