"""Budgets on a server that answers only on the cloud (`tandem cloud serve`'s hosted API): an
engine wrapper that bills each request to its caller (GenerationRequest.caller), so the HTTP
and the gRPC listener, which share the wrapped engine, share one budget per key.

Per request: before the engine sees it, its largest cost (its prompt tokens, counted by the
engine's own tokenizer, plus max_tokens, at the server's prices) is reserved against each hard
USD limit of the key and user (sdk.budgets.manager: the bound under concurrency); a request
that does not fit raises BudgetExhaustedError (HTTP 429 insufficient_quota, gRPC
RESOURCE_EXHAUSTED). When its stream ends, however it ends (finished, failed, the client gone),
the reservation is released and the real cost recorded: the prompt once the engine has
answered with a first token, and each token generated. That is the usage the response
reports, so the ledger and the responses agree token for token.

A drafted request (GenerationRequest.drafted: its caller drafts for it over GenerateWithDrafts) also
pays for the draft tokens the engine verified for it, at the input price: each is a row of the
model's pass like a prompt token, whether the target accepts it or not. Its largest cost reserves
the most the engine can verify for it (sdk.protocol.drafts.most_verified_draft_tokens), so the bound
under concurrency holds; the settle bills what was verified (TokenEvent.num_draft_tokens). The
engine's own speculation is its own business and is never billed. The spend's token counts stay
the usage the response reports (prompt and completion tokens).

Cloud-share limits mean nothing here (every token is a cloud token) and are refused at start
(sdk.budgets.manager.require_usd_only).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from router.costs import TierPrices
from sdk.protocol.drafts import most_verified_draft_tokens
from sdk.budgets.manager import BudgetExhaustedError, BudgetManager, Verdict
from sdk.protocol.engine import (
    Caller,
    EngineProtocol,
    GenerationRequest,
    StateUnavailableError,
    TokenEvent,
    output_tokens_after,
)
from sdk.serving.engine_wrapper import EngineWrapper


FENCED = (
    "this replica lost touch with the state database that keeps the budgets, so it stopped this answer before its "
    "budget reservation could lapse; retry (another replica may answer)"
)


class BudgetedEngine(EngineWrapper):
    """`engine`, with every generation billed to its caller's budgets."""

    def __init__(self, engine: EngineProtocol, budgets: BudgetManager, prices: TierPrices):
        super().__init__(engine)
        self.budgets = budgets
        self.prices = prices

    bills_callers = True

    async def soft_warning(self, caller: Caller) -> str | None:
        """The soft-budget warning for this caller, if any (counted; sdk.budgets.manager)."""
        return await self.budgets.soft_warning(caller.key_fingerprint, caller.user)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        caller = request.caller or Caller()
        num_prompt = len(request.prompt_token_ids) if caller.bills_prompt else 0
        # A drafted request's verification rows are billed at the input price: reserve the most it may verify.
        most_drafts = (
            most_verified_draft_tokens(request.params.max_tokens, self.engine.max_draft_tokens)
            if request.drafted
            else 0
        )
        largest = self.prices.cost(num_prompt + most_drafts, request.params.max_tokens)
        reservation, breach = await self.budgets.reserve(caller.key_fingerprint, caller.user, largest)
        if breach is not None:
            refused = Verdict(hard=(breach,))
            self.budgets.count(refused, "refused")
            raise BudgetExhaustedError(refused)
        prompt_tokens = generated = drafts = 0
        try:
            async with contextlib.aclosing(self.engine.generate(request)) as events:  # closed: the engine aborts
                async for event in events:
                    if not self.budgets.holds(reservation):
                        # This replica is fenced from the shared books (sdk.state.lease): stop spending before the
                        # other replicas may delete the reservation this stream spends against.
                        raise StateUnavailableError(FENCED)
                    prompt_tokens = num_prompt  # the engine has computed the prompt
                    generated = output_tokens_after(event, generated)  # as the response's usage counts
                    drafts = event.num_draft_tokens if request.drafted else 0  # the caller's drafts verified so far
                    yield event
        finally:  # also when the client left or the engine failed: what was computed is billed
            usd = self.prices.cost(prompt_tokens + drafts, generated)
            self.budgets.settle(
                reservation,
                caller.key_fingerprint,
                caller.user,
                usd,
                prompt_tokens + generated,
                prompt_tokens + generated,
            )
