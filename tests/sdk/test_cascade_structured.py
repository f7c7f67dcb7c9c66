"""response_format through the cascade's hand-offs: whichever tier writes which part of the
answer, the grammar on each side has consumed what came before, so the whole answer fits.

The local tier is the embedded SmolLM2; the cloud is the tiny random-weight model with a
byte-level vocabulary (tests.cloud_engine.grpc_helpers.byte_engine), which can spell JSON."""

from __future__ import annotations

import asyncio
import json

import pytest

from sdk.serving.grpc.server import GrpcServerConfig, bound_port, start_grpc_server, stop_grpc_server
from sdk.cascade.runner import CascadeConfig, CascadeRunner
from sdk.cloud.grpc_client import CloudClient
from sdk.protocol.engine import GenerationRequest, SamplingParams, StructuredOutput
from tests.cloud_engine.grpc_helpers import byte_engine  # noqa: F401  (fixtures)
from tests.conftest import free_port
from tests.sdk.test_cascade import local_engine  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "Pick a colour and a number, as JSON."}]
SCHEMA = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "green", "blue"]}, "n": {"type": "integer", "maximum": 99}},
    "required": ["colour", "n"],
    "additionalProperties": False,
}
PARAMS = SamplingParams(max_tokens=60, temperature=0.0, structured=StructuredOutput("json_schema", json.dumps(SCHEMA)))


def fits(text: str) -> bool:
    answer = json.loads(text)
    return (
        set(answer) == {"colour", "n"}
        and answer["colour"] in SCHEMA["properties"]["colour"]["enum"]
        and answer["n"] <= 99
    )


class PacedByteCloud:
    """The byte-level cloud engine behind a plain-words chat template, `delay_s` per token."""

    def __init__(self, engine, delay_s: float):
        self.engine, self.delay_s = engine, delay_s

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def apply_chat_template(self, messages):
        return [1] + self.engine.tokenize(" ".join(m["content"] for m in messages), add_special=False)

    async def generate(self, request: GenerationRequest):
        async for event in self.engine.generate(request):
            await asyncio.sleep(self.delay_s)
            yield event


async def local_only(local_engine) -> list:  # noqa: F811
    request = GenerationRequest("reference", local_engine.apply_chat_template(ASK), PARAMS)
    return [event async for event in local_engine.generate(request)]


async def test_a_failed_hand_off_resumes_the_local_answer_under_its_grammar(local_engine):  # noqa: F811
    """Escalated at token K in continue mode to a cloud that is not there: the local model resumes
    after its own K tokens (a new engine request whose grammar consumes them first)."""
    expected = await local_only(local_engine)
    k = 4
    assert len(expected) > k and fits("".join(e.text for e in expected))
    runner = CascadeRunner(
        local_engine, CloudClient(f"127.0.0.1:{free_port()}"), CascadeConfig(min_tokens_k=k, handoff="continue")
    )
    try:
        result = await runner.complete(ASK, PARAMS, model="auto:0.9999")  # every judged prefix is below it
    finally:
        await runner.cloud.close()
    routing = result.routing
    # Judged at the K-th token the grammar did not force (forced ones are not judged, but counted).
    assert (routing.escalated, routing.tier, routing.degraded) == (
        True,
        "local",
        True,
    ) and routing.decided_at_token >= k
    assert result.token_ids == [e.token_id for e in expected] and result.finish_reason == "stop"
    assert fits(result.text)


async def test_a_cloud_answer_cut_off_part_way_is_finished_locally_under_the_grammar(
    local_engine,  # noqa: F811
    byte_engine,  # noqa: F811
):
    server = await start_grpc_server(PacedByteCloud(byte_engine, 0.05), GrpcServerConfig(port=0))
    runner = CascadeRunner(local_engine, CloudClient(f"127.0.0.1:{bound_port(server)}"), CascadeConfig())
    events, killed = [], False
    try:
        async for event in runner.generate(ASK, PARAMS, model="cloud"):
            events.append(event)
            if not killed and [e.tier for e in events if e.routing is None].count("cloud") == 3:
                killed = True
                await stop_grpc_server(server, grace_s=0)
    finally:
        await runner.cloud.close()
    tiers = [e.tier for e in events if e.routing is None]
    text = "".join(e.text for e in events)
    assert killed and tiers[:3] == ["cloud"] * 3 and tiers[-1] == "local", tiers
    assert (events[-1].routing.tier, events[-1].routing.degraded) == ("local", True)
    assert events[-1].finish_reason == "stop" and fits(text), text
