"""The learning loop of one `tandem serve`, put together from its [traffic] settings: the record,
shadow sampling and the background retrain. The cascade runner is given the record and the sampler
when it is made (sdk.assembly.cascade); the retrain, which swaps routers into the runner, starts
with the background tasks, once the runner exists.

With `state_db` the record is kept in the state database the replicas share
(sdk.traffic.postgres_store): one record for all of them, one replica retraining and every one
adopting its routers (sdk.traffic.shared_routers), and one daily budget of shadow cloud tokens:
each replica refreshes what its budget counts as used from the record's shared counter every
SHARED_BUDGET_REFRESH_S, so together they overrun it by at most what they have in flight (up to
max_in_flight shadow calls each) plus what settled within one refresh."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from sdk.protocol.cloud_backend import CloudBackend
from sdk.traffic.config import TrafficSettings
from sdk.traffic.record import TrafficRecord
from sdk.traffic.retrain import BackgroundRetrainer, ScorerSlot
from sdk.traffic.shadow import ShadowSampler
from sdk.traffic.shared_routers import SharedRouters

logger = logging.getLogger("tandem.traffic")

SHARED_BUDGET_REFRESH_S = 10.0


@dataclass
class Learning:
    """The learning parts a server runs (all None when [traffic] record is off)."""

    settings: TrafficSettings | None = None
    record: TrafficRecord | None = None
    shadow: ShadowSampler | None = None
    shared_routers: SharedRouters | None = None  # with state_db and retrain: the replicas' routers
    retrainer: BackgroundRetrainer | None = None  # made by start_background, over the runner it swaps into
    tasks: list[asyncio.Task] = field(default_factory=list)

    def start_background(self, scorers: ScorerSlot) -> None:
        """Start the retrain (when on) over `scorers` (the cascade runner), and the shared shadow budget's
        refresh; in the serving event loop."""
        loop = asyncio.get_running_loop()
        settings = self.settings
        if self.record is not None and settings.retrain and self.retrainer is None:
            self.retrainer = BackgroundRetrainer(
                scorers, self.record, settings, check_every_s=settings.retrain_check_s, shared=self.shared_routers
            )
            self.tasks.append(loop.create_task(self.retrainer.run()))
        if self.shadow is not None and self.record.shared:
            self.tasks.append(loop.create_task(self._refresh_shadow_budget()))

    async def _refresh_shadow_budget(self) -> None:
        from sdk.traffic.shadow import COUNTER

        while True:
            await asyncio.sleep(SHARED_BUDGET_REFRESH_S)
            try:
                self.shadow.budget.count_shared(await asyncio.to_thread(self.record.counter_today, COUNTER))
            except Exception as exc:  # the database away: the budget counts this replica's own calls meanwhile
                logger.warning("shadow budget: cannot read the replicas' shared counter (%s)", exc)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.shadow is not None:
            await self.shadow.close()
        if self.shared_routers is not None:
            await asyncio.to_thread(self.shared_routers.close)
        if self.record is not None:
            await asyncio.to_thread(self.record.close)


def start_learning(
    settings: TrafficSettings,
    cloud_now: Callable[[], CloudBackend | None],
    cloud_model: str = "",
    state=None,
) -> Learning:
    """Open the record (when on) and make the shadow sampler; `cloud_now`: the cloud tier when it may take
    a shadow call now (sdk.traffic.shadow), `cloud_model` the name to ask it for; `state`
    (sdk.state.database.StateDatabase, with state_db): the record goes there."""
    if not settings.record:
        return Learning(settings)
    if state is not None and settings.path:
        raise ValueError(
            "[traffic] path and state_db both say where the traffic record goes: with state_db the replicas share "
            "it in that database; unset [traffic] path"
        )
    record = TrafficRecord(settings.record_config(None if state is None else state.url)).start()
    shadow = _shadow_sampler(settings, record, cloud_now, cloud_model) if settings.shadow_fraction > 0 else None
    shared_routers = SharedRouters(state.url, state.replica_id) if settings.retrain and state is not None else None
    return Learning(settings, record, shadow, shared_routers)


def _shadow_sampler(
    settings: TrafficSettings, record: TrafficRecord, cloud_now: Callable[[], CloudBackend | None], cloud_model: str
) -> ShadowSampler:
    from sdk.traffic.judges import make_judge
    from sdk.traffic.shadow import COUNTER, DailyBudget

    budget = DailyBudget(settings.shadow_daily_cloud_tokens, used_today=record.counter_today(COUNTER))
    judge = make_judge(settings.judge, settings.judge_model, settings.judge_api_key)
    logger.info(
        "shadow sampling %.1f%% of local answers (judge %s), at most %d cloud tokens a day",
        100 * settings.shadow_fraction,
        judge.name,
        settings.shadow_daily_cloud_tokens,
    )
    return ShadowSampler(settings.shadow_fraction, budget, record, judge, cloud_now, cloud_model)
