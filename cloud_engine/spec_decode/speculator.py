"""Speculative decoding inside the cloud engine's step: drafts proposed after a step, verified
in the next one.

`Speculator` owns what speculation adds to the engine: the proposer (n-gram or draft model),
the policy that sizes each request's draft, the draft distributions awaiting verification and
the acceptance counters. The engine's step calls `propose` after its tokens are final and
`verify` for each request whose batch rows carried a draft (k + 1 logits rows).
"""

from __future__ import annotations

import math
from collections.abc import Collection

import numpy as np
import torch

from cloud_engine.request import Request
from cloud_engine.sampler import token_signals
from cloud_engine.spec_decode.config import SpeculativeConfig
from cloud_engine.spec_decode.outside_drafts import SparseDraftProbs
from sdk.protocol.drafts import OutsideDraft
from cloud_engine.spec_decode.policy import SpeculationPolicy
from cloud_engine.spec_decode.rejection import verify_draft
from cloud_engine.spec_decode.stats import SpecDecodeStats
from sdk.engine_common.grammar import GrammarMasks


class Speculator:
    """Drafts and their verification for one engine (no proposer when speculation is off:
    the counters still answer, with zeros)."""

    def __init__(
        self,
        engine,
        config: SpeculativeConfig,
        max_model_len: int,
        grammar: GrammarMasks,
        eos_token_ids: Collection[int],
    ):
        self.config = config
        self.max_model_len = max_model_len
        self.grammar = grammar
        self.eos_token_ids = eos_token_ids
        self.stats = SpecDecodeStats()
        self.policy = SpeculationPolicy(config, max_model_len)
        self.proposer = _build_proposer(engine, config) if config.enabled else None
        # request id -> q of its pending draft: [k, vocab] from the own draft model, sparse from a caller's
        self.draft_probs: dict[str, torch.Tensor | SparseDraftProbs] = {}

    # -- drafts made outside (cloud_engine.spec_decode.outside_drafts) ----------------------

    def offer(self, request: Request, draft: OutsideDraft) -> str | None:
        """Take a draft another model made for `request`, to verify in the next step; None when taken,
        else why not (the request keeps decoding on its own either way). From the first draft on (a drafted
        request's, GenerationRequest.drafted: from its start), the engine's own proposer leaves it alone."""
        request.outside_drafts = True
        self.draft_probs.pop(request.request_id, None)  # a pending draft is replaced by the newer one
        request.spec_token_ids = []
        params = request.params
        if params.uses_token_history or params.logit_bias:
            return "sampling_uses_token_history"  # penalties and bias make the rule inexact, as for own drafts
        if request.num_computed_tokens != request.num_tokens - 1:
            return "not_decoding"  # still prefilling (or preempted): the next draft may land
        emitted = request.output_token_ids
        overlap = len(emitted) - draft.start
        if overlap < 0:
            return "ahead_of_the_output"
        tokens, support = list(draft.token_ids), draft.support
        if overlap >= len(tokens):
            return "stale"
        if tokens[:overlap] != list(emitted[draft.start :]):
            return "disagrees_with_the_output"
        tokens = tokens[overlap:][: max(0, request.tokens_left(self.max_model_len) - 1)]
        support = support[overlap : overlap + len(tokens)] if support is not None else None
        if request.matcher is not None:  # only the prefix the grammar accepts can be verified
            if request.matcher.near_budget(request.tokens_left(self.max_model_len)):
                return "grammar_must_close"
            tokens = tokens[: request.matcher.validate_tokens(tokens)]
            support = support[: len(tokens)] if support is not None else None
        if not tokens:
            return "no_room" if request.matcher is None else "grammar_refused_the_draft"
        request.spec_token_ids = tokens
        if support is not None and not params.is_greedy:
            self.draft_probs[request.request_id] = SparseDraftProbs(support)  # its support only: never vocab-wide
        return None

    def free(self, request_id: str) -> None:
        """Drop a finished request's drafts, policy state and proposer state."""
        self.draft_probs.pop(request_id, None)
        self.policy.free(request_id)
        if self.proposer is not None:
            self.proposer.free(request_id)

    # -- after a step: drafts for the next --------------------------------------------------

    def propose(self, running: list[Request]) -> None:
        """Drafts for the next step, for requests about to decode (their last token not yet computed)."""
        if self.proposer is None:
            return
        decoding = [r for r in running if r.num_computed_tokens == r.num_tokens - 1 and not r.outside_drafts]
        plan = self.policy.num_draft_tokens(decoding)
        if not plan:
            return
        drafts = self.proposer.propose([r for r in decoding if r.request_id in plan], plan)
        for request in decoding:
            draft = drafts.get(request.request_id)
            if draft is None:
                continue
            request.spec_token_ids, probs = list(draft[0]), draft[1]
            if request.matcher is not None:  # only the prefix the grammar accepts can be verified
                if request.matcher.near_budget(request.tokens_left(self.max_model_len)):
                    continue  # the answer may have to close: one token a step, each under the budget's mask
                request.spec_token_ids = request.spec_token_ids[
                    : request.matcher.validate_tokens(request.spec_token_ids)
                ]
                probs = probs[: len(request.spec_token_ids)] if probs is not None else None
                if not request.spec_token_ids:
                    continue
            if probs is not None:
                self.draft_probs[request.request_id] = probs

    # -- in a step: a draft's k + 1 rows -> the tokens it yields ----------------------------

    def verify(self, request: Request, rows: torch.Tensor, draft: list[int], generator: torch.Generator) -> list:
        """The request's new tokens (SampledToken) from its draft's rows: the accepted prefix and the
        target's own token, cut at a token-level stop. Signals and logprobs stay the model's own
        (the raw rows, not the grammar-masked ones)."""
        probs = self.draft_probs.pop(request.request_id, None)
        verified = self._masked_by_grammar(request, rows, draft) if request.matcher is not None else rows
        ids = verify_draft(
            verified, draft, probs[: len(draft)] if probs is not None else None, request.params, generator
        )
        num_accepted = len(ids) - 1
        self.stats.record(len(draft), num_accepted)
        self.policy.record(request.request_id, len(draft), num_accepted)
        request.num_draft_tokens += len(draft)
        request.num_accepted_tokens += num_accepted
        ids = self.cut_at_token_stop(request, ids)
        return token_signals(rows[: len(ids)], torch.tensor(ids, device=rows.device), [request.params] * len(ids))

    def _masked_by_grammar(self, request: Request, rows: torch.Tensor, draft: list[int]) -> torch.Tensor:
        """The target's k + 1 rows of a structured request, each masked by the grammar's state
        after the draft tokens before it (the matcher walks the draft, then rolls back: the
        tokens actually emitted are consumed when the engine finishes them). The draft fits the
        grammar (propose cut it), so verification samples exactly the masked distribution."""
        matcher, masks = request.matcher, []
        for token in draft:
            masks.append(self.grammar.allowed(matcher))
            matcher.consume_token(token)
        masks.append(self.grammar.allowed(matcher))
        matcher.rollback(len(draft))
        request.forced = [self.grammar.forces(mask) for mask in masks]
        allowed = torch.from_numpy(np.stack(masks)).to(rows.device)
        return rows.masked_fill(~allowed, -math.inf)

    def cut_at_token_stop(self, request: Request, ids: list[int]) -> list[int]:
        """Tokens past an end-of-generation/stop token, max_tokens or max_model_len are never emitted."""
        params = request.params
        ids = ids[: max(1, request.tokens_left(self.max_model_len))]
        for index, token_id in enumerate(ids):
            if (not params.ignore_eos and token_id in self.eos_token_ids) or token_id in params.stop_token_ids:
                return ids[: index + 1]
        return ids


def _build_proposer(engine, config: SpeculativeConfig):
    if config.method == "ngram":
        from cloud_engine.spec_decode.ngram import NgramProposer

        return NgramProposer(config.ngram_max, config.ngram_min)
    from cloud_engine.spec_decode.draft_model import DraftModelProposer

    return DraftModelProposer(engine, config)
