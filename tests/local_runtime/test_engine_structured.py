"""response_format on the local engine (real model): every answer parses and fits its schema,
a schema llguidance cannot take is refused before anything is allocated, and the options that
would fight the grammar are refused (the grammar decides where the output ends)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from sdk.protocol.engine import GenerationRequest, InvalidRequestError, SamplingParams, StructuredOutput
from tests.local_runtime.conftest import assert_no_blocks_held, run_to_completion

pytestmark = pytest.mark.slow

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "colour": {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "green", "blue"]}},
        "required": ["colour"],
        "additionalProperties": False,
    },
    "tags": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3}
        },
        "required": ["tags"],
        "additionalProperties": False,
    },
    "nested": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"],
        "additionalProperties": False,
    },
}
PROMPT = [{"role": "user", "content": "Describe a person, a colour, some tags or a line, as JSON."}]


def structured(schema: dict | None, **fields) -> SamplingParams:
    constraint = StructuredOutput("json_schema", json.dumps(schema)) if schema else StructuredOutput("json_object")
    return SamplingParams(**{"max_tokens": 120, "temperature": 0.7, "top_p": 0.95, **fields}, structured=constraint)


def test_every_finished_answer_fits_its_schema(engine):
    """The grammar's guarantee: an answer that ends on its own ("stop") parses and fits its schema.
    One cut by max_tokens cannot (a 135M model can run on inside a number or a free-form key:
    bench.structured counts those); most of these end well inside the budget."""
    prompt = engine.apply_chat_template(PROMPT)
    requests = [
        GenerationRequest(f"{name}-{seed}", prompt, structured(schema, seed=seed))
        for name, schema in SCHEMAS.items()
        for seed in range(3)
    ]
    requests += [
        GenerationRequest("object-greedy", prompt, structured(None, temperature=0.0, max_tokens=300)),
        GenerationRequest("person-greedy", prompt, structured(SCHEMAS["person"], temperature=0.0)),
    ]
    answers = run_to_completion(engine, requests)
    finished = 0
    for request in requests:
        events = answers[request.request_id]
        text = "".join(event.text for event in events)
        if events[-1].finish_reason != "stop":
            assert events[-1].finish_reason == "length" and len(events) == request.params.max_tokens, request.request_id
            continue
        finished += 1
        name = request.request_id.rsplit("-", 1)[0]
        jsonschema.validate(json.loads(text), SCHEMAS.get(name, {"type": "object"}))
    assert finished >= 0.75 * len(requests) and answers["person-greedy"][-1].finish_reason == "stop"
    assert_no_blocks_held(engine)


def test_a_schema_it_cannot_take_and_conflicting_options_are_refused(engine):
    prompt = engine.apply_chat_template(PROMPT)
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request(
            GenerationRequest(
                "bad",
                prompt,
                structured({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}, "required": ["a"]}),
            )
        )
    assert info.value.param == "response_format" and not engine.has_unfinished_requests()
    for conflict in ({"ignore_eos": True}, {"min_tokens": 3}):
        with pytest.raises(InvalidRequestError) as info:
            structured(None, **conflict)
        assert info.value.param == next(iter(conflict))
    assert not structured(None, repetition_stop=True).stops_loops  # JSON repeats legitimately: no loop stop


def test_tokens_the_grammar_forces_are_marked_and_free_ones_are_not(engine):
    """The colour schema leaves the model one choice (which colour) besides whitespace: the key and
    the punctuation around it are forced (TokenEvent.forced, which the cascade's confidence skips);
    an unconstrained request marks nothing."""
    prompt = engine.apply_chat_template(PROMPT)
    requests = [
        GenerationRequest("colour", prompt, structured(SCHEMAS["colour"], temperature=0.0)),
        GenerationRequest("free", prompt, SamplingParams(max_tokens=20, temperature=0.0)),
    ]
    answers = run_to_completion(engine, requests)
    colour = answers["colour"]
    assert colour[-1].finish_reason == "stop"
    forced = [e.text for e in colour if e.forced]
    assert forced and any("colour" in text for text in forced), [(e.text, e.forced) for e in colour]
    assert not all(e.forced for e in colour) and not any(e.forced for e in answers["free"])
