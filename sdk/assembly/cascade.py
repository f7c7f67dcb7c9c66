"""The cascade as `tandem serve` and the Android bridge run it, put together from one ServeConfig:
the cloud tier, the state database, the budgets, the learning parts, and the runner over the local
engine given all of them at construction.

`tandem serve` adds its HTTP listener on top; the bridge its in-process calls. Both start the
same parts in the same order, and `Cascade.close` stops them in reverse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from router.circuit_breaker import BreakerState, CircuitBreaker
from sdk.budgets.manager import BudgetManager, open_budgets
from sdk.cascade.runner import CascadeRunner, breaker_for
from sdk.cloud.tier import CloudTier, start_cloud_tier
from sdk.owner_migration import migrate_owners_at_start
from sdk.protocol.cloud_backend import CloudBackend
from sdk.protocol.engine import EngineProtocol
from sdk.settings.serve_config import ServeConfig
from sdk.state.database import StateDatabase, StateDatabaseError, open_state_database
from sdk.traffic.learning import Learning, start_learning


class CascadeStartError(Exception):
    """A part of the cascade could not start; the message says which and why (what started is closed)."""


@dataclass
class Cascade:
    runner: CascadeRunner
    cloud: CloudTier
    learning: Learning
    budgets: BudgetManager | None = None  # with [server] budgets_file
    state: StateDatabase | None = None  # with [server] state_db: what the replicas share

    async def bring_up_cloud(self, config: ServeConfig) -> None:
        """Start an embedded tier left pending by start_cascade(cloud_later=True) (OSError if it cannot)."""
        self.cloud.take(await start_cloud_tier(config.cloud))
        self.runner.attach_cloud(self.cloud.client)

    async def close(self) -> None:
        await self.learning.close()
        if self.budgets is not None:
            await self.budgets.ledger.aclose()
        if self.state is not None:  # last: what the parts above deferred is written first
            await self.state.close()
        await self.cloud.close()


async def start_cascade(config: ServeConfig, engine: EngineProtocol, cloud_later: bool = False) -> Cascade:
    """The cascade over `engine` (call in the serving event loop: the cloud clients bind to it).
    `cloud_later`: an embedded cloud engine is left pending for `Cascade.bring_up_cloud`, so that it
    loads after the local model (tandem serve); a remote tier starts now either way."""
    pending = cloud_later and config.cloud.embedded
    try:
        cloud = CloudTier(description="embedded", pending=True) if pending else await start_cloud_tier(config.cloud)
    except OSError as exc:
        raise CascadeStartError(f"the cloud tier could not start: {exc}") from exc
    state = budgets = None
    learning = Learning()
    try:
        state = await _open_state(config)
        # Before any store opens (the SQLite spend ledger reads its rows at start).
        await migrate_owners_at_start(config.listener, config.api_keys, state, config.traffic)
        budgets = _open_budgets(config, state)
        breaker = breaker_for(config.cascade)
        try:
            learning = start_learning(
                config.traffic, cloud_if_closed(cloud, breaker), config.cascade.cloud_model or "", state
            )
        except Exception as exc:  # an unusable record file (another schema, no permission): say so before serving
            raise CascadeStartError(f"the traffic record could not start: {exc}") from exc
        try:  # the probe and the prompt router load here: a wrong file is a clean error, not a traceback
            runner = CascadeRunner(
                engine,
                cloud.client,
                config.cascade,
                cloud_ready=lambda: cloud.is_ready,
                breaker=breaker,
                budgets=budgets,
                traffic=learning.record,
                shadow=learning.shadow,
            )
        except (OSError, ValueError) as exc:
            raise CascadeStartError(f"the cascade could not start: {exc}") from exc
    except BaseException:
        await Cascade(None, cloud, learning, budgets, state).close()
        raise
    return Cascade(runner, cloud, learning, budgets, state)


async def _open_state(config: ServeConfig) -> StateDatabase | None:
    try:
        return await open_state_database(config.listener)
    except StateDatabaseError as exc:
        raise CascadeStartError(str(exc)) from exc


def _open_budgets(config: ServeConfig, state: StateDatabase | None) -> BudgetManager | None:
    if not config.listener.budgets_file:
        return None
    try:
        return open_budgets(
            config.listener.budgets_file, config.listener.spend_path, config.cloud_prices_are_zero, state=state
        )
    except (OSError, ValueError) as exc:
        raise CascadeStartError(f"the budgets could not start: {exc}") from exc


def cloud_if_closed(cloud: CloudTier, breaker: CircuitBreaker) -> Callable[[], CloudBackend | None]:
    """What shadow calls ask before each call (sdk.traffic.shadow): the tier's client while it can take one
    (loaded, the breaker the cascade's escalations share closed), else None."""

    def now() -> CloudBackend | None:
        if cloud.client is None or not cloud.is_ready or breaker.state is not BreakerState.CLOSED:
            return None
        return cloud.client

    return now
