"""Whether two tiers share one vocabulary, so that token ids mean the same on both.

A request's `logit_bias` names token ids; on a routed model it reaches whichever tier
answers, so the cascade takes it only when both tiers' fingerprints are equal. The
fingerprint hashes the vocabulary's token strings in id order: llama.cpp reads them from
the GGUF (`tokenizer.ggml.tokens`), transformers from tokenizer.json, and a GGUF converted
from a checkpoint carries the checkpoint's strings, so the same tokenizer gives the same
fingerprint on either engine. Anything else (another model, a padded or re-ordered
vocabulary) differs, and an unknown fingerprint ("") never matches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def vocabulary_fingerprint(tokens: Iterable[str]) -> str:
    """"<size>:<sha256 prefix>" of the token strings, in id order."""
    digest = hashlib.sha256()
    size = 0
    for token in tokens:
        digest.update(token.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
        size += 1
    return f"{size}:{digest.hexdigest()[:32]}"


def same_vocabulary(a: str | None, b: str | None) -> bool:
    """Both fingerprints known and equal."""
    return bool(a) and a == b
