"""The cascade as `tandem serve` and the Android bridge run it, put together from one ServeConfig:
the cloud tier, the runner over the local engine and that tier, the budgets and the traffic record.

`tandem serve` adds its HTTP listener on top; the bridge its in-process calls. Both start the
same parts in the same order, and `Cascade.close` stops them in reverse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sdk.cascade.runner import CascadeRunner
from sdk.cloud.tier import CloudTier, start_cloud_tier
from sdk.settings.serve_config import ServeConfig


class CascadeStartError(Exception):
    """A part of the cascade could not start; the message says which and why (what started is closed)."""


@dataclass
class Cascade:
    runner: CascadeRunner
    cloud: CloudTier
    learning: Any  # sdk.traffic.learning.Learning
    budgets: Any = None  # sdk.budgets.manager.BudgetManager, with [server] budgets_file
    state: Any = None  # sdk.state.database.StateDatabase, with [server] state_db: what the replicas share

    async def bring_up_cloud(self, config: ServeConfig) -> None:
        """Start an embedded tier left pending by start_cascade(cloud_later=True) (OSError if it cannot)."""
        self.cloud.take(await start_cloud_tier(config.cloud))
        self.runner.cloud = self.cloud.client

    async def close(self) -> None:
        await self.learning.close()
        if self.budgets is not None:
            await self.budgets.ledger.aclose()
        if self.state is not None:  # last: what the parts above deferred is written first
            await self.state.close()
        await self.cloud.close()


async def start_cascade(config: ServeConfig, engine, cloud_later: bool = False) -> Cascade:
    """The cascade over `engine` (call in the serving event loop: the cloud clients bind to it).
    `cloud_later`: an embedded cloud engine is left pending for `Cascade.bring_up_cloud`, so that it
    loads after the local model (tandem serve); a remote tier starts now either way."""
    from sdk.traffic.learning import Learning, start_learning

    pending = cloud_later and config.cloud.embedded
    try:
        cloud = CloudTier(description="embedded", pending=True) if pending else await start_cloud_tier(config.cloud)
    except OSError as exc:
        raise CascadeStartError(f"the cloud tier could not start: {exc}") from exc
    try:  # the probe and the prompt router load here: a wrong file is a clean error, not a traceback
        runner = CascadeRunner(engine, cloud.client, config.cascade, cloud_ready=lambda: cloud.is_ready)
    except (OSError, ValueError) as exc:
        await cloud.close()
        raise CascadeStartError(f"the cascade could not start: {exc}") from exc
    cascade = Cascade(runner, cloud, Learning())
    try:
        from sdk.state.database import StateDatabaseError, open_state_database

        try:
            cascade.state = await open_state_database(config.listener)
        except StateDatabaseError as exc:
            raise CascadeStartError(str(exc)) from exc
        from sdk.owner_migration import migrate_owners_at_start

        # Before any store opens (the SQLite spend ledger reads its rows at start).
        await migrate_owners_at_start(config.listener, config.api_keys, cascade.state, config.traffic)
        if config.listener.budgets_file:
            from sdk.budgets.manager import open_budgets

            try:
                cascade.budgets = runner.budgets = open_budgets(
                    config.listener.budgets_file,
                    config.listener.spend_path,
                    config.cloud_prices_are_zero,
                    state=cascade.state,
                )
            except (OSError, ValueError) as exc:
                raise CascadeStartError(f"the budgets could not start: {exc}") from exc
        try:
            cascade.learning = start_learning(runner, config.traffic, state=cascade.state)
        except Exception as exc:  # an unusable record file (another schema, no permission): say so before serving
            raise CascadeStartError(f"the traffic record could not start: {exc}") from exc
    except BaseException:
        await cascade.close()
        raise
    return cascade
