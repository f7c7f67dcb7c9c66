"""Shadow sampling: a share of the locally answered requests also goes to the cloud tier, in
the background, and a judge grades both answers; the judgment becomes a label of both tiers
in the traffic record (what a router learns the most from: bench.router_learning).

The client never waits for it: its answer has already gone out. Each call reserves its
largest possible cost (the prompt, with a margin for the cloud's own tokenizer, plus its
max_tokens) against a daily cloud-token budget before it starts, on the event loop, so
concurrent requests cannot overrun the budget together; the reservation is settled with
what the cloud reports. Privacy-flagged requests are never sampled (the caller checks),
nor while the circuit breaker is not closed, nor beyond `max_in_flight` calls at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from sdk.protocol.cloud_backend import CloudBackend
from sdk.protocol.engine import SamplingParams
from sdk.traffic.judges import Judge

logger = logging.getLogger("tandem.traffic")

MAX_SHADOW_TOKENS = 512  # a shadow answer is a label, not a reply: long ones cost without grading better
PROMPT_MARGIN = 1.25  # the cloud's tokenizer may split the prompt into more tokens than the local one did
SHADOW_DEADLINE_S = 120.0
COUNTER = "shadow_cloud_tokens"


def utc_day(now: float | None = None) -> str:
    return (
        datetime.datetime.fromtimestamp(time.time() if now is None else now, datetime.timezone.utc).date().isoformat()
    )


class DailyBudget:
    """Cloud tokens per UTC day: reserve before a call, settle after. Event-loop only (no lock)."""

    def __init__(self, limit: int, used_today: int = 0, clock: Callable[[], float] = time.time):
        self.limit = limit
        self.clock = clock
        self.day = utc_day(clock())
        self.used = used_today  # settled calls
        self.reserved = 0  # calls in flight

    def _roll(self) -> None:
        day = utc_day(self.clock())
        if day != self.day:
            self.day, self.used = day, 0

    def reserve(self, tokens: int) -> bool:
        self._roll()
        if self.used + self.reserved + tokens > self.limit:
            return False
        self.reserved += tokens
        return True

    def settle(self, reserved: int, actual: int) -> None:
        self._roll()
        self.reserved -= reserved
        self.used += actual

    def count_shared(self, used_everywhere: int) -> None:
        """What every replica sharing the record has settled today (its counter): this replica's budget
        counts at least that as used (its own settles that the record has not written yet stay counted)."""
        self._roll()
        self.used = max(self.used, used_everywhere)

    @property
    def remaining(self) -> int:
        self._roll()
        return self.limit - self.used - self.reserved


@dataclass
class ShadowCounts:
    started: int = 0
    judged: int = 0
    skipped_budget: int = 0
    skipped_busy: int = 0
    failed: int = 0


class ShadowSampler:
    def __init__(
        self,
        fraction: float,
        budget: DailyBudget,
        record,
        judge: Judge,
        cloud_now: Callable[[], CloudBackend | None],
        cloud_model: str = "",
        max_in_flight: int = 4,
        rng: random.Random | None = None,
    ):
        self.fraction = fraction
        self.budget = budget
        self.record = record  # sdk.traffic.record.TrafficRecord
        self.judge = judge
        # The cloud tier if it may take a call now (there, ready, its breaker closed), asked at each answer: a
        # shadow call never goes where the cascade would not send an escalation.
        self.cloud_now = cloud_now
        self.cloud_model = cloud_model  # the model name the calls ask for ("": the tier's own)
        self.max_in_flight = max_in_flight
        self.rng = rng or random.Random()
        self.counts = ShadowCounts()
        self._tasks: set[asyncio.Task] = set()

    def consider(
        self,
        response_id: str,
        messages: list[dict],
        params: SamplingParams,
        prompt_text: str,
        local_answer: str,
        num_prompt_tokens: int,
    ) -> bool:
        """Maybe start a shadow call for a local answer (event loop; returns whether one started)."""
        if self.fraction <= 0 or self.rng.random() >= self.fraction:
            return False
        cloud = self.cloud_now()
        if cloud is None:
            return False
        if len(self._tasks) >= self.max_in_flight:
            self.counts.skipped_busy += 1
            return False
        max_tokens = max(1, min(params.max_tokens, MAX_SHADOW_TOKENS))
        reservation = math.ceil(num_prompt_tokens * PROMPT_MARGIN) + max_tokens
        if not self.budget.reserve(reservation):
            self.counts.skipped_budget += 1
            return False
        self.counts.started += 1
        shadow_params = dataclasses.replace(
            params, max_tokens=max_tokens, min_tokens=min(params.min_tokens, max_tokens)
        )
        task = asyncio.get_running_loop().create_task(
            self._run(cloud, response_id, messages, shadow_params, prompt_text, local_answer, reservation)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _run(
        self,
        cloud,
        response_id: str,
        messages,
        params: SamplingParams,
        prompt_text: str,
        local_answer: str,
        reservation: int,
    ) -> None:
        texts, prompt_tokens, completion_tokens = [], 0, 0
        try:
            stream = cloud.generate(
                messages,
                params,
                model=self.cloud_model,
                request_id=f"shadow-{response_id}",
                timeout_s=SHADOW_DEADLINE_S,
            )
            try:
                async for event in stream:
                    texts.append(event.text)
                    completion_tokens = max(completion_tokens + 1, event.num_output_tokens or 0)
                    prompt_tokens = event.num_prompt_tokens or prompt_tokens
            finally:
                await stream.aclose()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the cloud's trouble is the cascade's to report; a shadow just goes unlabelled
            self.counts.failed += 1
            logger.info("shadow call for %s failed: %s", response_id, exc)
            return
        finally:
            used = prompt_tokens + completion_tokens
            self.budget.settle(reservation, used)
            if used:
                self.record.count(COUNTER, used)
        try:
            judgment = await self.judge.judge(prompt_text, local_answer, "".join(texts))
        except Exception as exc:
            self.counts.failed += 1
            logger.info("judging shadow sample %s failed: %s", response_id, exc)
            return
        if judgment is not None:
            self.counts.judged += 1
            self.record.judgment(response_id, judgment.weak, judgment.strong, judgment.detail)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.judge.close()
