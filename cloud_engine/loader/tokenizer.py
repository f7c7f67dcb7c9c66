"""Tokenizers (HF, from a model directory or a GGUF file), end-of-generation ids, BOS handling."""

from __future__ import annotations

import os
from collections.abc import Iterable

from cloud_engine.loader.hf import InvalidModelError

# Special tokens that end an assistant turn in the chat formats we know; counted as
# end-of-generation when the tokenizer registers them as special, like llama.cpp does.
END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<|end|>",
)


def load_hf_tokenizer(model_dir: str):
    """The directory's tokenizer (tokenizer.json / tokenizer_config.json)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as exc:
        raise InvalidModelError(
            f"could not load a tokenizer from {model_dir}: {exc}; "
            "the directory needs tokenizer.json or tokenizer_config.json"
        ) from exc


def load_gguf_tokenizer(gguf_path: str):
    """The tokenizer embedded in a GGUF file, converted by transformers (once per file: the
    conversion took ~9 s for SmolLM2's vocabulary on 2 cores, so its result is cached)."""
    from cloud_engine.loader.gguf_cache import load_cached_tokenizer, store_tokenizer

    cached = load_cached_tokenizer(gguf_path)
    if cached is not None:
        return cached
    from transformers import AutoTokenizer

    folder, name = os.path.split(os.path.abspath(gguf_path))
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (OSError, ValueError, KeyError) as exc:
        raise InvalidModelError(f"transformers could not convert the tokenizer in {gguf_path}: {exc}") from exc
    store_tokenizer(gguf_path, tokenizer)
    return tokenizer


def tokenizer_vocabulary(tokenizer) -> list[str]:
    """The token strings in id order, added tokens included (sdk.protocol.vocabulary hashes them)."""
    return tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))


def end_of_generation_ids(tokenizer, declared_ids: Iterable[int], bos_token_id: int | None) -> set[int]:
    """Declared eos ids, the tokenizer's eos, and registered end-of-turn specials (never BOS)."""
    ids = {int(i) for i in declared_ids}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    for token_id, token in tokenizer.added_tokens_decoder.items():
        if token.special and token.content in END_OF_TURN_TOKENS and token_id != bos_token_id:
            ids.add(int(token_id))
    return ids


def tokenizer_adds_bos(tokenizer) -> bool:
    """Whether the tokenizer puts BOS in front when asked for special tokens (HF model directories)."""
    bos = tokenizer.bos_token_id
    return bos is not None and tokenizer.encode("a", add_special_tokens=True)[:1] == [bos]


def encode_prompt(
    tokenizer, text: str, add_bos: bool, bos_token_id: int | None, parse_special: bool = True
) -> list[int]:
    """Token ids for `text`, with BOS in front once when the model wants it (templates may write it already).

    parse_special=True turns special-token text such as "<|im_start|>" into its id (rendered
    chat prompts); False encodes it as plain text (raw completion prompts from users).
    """
    ids = tokenizer(text, add_special_tokens=False, split_special_tokens=not parse_special)["input_ids"]
    if add_bos and bos_token_id is not None and ids[:1] != [bos_token_id]:
        ids = [bos_token_id, *ids]
    return list(ids)
