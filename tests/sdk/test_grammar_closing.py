"""Structured answers close within their budget (sdk.engine_common.grammar_closing) and never repeat a key.

A toy vocabulary (every byte, a few multi-byte pieces, an end token) and a "model" that always
wants to write more: the budget's mask alone decides whether the answer ends valid."""

from __future__ import annotations

import json

import pytest

from sdk.protocol.engine import StructuredOutput
from sdk.engine_common.grammar import GrammarMasks
from sdk.engine_common.grammar_closing import CLOSING_MARGIN
from sdk.protocol.tool_formats import LIST, ToolFunction, ToolRequest

PIECES = [b'"}', b'":', b', "', b"}}", b'""', b"]}", b'"a"', b'"a":', b',"a"', b'a"', b"name"]
TOKENS = [bytes([i]) for i in range(256)] + PIECES + [b""]
EOS = len(TOKENS) - 1


def tokenize(text: str) -> list[int]:
    """Longest match first, as a BPE would spell these pieces."""
    data, out, i = text.encode(), [], 0
    while i < len(data):
        piece = max((p for p in PIECES if data.startswith(p, i)), key=len, default=None)
        out.append(256 + PIECES.index(piece) if piece else data[i])
        i += len(piece) if piece else 1
    return out


VOCAB = GrammarMasks(lambda: TOKENS, EOS, tokenize)
CAT = StructuredOutput("json_object")
PERSON = StructuredOutput(
    "json_schema",
    schema=json.dumps(
        {
            "type": "object",
            "required": ["name", "age", "tags"],
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
        }
    ),
)
# A model that never stops: key after key, long values.
RAMBLING = '{"name": "Luna the very long named cat", "breed": "tabby", "colour": "grey and white", ' + ", ".join(
    f'"extra_key_{i}": "more"' for i in range(40)
)


def generate(structured, max_tokens: int, wants: str = RAMBLING, closes: bool = True):
    """(text, ended by the end token, state): the model writes `wants` byte by byte where the
    mask lets it, else the only token left, else the first allowed byte; at most max_tokens."""
    state = VOCAB.matcher(structured, closes=closes)
    text, wanted, ended = b"", wants.encode(), False
    for _ in range(max_tokens):
        mask = VOCAB.allowed(state, max_tokens - state.num_consumed)
        want = wanted[len(text)] if len(text) < len(wanted) and text == wanted[: len(text)] else None
        if want is not None and mask[want] and mask.sum() > 1:
            token = want
        elif mask.sum() == 1 or want is None and mask[EOS]:
            token = int(mask.argmax()) if mask.sum() == 1 else EOS
        else:
            token = int(next(i for i in range(256) if mask[i]))
        if token == EOS:
            ended = True
            break
        assert state.consume_token(token)
        text += TOKENS[token]
    return text.decode(), ended, state


@pytest.mark.parametrize("max_tokens", [8, 12, 20, 40, 80])
def test_a_rambling_object_closes_valid_within_max_tokens(max_tokens):
    text, ended, state = generate(CAT, max_tokens)
    assert ended and state.closed and isinstance(json.loads(text), dict), text
    assert state.num_consumed + 1 <= max_tokens  # the end token fits too


@pytest.mark.parametrize("max_tokens", [30, 40, 64])
def test_a_schema_closes_with_its_required_keys_filled(max_tokens):
    text, ended, state = generate(
        PERSON, max_tokens, '{"name": "Luna the cat with a very long name that goes on and on'
    )
    assert ended and state.closed, text
    answer = json.loads(text)
    assert set(answer) == {"name", "age", "tags"} and answer["name"].startswith("Lu")


def test_a_budget_the_shortest_completion_cannot_fit_still_ends_at_length():
    shortest = len('{"name":"","age":0,"tags":[]}') // 2  # fewer tokens than even its multi-byte pieces need
    text, ended, state = generate(PERSON, shortest, '{"name": "Luna')
    assert not ended and not state.closed and state.num_consumed == shortest  # cut: no claim of completeness
    with pytest.raises(ValueError):
        json.loads(text)


def test_opting_out_keeps_the_grammar_alone():
    text, ended, state = generate(CAT, 40, closes=False)
    assert not ended and not state.closed and text == RAMBLING[: len(text)]
    state = VOCAB.matcher(CAT, closes=False)  # no duplicate-key rule either: OpenAI's behaviour
    assert state.consume_tokens(tokenize('{"a": 0, ')) and VOCAB.allowed(state)[tokenize('"a"')[0]]


def test_an_answer_that_ends_on_its_own_is_not_marked_closed():
    text, ended, state = generate(CAT, 40, '{"a": 1}')
    assert ended and text == '{"a": 1}' and not state.closed


def test_closing_starts_only_near_the_budget():
    text, ended, state = generate(CAT, 80)
    assert text.startswith(RAMBLING[: 80 - 10 - CLOSING_MARGIN]), text  # the model wrote until the end came near


def test_an_object_never_takes_a_key_twice():
    state = VOCAB.matcher(CAT)
    assert state.consume_tokens(tokenize('{"a": 0'))
    mask = VOCAB.allowed(state)
    assert not mask[tokenize(',"a"')[0]] and mask[ord(",")]  # a comma and the same key in one token
    assert state.consume_tokens(tokenize(", "))
    mask = VOCAB.allowed(state)
    assert not mask[tokenize('"a"')[0]] and not mask[tokenize('"a":')[0]] and mask[ord('"')]
    assert state.consume_token(ord('"'))
    mask = VOCAB.allowed(state)
    assert not mask[tokenize('a"')[0]] and mask[ord("a")]  # "ab" is still a new key
    assert state.consume_token(ord("a"))
    assert not VOCAB.allowed(state)[ord('"')]
    assert state.consume_tokens(tokenize('b": {"a"'))  # an inner object has keys of its own


def test_equal_values_and_equal_objects_in_an_array_stay_allowed():
    state = VOCAB.matcher(CAT)
    text = '{"a": [0, 0, 0, 0], "b": [{"x": 1}, {"x": 1}, {"x": 1}]}'
    for token in tokenize(text):
        assert VOCAB.allowed(state)[token], text
        assert state.consume_token(token)
    assert state.is_accepting()


def test_rollback_restores_the_scan_and_the_plan():
    state = VOCAB.matcher(CAT)
    assert state.consume_tokens(tokenize('{"a": 0, "b": "x'))
    before = VOCAB.allowed(state, 4)
    assert state.consume_tokens(tokenize('y", "c'))
    state.rollback(len(tokenize('y", "c')))
    assert (VOCAB.allowed(state, 4) == before).all() and state.scan.in_string


def test_a_required_tool_call_closes_into_a_call_that_parses():
    weather = ToolFunction(
        "get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    )
    grammar = LIST.grammar(ToolRequest((weather,), required=True))
    text, ended, state = generate(
        grammar,
        100,
        '<tool_call>[\n{"name": "get_weather", "arguments": '
        '{"city": "Paris is a city with a very long name that goes on and on and on',
    )
    assert ended and state.closed, text
    assert [c.name for c in LIST.parse(text)] == ["get_weather"]


def test_plain_text_beside_tools_is_never_forced_to_end():
    weather = ToolFunction("get_weather", "", None)
    text, ended, state = generate(LIST.grammar(ToolRequest((weather,))), 20, "It is sunny today in Paris, and warm.")
    assert not ended and not state.closed and text == "It is sunny today in Paris, and warm."[:20]


def test_an_answer_stopped_inside_a_character_still_closes():
    """A token can end part-way through a UTF-8 character (SmolLM2 wrote emoji byte by byte): the
    plan completes the character before it closes the string."""
    state = VOCAB.matcher(CAT)
    assert state.consume_tokens(tokenize('{"a": "') + list("🍵".encode())[:2])
    plan = VOCAB.closing_paths.find(state.matcher, state.scan)
    assert plan is not None and state.consume_tokens(plan) and state.is_accepting()
