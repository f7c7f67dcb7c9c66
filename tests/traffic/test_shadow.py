"""Shadow sampling (sdk.traffic.shadow) and its judges: the daily cloud-token budget holds
under concurrency, calls are judged into labels, the judges read answers as documented.
The cloud here is a stand-in object with the cloud client's generate() shape: what is
tested is the sampler's bookkeeping above any real tier (the real tiers: test_traffic_http)."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest

from router.circuit_breaker import BreakerState, CircuitBreaker
from router.failure_kinds import FailureKind
from sdk.assembly.cascade import cloud_if_closed
from sdk.cloud.tier import CloudTier
from sdk.protocol.engine import SamplingParams
from sdk.traffic.judges import ExactMatchJudge, OpenAIJudge, final_answer
from sdk.traffic.shadow import PROMPT_MARGIN, DailyBudget, ShadowSampler
from tests.traffic.helpers import entry, open_record


class Event:
    def __init__(self, text: str, num_output_tokens: int, num_prompt_tokens: int):
        self.text, self.num_output_tokens, self.num_prompt_tokens = text, num_output_tokens, num_prompt_tokens


class SlowCloud:
    """Answers "The answer is 4." token by token, reporting usage as a cloud client does."""

    def __init__(self, prompt_tokens: int = 30, delay_s: float = 0.005):
        self.prompt_tokens, self.delay_s, self.calls = prompt_tokens, delay_s, 0

    async def generate(self, messages, params, **kwargs):
        self.calls += 1
        words = ["The", " answer", " is", " 4", "."][: params.max_tokens]
        for n, word in enumerate(words, start=1):
            await asyncio.sleep(self.delay_s)
            yield Event(word, n, self.prompt_tokens)


def cloud_now(cloud, breaker: CircuitBreaker | None = None):
    """What `tandem serve` gives the sampler (sdk.assembly.cascade.cloud_if_closed): the tier while its breaker,
    shared with the cascade's escalations, is closed."""
    return cloud_if_closed(CloudTier(client=cloud, description="stand-in"), breaker or CircuitBreaker())


async def test_budget_holds_under_concurrency(tmp_path):
    record = open_record(tmp_path / "t.sqlite3", embed=False)
    cloud = SlowCloud(prompt_tokens=30)
    budget = DailyBudget(limit=1000)
    sampler = ShadowSampler(
        1.0, budget, record, ExactMatchJudge(), cloud_now(cloud), max_in_flight=100, rng=random.Random(0)
    )
    params = SamplingParams(max_tokens=64)
    started = 0
    for i in range(200):  # 200 local answers finishing at once
        record.record(entry(f"chatcmpl-{i}"))
        started += sampler.consider(
            f"chatcmpl-{i}", [{"role": "user", "content": "2+2?"}], params, "2+2?", "4", num_prompt_tokens=24
        )
    reservation = int(24 * PROMPT_MARGIN) + 64
    assert started == 1000 // reservation and sampler.counts.skipped_budget == 200 - started
    assert budget.used + budget.reserved <= budget.limit
    await asyncio.gather(*list(sampler._tasks))
    assert (
        budget.reserved == 0 and budget.used == started * (30 + 5) <= budget.limit
    )  # settled with what the cloud reported
    assert sampler.counts.judged == started == cloud.calls
    await asyncio.to_thread(record.flush)
    assert record.counter_today("shadow_cloud_tokens") == budget.used
    assert record.num_label_rows() == started  # one shadow label each: local "4" agrees with the cloud's
    # A restart reads the day's spend back: nothing more fits today.
    again = DailyBudget(1000, used_today=record.counter_today("shadow_cloud_tokens"))
    assert again.remaining == 1000 - budget.used
    record.close()


async def test_fraction_breaker_and_in_flight_cap(tmp_path):
    record = open_record(tmp_path / "t.sqlite3", embed=False)
    cloud, breaker = SlowCloud(delay_s=0.05), CircuitBreaker(failure_threshold=1)
    sampler = ShadowSampler(
        0.25,
        DailyBudget(10**9),
        record,
        ExactMatchJudge(),
        cloud_now(cloud, breaker),
        max_in_flight=3,
        rng=random.Random(1),
    )
    taken = [sampler.consider(f"r{i}", [], SamplingParams(max_tokens=8), "q", "a", 10) for i in range(400)]
    assert sampler.counts.started == 3 and sampler.counts.skipped_busy > 0  # the cap, reached at once
    await asyncio.gather(*list(sampler._tasks))
    draws = [sampler.consider(f"s{i}", [], SamplingParams(max_tokens=8), "q", "a", 10) for i in range(3)]
    assert sum(taken) == 3 and sum(draws) <= 3
    await asyncio.gather(*list(sampler._tasks))
    breaker.record_failure(FailureKind.UNAVAILABLE)  # the tier failing: escalations and shadow calls both stop
    assert breaker.state is BreakerState.OPEN
    assert not any(
        ShadowSampler(1.0, DailyBudget(10**9), record, ExactMatchJudge(), cloud_now(cloud, breaker)).consider(
            "x", [], SamplingParams(), "q", "a", 1
        )
        for _ in range(5)
    )
    record.close()


def test_daily_budget_rolls_over_at_utc_midnight():
    now = [1_700_000_000.0]
    budget = DailyBudget(100, clock=lambda: now[0])
    assert budget.reserve(80) and not budget.reserve(30)
    budget.settle(80, 70)
    now[0] += 86400
    assert budget.reserve(100) and budget.remaining == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The total is 1,234 apples.", "1234"),
        ("So x = 2.50", "2.5"),
        ("Answer: B", "B"),
        ("I think (C)", "C"),
        ("The capital of France is Paris.", "the capital of france is paris"),
        ("", ""),
    ],
)
def test_final_answer(text, expected):
    assert final_answer(text) == expected


async def test_exact_match_labels_the_local_tier_against_the_cloud():
    judge = ExactMatchJudge()
    assert (await judge.judge("q", "I get 42", "It is 42.")).weak == 1.0
    judged = await judge.judge("q", "I get 41", "It is 42.")
    assert (judged.weak, judged.strong, judged.detail) == (0.0, None, "exact_match")
    assert await judge.judge("q", "anything", "") is None


async def test_openai_judge_maps_scores_back_whatever_the_order():
    """The judge endpoint is any OpenAI-compatible server; here one whose grader prefers the
    answer containing "right", so the mapping back to tiers is checked in both orders."""
    seen = []

    def grade(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        prompt = body["messages"][0]["content"]
        a = prompt.split("Answer A:")[1].split("Answer B:")[0]
        scores = {"A": 9 if "right" in a else 2, "B": 2 if "right" in a else 9}
        return httpx.Response(200, json={"choices": [{"message": {"content": f"Sure: {json.dumps(scores)}"}}]})

    judge = OpenAIJudge("http://judge.test/v1", "big-model", "sk-test", rng=random.Random(3))
    judge.client = httpx.AsyncClient(base_url="http://judge.test/v1", transport=httpx.MockTransport(grade))
    results = [await judge.judge("Q?", "the right answer", "a wrong one") for _ in range(8)]
    assert all((r.weak, r.strong) == (0.9, 0.2) for r in results) and results[0].detail == "openai:big-model"
    firsts = {b["messages"][0]["content"].split("Answer A:\n")[1].startswith("the right") for b in seen}
    assert firsts == {True, False} and seen[0]["model"] == "big-model" and seen[0]["temperature"] == 0

    def chatty(request):
        return httpx.Response(200, json={"choices": [{"message": {"content": "Both are fine."}}]})

    judge.client = httpx.AsyncClient(base_url="http://judge.test/v1", transport=httpx.MockTransport(chatty))
    assert await judge.judge("Q?", "a", "b") is None  # no verdict in the format asked: no label
    await judge.close()
