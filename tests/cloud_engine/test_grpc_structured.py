"""response_format through tandem.v1 (SamplingParams.structured) and the OpenAI-HTTP cloud client,
on a tiny random-weight model whose byte-level vocabulary can spell JSON: whatever a random model
would say, the grammar makes it fit the schema, and a continuation (a cascade hand-off) is
consumed by the grammar before the first new token."""

from __future__ import annotations

import json

import pytest

from sdk.serving.grpc.convert import sampling_params
from sdk.protocol.wire.messages import sampling_message
from sdk.protocol.wire import tandem_pb2 as pb
from sdk.cloud.grpc_client import CloudClient, CloudInvalidArgumentError
from sdk.cloud.openai_wire import request_body
from sdk.protocol.engine import GenerationRequest, SamplingParams, StructuredOutput
from tests.cloud_engine.grpc_helpers import byte_engine, serve, wait_drained  # noqa: F401  (fixtures)

SCHEMA = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "green", "blue"]}, "n": {"type": "integer", "maximum": 99}},
    "required": ["colour", "n"],
    "additionalProperties": False,
}
CONSTRAINT = StructuredOutput("json_schema", json.dumps(SCHEMA))
PROMPT = [1, 40, 41, 42]


def greedy(**kw) -> SamplingParams:
    return SamplingParams(max_tokens=150, temperature=0.0, structured=CONSTRAINT, **kw)


def test_the_constraint_survives_the_proto_both_ways():
    for structured in (CONSTRAINT, StructuredOutput("json_object")):
        message = pb.GenerateRequest(sampling=sampling_message(SamplingParams(max_tokens=5, structured=structured)))
        assert sampling_params(message, 3, 100).structured == structured
    assert (
        sampling_params(pb.GenerateRequest(sampling=sampling_message(SamplingParams(max_tokens=5))), 3, 100).structured
        is None
    )


def test_the_openai_http_client_sends_response_format():
    body = request_body([{"role": "user", "content": "hi"}], greedy(), "m")
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "response", "schema": SCHEMA, "strict": True},
    }
    body = request_body([], SamplingParams(max_tokens=5, structured=StructuredOutput("json_object")), "m")
    assert body["response_format"] == {"type": "json_object"}


async def test_a_structured_request_over_grpc_fits_its_schema_and_matches_the_engine(byte_engine, serve):  # noqa: F811
    direct = [e async for e in byte_engine.generate(GenerationRequest("direct", PROMPT, greedy()))]
    text = "".join(e.text for e in direct)
    assert direct[-1].finish_reason == "stop", text
    answer = json.loads(text)
    assert answer["colour"] in SCHEMA["properties"]["colour"]["enum"] and answer["n"] <= 99
    async with CloudClient(await serve(byte_engine)) as client:
        events = [e async for e in client.generate(PROMPT, greedy())]
        assert [e.token_id for e in events] == [e.token_id for e in direct]

        # A hand-off: the grammar consumes the continuation, then goes on exactly where it left off.
        cut = len(direct) // 2
        prefix = [e.token_id for e in direct[:cut]]
        rest = [e async for e in client.generate(PROMPT, greedy(), continuation_token_ids=prefix)]
        assert [e.token_id for e in rest] == [e.token_id for e in direct[cut:]]

        # A continuation the schema cannot take is the caller's error, naming the field.
        with pytest.raises(CloudInvalidArgumentError, match="response_format"):
            _ = [
                e
                async for e in client.generate(
                    PROMPT, greedy(), continuation_token_ids=byte_engine.tokenize("[1", add_special=False)
                )
            ]
    assert await wait_drained(byte_engine)
