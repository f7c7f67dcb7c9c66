"""Budget decisions for one server: is this key (and its user) over a limit, what to tell it,
and what it spent. The budgets file is re-read when its modification time changes (a bad
edit is logged and the previous budgets stay).

The bound under concurrency: before a request calls the cloud, its largest possible cloud cost
(the prompt, counted by the local tokenizer with a 25% margin for the cloud's, plus max_tokens,
at the cloud's prices) is reserved against each hard USD limit of its key and user, atomically
(on the event loop in one process's ledger, in one transaction in the state database replicas
share: sdk.budgets.postgres_ledger); the call is made only if spent + reserved + it fits. When the request ends, the
reservation is released and the real cost added. So a period's spend stays within the limit,
unless a cloud counts a prompt at more than 1.25x the local tokenizer's tokens (then by that
excess). Cloud-share limits are checked when a call starts: concurrent calls may pass a share
limit by what they add (tests/budgets pins both with 200 concurrent requests).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sdk.budgets.config import BudgetConfig, BudgetConfigError, Limit, Limits, load_budgets
from sdk.budgets.ledger import Ledger, Reservation, Shortfall, Spend, SpendLedger, key_scope, periods, user_scope
from sdk.data_dir import data_path
from sdk.protocol.engine import QuotaExceededError

if TYPE_CHECKING:
    from sdk.state.database import StateDatabase

logger = logging.getLogger("tandem.budgets")

RELOAD_CHECK_S = 2.0  # how often the file's modification time is looked at


@dataclass(frozen=True)
class Breach:
    scope: str  # "key" or "user"
    limit: Limit
    spent: float  # USD, or the cloud share
    held: float = 0.0  # USD reserved by requests in flight (a refused reservation)
    wanted: float = 0.0  # USD the refused request would have reserved

    def describe(self) -> str:
        if self.wanted:
            return (
                f"{self.scope} budget {self.limit.name} cannot hold this request's largest cloud cost "
                f"({self.wanted:.4f} USD: {self.spent:.4f} spent and {self.held:.4f} held by requests in flight, "
                f"of {self.limit.value:g} this {self.limit.period}, UTC)"
            )
        what = (
            f"{self.spent:.4f} USD of {self.limit.value:g}"
            if self.limit.kind == "usd"
            else f"cloud share {self.spent:.3f} of {self.limit.value:g}"
        )
        return f"{self.scope} budget {self.limit.name} reached ({what} this {self.limit.period}, UTC)"


@dataclass(frozen=True)
class Verdict:
    hard: tuple[Breach, ...] = ()
    soft: tuple[Breach, ...] = ()

    @property
    def exhausted(self) -> bool:
        return bool(self.hard)

    def describe_soft(self) -> str:
        return "; ".join(breach.describe() for breach in self.soft)


class BudgetExhaustedError(QuotaExceededError):
    """A request that needs the cloud from a key (or user) over a hard budget: HTTP 429 insufficient_quota."""

    def __init__(self, verdict: Verdict):
        self.verdict = verdict
        super().__init__(
            "; ".join(breach.describe() for breach in verdict.hard) + ": the cloud tier takes no more requests "
            "from this key until the period ends (GET /v1/budget says what is left); "
            "model auto still answers on the device"
        )


@dataclass
class BudgetCounts:
    refused: int = 0  # model cloud: 429
    kept_local: int = 0  # model auto: answered locally
    soft_warnings: int = 0
    reloads: int = 0
    failed_reloads: int = 0
    by_limit: dict[str, int] = field(default_factory=dict)


class BudgetManager:
    def __init__(
        self,
        budgets_path: str,
        ledger: Ledger,
        prices_are_zero: bool,
        clock: Callable[[], float] = time.monotonic,
        cloud_only: bool = False,
    ):
        self.path = budgets_path
        self.ledger = ledger
        self.prices_are_zero = prices_are_zero
        self.cloud_only = cloud_only  # a server that answers only on the cloud (require_usd_only)
        self.clock = clock
        self.counts = BudgetCounts()
        self.config = self._checked(load_budgets(budgets_path))  # BudgetConfigError before serving starts
        self._mtime = os.stat(budgets_path).st_mtime_ns
        self._checked_at = clock()

    def _checked(self, config: BudgetConfig) -> BudgetConfig:
        return check_config(config, self.prices_are_zero, self.cloud_only)

    def maybe_reload(self) -> None:
        now = self.clock()
        if now - self._checked_at < RELOAD_CHECK_S:
            return
        self._checked_at = now
        try:
            mtime = os.stat(self.path).st_mtime_ns
            if mtime == self._mtime:
                return
            self._mtime = mtime
            self.config = self._checked(load_budgets(self.path))
            self.counts.reloads += 1
            logger.info("budgets reloaded from %s", self.path)
        except (OSError, BudgetConfigError) as exc:
            self.counts.failed_reloads += 1
            logger.error("budgets file %s not reloaded (the previous budgets stay): %s", self.path, exc)

    def _limits(self, key: str | None, user: str | None) -> list[tuple[str, str, Limits]]:
        scopes = [("key", key_scope(key), self.config.for_key(key))]
        if user:
            scopes.append(("user", user_scope(key, user), self.config.per_user))
        return scopes

    async def _spends(self, key: str | None, user: str | None) -> dict[tuple[str, str], Spend]:
        """What each scope of this key and user spent in each current period its limits name (one read)."""
        current = periods(self.ledger.clock())
        pairs = {
            (scope, current[limit.period]) for _, scope, limits in self._limits(key, user) for limit in limits.limits
        }
        return await self.ledger.spends(sorted(pairs))

    async def verdict(self, key: str | None, user: str | None, *, soft_only: bool = False) -> Verdict:
        """The limits of this key (and user) already reached; `soft_only`: only the soft ones are
        looked at (no read at all when it has none: the spend ledger may be a network away)."""
        self.maybe_reload()
        current = periods(self.ledger.clock())
        named = [
            (name, scope, limit)
            for name, scope, limits in self._limits(key, user)
            for limit in limits.limits
            if not (soft_only and limit.hard)
        ]
        if not named:
            return Verdict()
        spends = await self.ledger.spends(sorted({(scope, current[limit.period]) for _, scope, limit in named}))
        hard, soft = [], []
        for name, scope, limit in named:
            spend = spends.get((scope, current[limit.period]), Spend())
            spent = spend.usd if limit.kind == "usd" else spend.cloud_share
            if spent >= limit.value and (limit.kind == "usd" or spend.total_tokens):
                (hard if limit.hard else soft).append(Breach(name, limit, spent))
        return Verdict(tuple(hard), tuple(soft))

    async def soft_warning(self, key: str | None, user: str | None) -> str | None:
        """What the `x-tandem-budget-warning` header says: each soft limit this key (or user) has
        reached, counted as warned; None when none is."""
        soft = await self.verdict(key, user, soft_only=True)
        if not soft.soft:
            return None
        self.count(soft, "warned")
        return soft.describe_soft()

    def count(self, verdict: Verdict, outcome: str) -> None:
        """Count what a verdict did to a request: "refused", "kept_local" or "warned"."""
        if outcome == "refused":
            self.counts.refused += 1
        elif outcome == "kept_local":
            self.counts.kept_local += 1
        elif outcome == "warned":
            self.counts.soft_warnings += 1
        for breach in verdict.hard + verdict.soft:
            self.counts.by_limit[f"{breach.scope}:{breach.limit.name}"] = (
                self.counts.by_limit.get(f"{breach.scope}:{breach.limit.name}", 0) + 1
            )

    async def reserve(self, key: str | None, user: str | None, usd: float) -> tuple[Reservation | None, Breach | None]:
        """Hold `usd` (a cloud call's largest cost) against every hard USD limit of the key and user:
        (the reservation, None), or (None, the limit it would break). A hard cloud-share limit already
        reached refuses too (shares are checked when a call starts, not reserved)."""
        self.maybe_reload()
        current = periods(self.ledger.clock())
        hard = [(name, scope, limit) for name, scope, limits in self._limits(key, user) for limit in limits.limits]
        hard = [(name, scope, limit) for name, scope, limit in hard if limit.hard]
        shares = [(name, scope, limit) for name, scope, limit in hard if limit.kind == "cloud_share"]
        if shares:
            spends = await self.ledger.spends(sorted({(scope, current[limit.period]) for _, scope, limit in shares}))
            for name, scope, limit in shares:
                spend = spends[(scope, current[limit.period])]
                if spend.total_tokens and spend.cloud_share >= limit.value:
                    return None, Breach(name, limit, spend.cloud_share)
        usd_limits = [(name, scope, limit) for name, scope, limit in hard if limit.kind == "usd"]
        checks = [((scope, current[limit.period]), limit.value) for _, scope, limit in usd_limits]
        outcome = await self.ledger.reserve(checks, usd)
        if isinstance(outcome, Shortfall):
            name, _, limit = usd_limits[outcome.index]
            return None, Breach(name, limit, outcome.spent, outcome.held, usd)
        return outcome, None

    def settle(
        self,
        reservation: Reservation | None,
        key: str | None,
        user: str | None,
        usd: float,
        cloud_tokens: int,
        total_tokens: int,
    ) -> None:
        """A request has ended: release what it held and add what it cost (never waits)."""
        self.ledger.settle(reservation, self._scopes(key, user), usd, cloud_tokens, total_tokens)

    def holds(self, reservation: Reservation | None) -> bool:
        """Whether the stream a reservation was taken for may go on spending (checked at each of its tokens):
        False once the shared books fence this replica, so it stops before its reservations can be swept."""
        return self.ledger.holds(reservation)

    def record(self, key: str | None, user: str | None, usd: float, cloud_tokens: int, total_tokens: int) -> None:
        self.ledger.record(self._scopes(key, user), usd, cloud_tokens, total_tokens)

    @staticmethod
    def _scopes(key: str | None, user: str | None) -> list[str]:
        return [key_scope(key)] + ([user_scope(key, user)] if user else [])

    async def status(self, key: str | None, user: str | None) -> dict:
        """GET /v1/budget: per scope and limit, the limit, what was spent and what is left."""
        self.maybe_reload()
        spends, current = await self._spends(key, user), periods(self.ledger.clock())
        out = {"object": "budget", "key_fingerprint": key, "user": user, "scopes": []}
        for name, scope, limits in self._limits(key, user):
            entries = []
            for limit in limits.limits:
                spend = spends.get((scope, current[limit.period]), Spend())
                spent = spend.usd if limit.kind == "usd" else spend.cloud_share
                entries.append(
                    {
                        "limit": limit.name,
                        "period": limit.period,
                        "value": limit.value,
                        "spent": spent,
                        "remaining": max(0.0, limit.value - spent),
                        "exhausted": spent >= limit.value,
                        "requests": spend.requests,
                    }
                )
            out["scopes"].append({"scope": name, "limits": entries})
        return out


def default_spend_path() -> str:
    """$TANDEM_DATA_DIR/spend.sqlite3, else ~/.local/share/tandem/spend.sqlite3."""
    return data_path("spend.sqlite3")


def require_prices(config: BudgetConfig, prices_are_zero: bool) -> BudgetConfig:
    """`config`, unless it sets USD budgets while every request costs 0 USD (BudgetConfigError says so)."""
    if config.uses_usd and prices_are_zero:
        raise BudgetConfigError(
            f"{config.source} sets USD budgets, but the cloud tier's prices are 0, so every request costs 0 USD and "
            "no USD budget could ever be reached: set [cascade.prices] cloud (tandem serve) or "
            "--price-input-per-million / --price-output-per-million (tandem cloud serve), or budget by cloud_share"
        )
    return config


def require_usd_only(config: BudgetConfig) -> BudgetConfig:
    """`config`, unless it sets cloud-share limits, which a server answering only on the cloud
    (`tandem cloud serve`) cannot apply: every token there is a cloud token."""
    scopes = [("[default]", config.default), ("[per_user]", config.per_user)]
    scopes += [(f"[keys.{fingerprint}]", limits) for fingerprint, limits in config.keys.items()]
    for where, limits in scopes:
        shares = [limit.name for limit in limits.limits if limit.kind == "cloud_share"]
        if shares:
            raise BudgetConfigError(
                f"{config.source} {where} sets {', '.join(shares)}: tandem cloud serve answers every request "
                "on the cloud, so its cloud share is always 1; budget it in USD "
                "(cloud_share limits are for tandem serve's cascade)"
            )
    return config


def check_config(config: BudgetConfig, prices_are_zero: bool, cloud_only: bool = False) -> BudgetConfig:
    config = require_prices(config, prices_are_zero)
    return require_usd_only(config) if cloud_only else config


def check_budgets(budgets_file: str, prices_are_zero: bool, cloud_only: bool = False) -> None:
    """BudgetConfigError for a file that cannot run here (before anything loads)."""
    check_config(load_budgets(budgets_file), prices_are_zero, cloud_only)


def open_budgets(
    budgets_file: str,
    spend_path: str | None,
    prices_are_zero: bool,
    cloud_only: bool = False,
    state: StateDatabase | None = None,
) -> BudgetManager:
    """The manager of a server: the budgets file checked, the spend ledger opened: the state database
    the replicas share when `state` is given (sdk.budgets.postgres_ledger), else this process's SQLite
    file at `spend_path` (its writer started)."""
    if state is not None:
        from sdk.budgets.postgres_ledger import PostgresSpendLedger

        return BudgetManager(budgets_file, PostgresSpendLedger(state), prices_are_zero, cloud_only=cloud_only)
    ledger = SpendLedger(spend_path or default_spend_path()).start()
    try:
        return BudgetManager(budgets_file, ledger, prices_are_zero, cloud_only=cloud_only)
    except BaseException:
        ledger.close()
        raise
