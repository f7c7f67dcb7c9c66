"""The learning loop of one `tandem serve`, put together from its [traffic] settings: the
record, shadow sampling and the background retrain, attached to the cascade runner.

With `state_db` the record is kept in the state database the replicas share
(sdk.traffic.postgres_store): one record for all of them, one replica retraining and every one
adopting its routers (sdk.traffic.shared_routers), and one daily budget of shadow cloud tokens:
each replica refreshes what its budget counts as used from the record's shared counter every
SHARED_BUDGET_REFRESH_S, so together they overrun it by at most what they have in flight (up to
max_in_flight shadow calls each) plus what settled within one refresh."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from sdk.traffic.config import TrafficSettings
from sdk.traffic.record import TrafficRecord

logger = logging.getLogger("tandem.traffic")

SHARED_BUDGET_REFRESH_S = 10.0


@dataclass
class Learning:
    record: TrafficRecord | None = None
    shadow: object = None  # sdk.traffic.shadow.ShadowSampler
    retrainer: object = None  # sdk.traffic.retrain.BackgroundRetrainer
    shared_routers: object = None  # sdk.traffic.shared_routers.SharedRouters, with state_db and retrain
    runner: object = None
    tasks: list = field(default_factory=list)

    def attach_metrics(self, app) -> None:
        if self.record is not None:
            from sdk.openai_server.traffic_metrics import TrafficCollector

            app.state.tandem.metrics.registry.register(
                TrafficCollector(self.record, self.shadow, self.retrainer, self.runner)
            )

    def start_background(self) -> None:
        loop = asyncio.get_running_loop()
        if self.retrainer is not None:
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
        if self.runner is not None:
            self.runner.traffic = self.runner.shadow = None


def start_learning(runner, settings: TrafficSettings, state=None) -> Learning:
    """Open the record (when on) and hang it, the shadow sampler and the retrainer on `runner`;
    `state` (sdk.state.database.StateDatabase, with state_db): the record goes there."""
    if not settings.record:
        return Learning()
    if state is not None and settings.path:
        raise ValueError(
            "[traffic] path and state_db both say where the traffic record goes: with state_db the replicas share "
            "it in that database; unset [traffic] path"
        )
    record = TrafficRecord(settings.record_config(None if state is None else state.url)).start()
    learning = Learning(record=record, runner=runner)
    runner.traffic = record
    if settings.shadow_fraction > 0:
        from sdk.traffic.judges import make_judge
        from sdk.traffic.shadow import COUNTER, DailyBudget, ShadowSampler

        budget = DailyBudget(settings.shadow_daily_cloud_tokens, used_today=record.counter_today(COUNTER))
        judge = make_judge(settings.judge, settings.judge_model, settings.judge_api_key)
        learning.shadow = runner.shadow = ShadowSampler(settings.shadow_fraction, budget, record, judge, runner)
        logger.info(
            "shadow sampling %.1f%% of local answers (judge %s), at most %d cloud tokens a day",
            100 * settings.shadow_fraction,
            judge.name,
            settings.shadow_daily_cloud_tokens,
        )
    if settings.retrain:
        from sdk.traffic.retrain import BackgroundRetrainer

        if state is not None:
            from sdk.traffic.shared_routers import SharedRouters

            learning.shared_routers = SharedRouters(state.url, state.replica_id)
        learning.retrainer = BackgroundRetrainer(
            runner, record, settings, check_every_s=settings.retrain_check_s, shared=learning.shared_routers
        )
    return learning
