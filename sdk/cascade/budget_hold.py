"""What one cascade request holds against its key's (and user's) budgets (sdk.budgets.manager):
the cloud call's largest cost reserved before the call is made, settled at what it cost."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

from router.costs import RequestCost
from sdk.budgets.manager import BudgetManager, Verdict

CLOUD_PROMPT_MARGIN = 1.25  # a budget reservation's allowance for the cloud's tokenizer splitting the prompt finer


class BudgetHold:
    """One request's reservation; a no-op on a runner without budgets."""

    def __init__(self, budgets: BudgetManager | None, key_fingerprint: str | None, user: str | None):
        self.budgets, self.key_fingerprint, self.user = budgets, key_fingerprint, user
        self.reservation = None  # the cloud cost held against the budgets before the cloud is called
        self.refused: Verdict | None = None  # the Verdict that kept this request from the cloud
        self.settled = False

    async def refusal(
        self, num_prompt_tokens: Callable[[], Awaitable[int]], cost: RequestCost, max_tokens: int, cloud_only: bool
    ) -> str | None:
        """Hold the cloud call's largest cost before it is made; "budget_exhausted" when it does not fit.
        Exact under concurrency: every reservation is taken atomically against what is spent and what
        others hold (sdk.budgets.manager). StateUnavailableError while the replicas' state database is away
        (or this replica is fenced from it): the caller decides between a 503 and the local answer.
        `cloud_only`: the request asked for the cloud (refused) rather than
        escalating to it (kept local), as the budgets' counters tell apart."""
        if self.budgets is None or self.reservation is not None:
            return None
        self.refused = verdict = await self.budgets.verdict(self.key_fingerprint, self.user)
        if not verdict.exhausted:
            largest = cost.table.request_cost(
                "cloud", math.ceil(await num_prompt_tokens() * CLOUD_PROMPT_MARGIN), max_tokens
            )
            self.reservation, breach = await self.budgets.reserve(self.key_fingerprint, self.user, largest)
            if self.reservation is not None:
                return None
            self.refused = Verdict(hard=(breach,))
        self.budgets.count(self.refused, "refused" if cloud_only else "kept_local")
        return "budget_exhausted"

    @property
    def holds(self) -> bool:
        """Whether the cloud call may go on spending against the reservation (sdk.budgets.manager.holds)."""
        return self.budgets is None or self.budgets.holds(self.reservation)

    def settle(self, cost: RequestCost) -> None:
        """Release the reservation for what the request cost (once; also when the client left part-way)."""
        if self.budgets is None or self.settled:
            return
        self.settled = True
        tokens = {tier: usage.prompt_tokens + usage.completion_tokens for tier, usage in cost.by_tier.items()}
        self.budgets.settle(
            self.reservation,
            self.key_fingerprint,
            self.user,
            cost.total_cost_usd,
            tokens.get("cloud", 0),
            sum(tokens.values()),
        )
