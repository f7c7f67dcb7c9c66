"""The usage of a routed answer (sdk.cascade.responses.usage_of): the local tier's released events are
its tokens; the cloud's part is the cloud's own count, not its chunks (an OpenAI-compatible cloud's last
chunk may carry only the finish_reason: llama-server's 24 tokens came back as usage 25)."""

from sdk.cascade.responses import usage_of
from sdk.cascade.types import RoutingInfo


def routing(tier: str, cost: dict) -> RoutingInfo:
    return RoutingInfo(tier=tier, escalated=tier == "cloud", reason="test", cost=cost)


def test_cloud_answer_counts_the_clouds_tokens_not_its_chunks():
    cost = {"cloud": {"prompt_tokens": 37, "completion_tokens": 24}}
    usage = usage_of(routing("cloud", cost), ["cloud"] * 25)  # 24 tokens and a finish-only chunk
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (37, 24, 61)


def test_local_answer_after_a_cut_cloud_stream_counts_both_parts():
    cost = {
        "cloud": {"prompt_tokens": 30, "completion_tokens": 3},
        "local": {"prompt_tokens": 28, "completion_tokens": 9},
    }
    usage = usage_of(routing("local", cost), ["cloud"] * 3 + ["local"] * 9)
    assert (usage.prompt_tokens, usage.completion_tokens) == (28, 12)


def test_a_local_answer_is_its_events_and_a_cloud_without_a_count_falls_back_to_events():
    assert (
        usage_of(
            routing("local", {"local": {"prompt_tokens": 5, "completion_tokens": 4}}), ["local"] * 4
        ).completion_tokens
        == 4
    )
    assert usage_of(routing("cloud", {}), ["cloud"] * 6).completion_tokens == 6
