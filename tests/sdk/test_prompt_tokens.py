"""Prompt tokenization off the event loop, after a byte-length pre-check (sdk.serving.prompt_tokens)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from sdk.protocol.engine import ContextLengthError
from sdk.serving.prompt_tokens import INLINE_MAX_BYTES, chat_prompt_tokens, message_text_bytes, text_prompt_tokens


class SlowTokenizer:
    """An engine's tokenizer surface that takes `seconds` per call (sleeping, as C code without the GIL would)."""

    max_token_bytes = 4
    max_model_len = 10_000

    def __init__(self, seconds: float = 0.0):
        self.seconds = seconds
        self.threads: list[str] = []

    def _work(self, num: int) -> list[int]:
        self.threads.append(threading.current_thread().name)
        time.sleep(self.seconds)
        return list(range(num))

    def apply_chat_template(self, messages) -> list[int]:
        return self._work(len(messages))

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self._work(3)


def test_message_text_bytes_counts_string_contents_and_text_parts():
    messages = [
        {"role": "user", "content": "héllo"},
        {"role": "user", "content": [{"type": "text", "text": "abc"}, {"type": "image_url"}]},
        {"role": "assistant", "content": None},
    ]
    assert message_text_bytes(messages) == 6 + 3


async def test_a_prompt_that_cannot_fit_is_refused_before_any_tokenizer_runs():
    engine = SlowTokenizer()
    too_long = "x" * (
        engine.max_model_len * engine.max_token_bytes + engine.max_token_bytes
    )  # >= max_model_len + 1 tokens
    with pytest.raises(ContextLengthError) as caught:
        await chat_prompt_tokens(engine, [{"role": "user", "content": too_long}])
    assert caught.value.param == "messages" and "at least 10001 tokens" in str(caught.value)
    with pytest.raises(ContextLengthError) as caught:
        await text_prompt_tokens(engine, too_long)
    assert caught.value.param == "prompt"
    assert engine.threads == []  # neither tokenizer was called
    fits = "x" * (engine.max_model_len * engine.max_token_bytes)  # could still be <= max_model_len tokens
    assert await text_prompt_tokens(engine, fits) == [0, 1, 2]


async def test_small_prompts_stay_on_the_loop_and_large_ones_go_to_the_pool():
    engine = SlowTokenizer()
    await chat_prompt_tokens(engine, [{"role": "user", "content": "hi"}])
    await chat_prompt_tokens(engine, [{"role": "user", "content": "x" * INLINE_MAX_BYTES}])
    await chat_prompt_tokens(
        engine, [{"role": "user", "content": "hi"}] * 100
    )  # many short messages: slow special-token pass
    await text_prompt_tokens(engine, "y" * INLINE_MAX_BYTES)
    assert engine.threads[0] == threading.current_thread().name
    assert all(name.startswith("tandem-tokenize") for name in engine.threads[1:]), engine.threads


async def test_a_slow_tokenization_does_not_stall_the_event_loop():
    engine = SlowTokenizer(seconds=0.5)
    gaps, stop = [], asyncio.Event()

    async def ticker() -> None:  # what every other stream on the loop needs: regular turns
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    await chat_prompt_tokens(engine, [{"role": "user", "content": "z" * 20_000}])
    stop.set()
    await ticking
    assert len(gaps) > 20 and max(gaps) < 0.2, f"the loop stalled for {max(gaps):.2f} s"
