"""Speculative decoding in the cloud engine: a proposer drafts k tokens per decoding request,
the target verifies them inside the normal step, and rejection sampling keeps the target's
exact output distribution (greedy: token-for-token identical).

    config.py    SpeculativeConfig and the `--speculative ngram|draft:PATH|off` parser
    ngram.py     prompt lookup: the continuation of the latest earlier match of the last n tokens
    draft_model.py  a smaller model with the target's tokenizer, its own paged KV cache
    rejection.py verification (greedy prefix match; Leviathan/Chen rejection sampling)
    policy.py    the adaptive k per request and step (off at large batch or low acceptance)
    stats.py     vLLM-named counters: drafts, draft tokens, accepted tokens, per position
"""

from cloud_engine.spec_decode.config import SpeculativeConfig, parse_speculative

__all__ = ["SpeculativeConfig", "parse_speculative"]
