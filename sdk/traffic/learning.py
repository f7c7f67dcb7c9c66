"""The learning loop of one `tandem serve`, put together from its [traffic] settings: the
record, shadow sampling and the background retrain, attached to the cascade runner."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from sdk.traffic.config import TrafficSettings
from sdk.traffic.record import TrafficRecord

logger = logging.getLogger("tandem.traffic")


@dataclass
class Learning:
    record: TrafficRecord | None = None
    shadow: object = None  # sdk.traffic.shadow.ShadowSampler
    retrainer: object = None  # sdk.traffic.retrain.BackgroundRetrainer
    runner: object = None
    tasks: list = field(default_factory=list)

    def attach_metrics(self, app) -> None:
        if self.record is not None:
            from sdk.openai_server.traffic_metrics import TrafficCollector

            app.state.tandem.metrics.registry.register(
                TrafficCollector(self.record, self.shadow, self.retrainer, self.runner)
            )

    def start_background(self) -> None:
        if self.retrainer is not None:
            self.tasks.append(asyncio.get_running_loop().create_task(self.retrainer.run()))

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.shadow is not None:
            await self.shadow.close()
        if self.record is not None:
            await asyncio.to_thread(self.record.close)
        if self.runner is not None:
            self.runner.traffic = self.runner.shadow = None


def start_learning(runner, settings: TrafficSettings) -> Learning:
    """Open the record (when on) and hang it, the shadow sampler and the retrainer on `runner`."""
    if not settings.record:
        return Learning()
    record = TrafficRecord(settings.record_config()).start()
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

        learning.retrainer = BackgroundRetrainer(runner, record, settings)
    return learning
