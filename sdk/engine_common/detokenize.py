"""Token ids back to text, as an engine renders them in answers (POST /detokenize)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sdk.protocol.engine import InvalidRequestError


def detokenize(token_ids: Sequence[int], vocab_size: int, token_bytes: Callable[[int], bytes]) -> str:
    """The UTF-8 text of the tokens' bytes (a character split across tokens is joined; bytes that
    are not UTF-8 become U+FFFD). InvalidRequestError names the first id outside the vocabulary."""
    for index, token_id in enumerate(token_ids):
        if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < vocab_size:
            raise InvalidRequestError(
                f"tokens[{index}] = {token_id!r} is not a token id of this model (0..{vocab_size - 1})",
                f"tokens[{index}]",
            )
    return b"".join(token_bytes(token_id) for token_id in token_ids).decode("utf-8", errors="replace")
