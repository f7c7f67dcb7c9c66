"""Whether two tiers share one vocabulary, so that token ids mean the same on both.

A request's `logit_bias` names token ids; on a routed model it reaches whichever tier
answers, so the cascade takes it only when both tiers' fingerprints are equal. The
fingerprint hashes the vocabulary's token strings in id order: llama.cpp reads them from
the GGUF (`tokenizer.ggml.tokens`), transformers from tokenizer.json, and a GGUF converted
from a checkpoint carries the checkpoint's strings, so the same tokenizer gives the same
fingerprint on either engine. One spelling differs between the two readers: a SentencePiece
vocabulary writes a space as "▁" (U+2581), and Gemma 3's GGUF stores its whitespace-run tokens
(ids 138-167) with plain spaces, which transformers' GGUF reader turns into "▁". Both mean a space
when decoded, so the fingerprint hashes every space as "▁". Anything else (another model, a padded or re-ordered
vocabulary) differs, and an unknown fingerprint ("") never matches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


SPACE_PIECE = "\u2581"  # SentencePiece's space


def vocabulary_fingerprint(tokens: Iterable[str]) -> str:
    """ "<size>:<sha256 prefix>" of the token strings, in id order (a space spelt as SentencePiece spells it)."""
    digest = hashlib.sha256()
    size = 0
    for token in tokens:
        digest.update(token.replace(" ", SPACE_PIECE).encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
        size += 1
    return f"{size}:{digest.hexdigest()[:32]}"


def same_vocabulary(a: str | None, b: str | None) -> bool:
    """Both fingerprints known and equal."""
    return bool(a) and a == b


# When a cloud gives no fingerprint (vLLM's /v1/models does not), its tokenizer is asked for the
# ids of these texts and compared with the local tokenizer's (CascadeRunner.vocabulary_verdict).
# They cover what differs between tokenizers: the merges of common English, digits (split one by
# one, or in groups of three), whitespace runs, code, markdown and JSON, accents, CJK and emoji
# (byte fallback). No special tokens: llama.cpp reads their text as plain text unless told to parse
# it, HF's tokenizers as the special token, so one vocabulary would look like two. Equal ids on all
# of them is evidence, not proof, of one vocabulary: a declared fingerprint is the stronger test and
# is used when the cloud gives one.
VOCABULARY_PROBE_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "In 1984, 3.14159 people paid $12,345.67 for 1000000 tokens.",
    "def tokenize(text):\n    return [ord(c) for c in text]  # \t tabs",
    "Ça coûte 20 €, naïve façade, Straße, привет, مرحبا, नमस्ते",
    "日本語のテキストと中文文本, 한국어 🙂🚀",
    '## Notes\n- item *bold* `code` [link](https://x.example/z?a=1&b=2) -> {"k": [1, 2]}',
    "   leading spaces, trailing spaces   ",
)


def same_token_ids(local: Iterable[Iterable[int]], cloud: Iterable[Iterable[int]] | None) -> bool | None:
    """Whether two tokenizers gave the same ids for the probe texts; None when the cloud could not say."""
    if cloud is None:
        return None
    return [list(ids) for ids in local] == [list(ids) for ids in cloud]
