"""Prompt tokenization that never holds up the event loop every stream is served from.

A body near the size limit can take a tokenizer over a second (llama.cpp's special-token pass
over 10,000 short chat messages: 1.3 s on 2 cores), and on the event loop that second stalls
every other stream. So, per prompt:

1. On the loop, a pre-check in O(bytes): a text of B bytes is at least B / `max_token_bytes`
   tokens (no token stands for more), so a prompt whose text alone cannot fit `max_model_len`
   is refused at once (ContextLengthError naming the field), before any tokenizer runs.
2. A small prompt (under INLINE_MAX_BYTES of text) is tokenized on the loop: a millisecond,
   less than a thread hop, and it never queues behind large ones.
3. A larger one goes to a pool of TOKENIZER_THREADS threads run at a lower CPU priority
   (nice +TOKENIZER_NICE on Linux), so tokenizing a large body neither stalls the loop nor
   takes a core from the engine's decode threads on a small machine; llama.cpp's and HF's
   tokenizers run in C/Rust without the GIL. Both tokenizers only read their vocabulary, so
   they may run while the engine thread decodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from sdk.protocol.engine import ContextLengthError

INLINE_MAX_BYTES = 4096  # text below this is tokenized on the loop
LARGE_BODY_BYTES = 64 * 1024  # request bodies above this are parsed on the pool too
TOKENIZER_THREADS = 2
TOKENIZER_NICE = 19  # CFS weight 15 against the decode threads' 1024

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _lower_priority() -> None:
    """Pool thread initializer: this thread only (Linux schedules threads as tasks)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), TOKENIZER_NICE)


def tokenizer_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                TOKENIZER_THREADS, thread_name_prefix="tandem-tokenize", initializer=_lower_priority
            )
        return _pool


async def off_loop(function, *args):
    """`function(*args)` on the low-priority pool: for work on large request bodies (parsing one
    holds the GIL, but a thread lets the loop take its turns every switch interval)."""
    return await asyncio.get_running_loop().run_in_executor(tokenizer_pool(), function, *args)


def message_text_bytes(messages: Sequence[dict]) -> int:
    """Bytes of the text the messages carry (string contents and text parts): a lower bound of
    the rendered prompt's, which adds the template's own text."""
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += len(content.encode("utf-8", "surrogatepass"))
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                if isinstance(text, str):
                    total += len(text.encode("utf-8", "surrogatepass"))
    return total


def check_fits(engine, num_bytes: int, param: str) -> None:
    """ContextLengthError when `num_bytes` of text cannot fit the engine's max_model_len."""
    max_token_bytes, max_model_len = engine.max_token_bytes, engine.max_model_len
    if not max_token_bytes or not max_model_len:
        return  # an engine that cannot bound it (not loaded yet): its own checks run later
    min_tokens = num_bytes // max_token_bytes
    if min_tokens > max_model_len:
        raise ContextLengthError(
            f"This model's maximum context length is {max_model_len} tokens. However, your {param} "
            f"{'comes' if param == 'prompt' else 'come'} to at least {min_tokens} tokens. "
            f"Please reduce the length of the {param}.",
            param,
        )


async def chat_prompt_tokens(engine, messages: Sequence[dict]) -> list[int]:
    """engine.apply_chat_template(messages), pre-checked and off the loop when large (module docstring)."""
    num_bytes = message_text_bytes(messages)
    check_fits(engine, num_bytes, "messages")
    if num_bytes < INLINE_MAX_BYTES and len(messages) < 64:
        return list(engine.apply_chat_template(messages))
    return list(await off_loop(engine.apply_chat_template, messages))


async def text_prompt_tokens(engine, text: str, add_special: bool = True) -> list[int]:
    """engine.tokenize(text), pre-checked and off the loop when large."""
    num_bytes = len(text.encode("utf-8", "surrogatepass"))
    check_fits(engine, num_bytes, "prompt")
    if num_bytes < INLINE_MAX_BYTES:
        return list(engine.tokenize(text, add_special))
    return list(await off_loop(engine.tokenize, text, add_special))
