"""stream_from_cloud retries only what is idempotent: an UNAVAILABLE before the first token,
once; never a deadline, never after a token. The cloud here is a scripted stand-in for the
client (the real client's error mapping is tested in test_grpc_* and test_openai_cloud_client)."""

from __future__ import annotations

import pytest

from sdk.protocol.cloud_backend import CloudStatus
from sdk.protocol.cloud_backend import CloudBackend, CloudTokenEvent
from router.circuit_breaker import CircuitBreaker
from sdk.cascade.cloud import CloudFailed, CloudTimeouts, CloudUsage, stream_from_cloud
from sdk.cloud.grpc_client import CloudDeadlineExceededError, CloudUnavailableError
from sdk.protocol.engine import SamplingParams


def token(i: int, finish: str | None = None) -> CloudTokenEvent:
    return CloudTokenEvent(
        "r", i, f"t{i}", -0.1, 0.5, 0.2, finish_reason=finish, num_prompt_tokens=5, num_output_tokens=i
    )


class ScriptedCloud(CloudBackend):
    """Each call plays the next script: a list of events, possibly ending in an exception."""

    def __init__(self, *scripts):
        self.scripts = list(scripts)
        self.num_calls = 0

    async def generate(self, *args, **kwargs):
        script = self.scripts[self.num_calls]
        self.num_calls += 1
        for item in script:
            if isinstance(item, Exception):
                raise item
            yield item


async def drain(cloud: ScriptedCloud, breaker: CircuitBreaker) -> list[CloudTokenEvent]:
    stream = stream_from_cloud(
        cloud,
        breaker,
        [{"role": "user", "content": "hi"}],
        SamplingParams(max_tokens=4),
        CloudUsage(),
        model="",
        request_id="r",
        continuation_token_ids=(),
        timeouts=CloudTimeouts(deadline_s=5.0),
        retry_backoff_s=0.0,
    )
    return [event async for event in stream]


UNAVAILABLE = CloudUnavailableError("connection refused", CloudStatus.UNAVAILABLE)


async def test_unavailable_before_the_first_token_is_retried_once():
    cloud = ScriptedCloud([UNAVAILABLE], [token(1), token(2, "stop")])
    breaker = CircuitBreaker(3, 30.0)
    assert [e.text for e in await drain(cloud, breaker)] == ["t1", "t2"]
    assert cloud.num_calls == 2 and breaker.num_consecutive_failures == 0


@pytest.mark.parametrize(
    "script",
    [
        [[UNAVAILABLE], [UNAVAILABLE]],  # retried once only
        [[CloudDeadlineExceededError("slow", CloudStatus.DEADLINE_EXCEEDED)]],  # a deadline is not retried
        [[token(1), UNAVAILABLE]],  # a token reached the caller: not idempotent any more
    ],
)
async def test_what_is_not_retried_fails_once_and_counts_once(script):
    cloud = ScriptedCloud(*script)
    breaker = CircuitBreaker(3, 30.0)
    with pytest.raises(CloudFailed):
        await drain(cloud, breaker)
    assert cloud.num_calls == len(script) and breaker.num_consecutive_failures == 1
