"""What each request cost, per tier, in USD from per-million-token prices.

Prices are configured per deployment; the local tier defaults to free (the device's
energy is not billed) and so does the cloud until a price is set, so an unconfigured
deployment reports tokens with a cost of 0 rather than a made-up number. An escalated
request uses both tiers (the local tokens generated before escalating, then the cloud's),
so a request's usage is a breakdown by tier, summed into one total.
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

TIERS = ("local", "cloud")
TOKENS_PER_PRICE_UNIT = 1_000_000


def tier_name(tier) -> str:
    """ "local"/"cloud" from a string or a string enum (router.decision.Tier)."""
    name = getattr(tier, "value", tier)
    if name not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; known tiers: {', '.join(TIERS)}")
    return name


@dataclass(frozen=True)
class TierPrices:
    """USD per million tokens on one tier."""

    input_per_million: float = 0.0  # prompt tokens
    output_per_million: float = 0.0  # completion tokens

    def __post_init__(self):
        for name in ("input_per_million", "output_per_million"):
            value = getattr(self, name)
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (is_number and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite price >= 0 in USD per million tokens, got {value!r}")

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """USD for this many prompt and completion tokens."""
        _check_token_count("prompt_tokens", prompt_tokens)
        _check_token_count("completion_tokens", completion_tokens)
        weighted = prompt_tokens * self.input_per_million + completion_tokens * self.output_per_million
        return weighted / TOKENS_PER_PRICE_UNIT


@dataclass(frozen=True)
class CostTable:
    """Prices of both tiers."""

    local: TierPrices = field(default_factory=TierPrices)
    cloud: TierPrices = field(default_factory=TierPrices)

    @classmethod
    def from_config(cls, config: Mapping | None) -> CostTable:
        """From {"cloud": {"input_per_million": 0.5, "output_per_million": 1.5}, "local": {...}};
        a tier or price left out is free."""
        config = config or {}
        unknown_tiers = set(config) - set(TIERS)
        if unknown_tiers:
            raise ValueError(f"unknown tiers {sorted(unknown_tiers)} in cost config; known tiers: {', '.join(TIERS)}")
        prices = {}
        for tier in TIERS:
            tier_config = config.get(tier) or {}
            unknown_keys = set(tier_config) - {"input_per_million", "output_per_million"}
            if unknown_keys:
                raise ValueError(
                    f"unknown price keys {sorted(unknown_keys)} for tier {tier!r}; "
                    "use input_per_million and output_per_million (USD per million tokens)"
                )
            prices[tier] = TierPrices(**tier_config)
        return cls(**prices)

    def prices(self, tier) -> TierPrices:
        return getattr(self, tier_name(tier))

    def request_cost(self, tier, prompt_tokens: int, completion_tokens: int) -> float:
        """USD for one call to a tier."""
        return self.prices(tier).cost(prompt_tokens, completion_tokens)


@dataclass
class TierUsage:
    """Tokens and cost on one tier, for one request or accumulated."""

    num_requests: int = 0  # requests that used this tier
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def as_dict(self) -> dict:
        return {
            "num_requests": self.num_requests,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": self.cost_usd,
        }


class RequestCost:
    """One request's usage per tier: the response's `tandem` cost field."""

    def __init__(self, table: CostTable):
        self.table = table
        self.by_tier = {tier: TierUsage() for tier in TIERS}

    def add(self, tier, prompt_tokens: int, completion_tokens: int) -> float:
        """Count one call to a tier; returns its cost in USD."""
        cost = self.table.request_cost(tier, prompt_tokens, completion_tokens)
        usage = self.by_tier[tier_name(tier)]
        usage.num_requests = 1  # a request that calls a tier twice still used it once
        usage.prompt_tokens += int(prompt_tokens)
        usage.completion_tokens += int(completion_tokens)
        usage.cost_usd += cost
        return cost

    @property
    def total_cost_usd(self) -> float:
        return sum(usage.cost_usd for usage in self.by_tier.values())

    def as_dict(self) -> dict:
        """{"local": {...}, "cloud": {...}, "total_cost_usd": x}, tiers unused left out."""
        used = {tier: usage.as_dict() for tier, usage in self.by_tier.items() if usage.num_requests}
        for usage in used.values():
            del usage["num_requests"]
        return {**used, "total_cost_usd": self.total_cost_usd}


class CostLedger:
    """Totals over all requests, per tier, for metrics; a lock makes it thread-safe."""

    def __init__(self, table: CostTable | None = None):
        self.table = table or CostTable()
        self._lock = threading.Lock()
        self._totals = {tier: TierUsage() for tier in TIERS}
        self._num_requests = 0

    def new_request(self) -> RequestCost:
        """An empty per-request breakdown priced with this ledger's table."""
        return RequestCost(self.table)

    def record(self, request: RequestCost) -> None:
        """Add a finished request's usage to the totals."""
        with self._lock:
            self._num_requests += 1
            for tier, usage in request.by_tier.items():
                total = self._totals[tier]
                total.num_requests += usage.num_requests
                total.prompt_tokens += usage.prompt_tokens
                total.completion_tokens += usage.completion_tokens
                total.cost_usd += usage.cost_usd

    def totals(self) -> dict[str, TierUsage]:
        """A copy of the per-tier totals."""
        with self._lock:
            return {tier: TierUsage(**vars(usage)) for tier, usage in self._totals.items()}

    def snapshot(self) -> dict:
        """JSON-friendly totals: per tier, the overall cost and the number of requests."""
        with self._lock:
            totals = {tier: TierUsage(**vars(usage)) for tier, usage in self._totals.items()}
            num_requests = self._num_requests
        return {
            "num_requests": num_requests,
            "tiers": {tier: usage.as_dict() for tier, usage in totals.items()},
            "total_cost_usd": sum(usage.cost_usd for usage in totals.values()),
        }


def _check_token_count(name: str, value: int) -> None:
    try:  # any integer type (numpy counts included), but not floats or bools
        is_count = not isinstance(value, bool) and operator.index(value) >= 0
    except TypeError:
        is_count = False
    if not is_count:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
