"""Prompt lookup (n-gram) drafting: no model. The last n tokens of a request are looked up
earlier in its own tokens (prompt and output so far); the tokens that followed the latest
such match are the draft. Input-grounded tasks (extract, repeat, edit a passage) copy long
runs, which this predicts well; open-ended text rarely matches and costs nothing then."""

from __future__ import annotations

from cloud_engine.request import Request


def find_continuation(tokens: list[int], k: int, ngram_max: int, ngram_min: int) -> list[int]:
    """Up to k tokens following an earlier occurrence of the longest suffix n-gram (n from
    ngram_max down to ngram_min): the latest occurrence that has k tokens after it, else the
    one with the most (a match just behind the suffix, as in a run of one repeated token, is
    followed by the suffix itself only). [] when nothing matches."""
    length = len(tokens)
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        suffix = tokens[length - n :]
        first, best = suffix[0], []
        for start in range(length - n - 1, -1, -1):  # latest first: likeliest to continue the current copy
            if tokens[start] == first and tokens[start : start + n] == suffix:
                follow = tokens[start + n : start + n + k]
                if len(follow) > len(best):
                    best = follow
                    if len(best) == k:
                        break
        if best:
            return best
    return []


class NgramProposer:
    """Drafts from each request's own tokens; one-hot draft probabilities (q is None)."""

    def __init__(self, ngram_max: int, ngram_min: int, max_lookback: int = 4096):
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self.max_lookback = max_lookback  # bounds the scan's cost on very long contexts

    def propose(self, requests: list[Request], num_tokens: dict[str, int]) -> dict[str, tuple[list[int], None]]:
        drafts = {}
        for request in requests:
            k = num_tokens.get(request.request_id, 0)
            if k <= 0:
                continue
            tokens = request.all_token_ids[-self.max_lookback :]
            draft = find_continuation(tokens, k, self.ngram_max, self.ngram_min)
            if draft:
                drafts[request.request_id] = (draft, None)
        return drafts

    def free(self, request_id: str) -> None:
        pass
