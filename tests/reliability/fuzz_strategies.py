"""Hypothesis strategies and response checks shared by the HTTP and gRPC fuzz tests.

Bodies mix three kinds: structurally valid requests with extreme values, valid requests with
one field replaced by a random JSON value of any type, and malformed bytes (truncated JSON,
invalid UTF-8, NaN literals, nesting bombs, non-objects). Valid bodies keep max_tokens small
by construction most of the time, so generation stays cheap; the target's small max_model_len
bounds the rest.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from sdk.protocol.openai_schema import ChatCompletionChunk, ChatCompletionResponse, CompletionResponse
from sdk.protocol.openai_schema.response_objects import ResponseObject

REQUEST_TIMEOUT_S = 30.0  # a request without its whole answer after this long is a hang


def fuzz_settings(max_examples: int) -> settings:
    """Reproducible in CI (derandomize), no example database, no per-example deadline."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        print_blob=False,
    )


@dataclass
class RequestCounter:
    """Requests sent per target, printed and checked at the end of each file."""

    counts: dict[str, int] = field(default_factory=dict)
    completed: set[str] = field(default_factory=set)

    def add(self, target: str, n: int = 1) -> None:
        self.counts[target] = self.counts.get(target, 0) + n


# -- values ------------------------------------------------------------------------------------

HUGE_INTS = [
    0,
    1,
    -1,
    2,
    16,
    17,
    255,
    256,
    2**31 - 1,
    2**31,
    2**32,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    -(2**63),
    -(2**63) - 1,
    10**30,
    -(10**30),
    10**100,
]
ODD_FLOATS = [0.0, -0.0, 1e-320, 5e-324, -1.0, 2.0000001, 1e308, -1e308, math.nan, math.inf, -math.inf, 0.5, 1.0, 2.0]

surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
odd_text = st.one_of(
    st.text(max_size=40),
    st.text(st.characters(codec="utf-8"), max_size=40),
    st.text(surrogates, min_size=1, max_size=4),  # lone surrogates: escaped as \udXXX in the JSON
    st.sampled_from(
        [
            "",
            " ",
            "\x00",
            "\ufeff",
            "\u202e",
            "<|im_start|>",
            "<|im_end|>",
            "</s>",
            "<s>",
            "{{ x }}",
            "{% for %}",
            "\U0001f600" * 30,
            "a" * 3000,
            "w5 w6 w7",
            "\r\n\r\n",
            "data: [DONE]\n\n",
        ]
    ),
)
any_int = st.one_of(st.sampled_from(HUGE_INTS), st.integers())
any_float = st.one_of(st.sampled_from(ODD_FLOATS), st.floats())

json_scalars = st.one_of(st.none(), st.booleans(), any_int, any_float, odd_text)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(odd_text, children, max_size=4)),
    max_leaves=12,
)


def weighted(draw, *options):
    """Pick one strategy by weight: options are (weight, strategy) pairs."""
    total = sum(w for w, _ in options)
    pick = draw(st.integers(0, total - 1))
    for w, strategy in options:
        if pick < w:
            return draw(strategy)
        pick -= w
    raise AssertionError


# -- request bodies ------------------------------------------------------------------------------

_OMIT = object()


def _maybe(draw, strategy, p_present: int = 50):
    """The drawn value, or _OMIT (the field left out) with probability 1 - p_present/100."""
    return draw(strategy) if draw(st.integers(0, 99)) < p_present else _OMIT


@st.composite
def sampling_fields(draw, max_model_len: int, small_vocab: int) -> dict:
    """The fields chat and completions share, mostly valid and cheap, sometimes extreme."""
    fields = {}
    extreme = draw(st.integers(0, 99)) < 15  # a minority of expensive-but-valid requests
    fields["max_tokens"] = weighted(
        draw,
        (70, st.integers(1, 3)),
        (10, st.sampled_from([max_model_len - 8, max_model_len, max_model_len + 1]) if extreme else st.integers(1, 4)),
        (20, st.sampled_from([0, -1, 2**31, 2**63, 10**30, 1.5, 2.0, "16", None, True, [], {}])),
    )
    if draw(st.integers(0, 99)) < 10:  # the newer name, sometimes both
        fields["max_completion_tokens"] = weighted(
            draw, (3, st.integers(1, 3)), (1, st.sampled_from([0, -5, 10**30, "2", None]))
        )
    fields["temperature"] = _maybe(
        draw, st.one_of(st.floats(0, 2), st.sampled_from(ODD_FLOATS + [2.5, -0.1, 100, "1", True]))
    )
    fields["top_p"] = _maybe(draw, st.one_of(st.floats(0, 1), st.sampled_from(ODD_FLOATS + [1.1, 1e-300, "0.5"])), 30)
    fields["top_k"] = _maybe(draw, st.one_of(st.integers(-2, 400), st.sampled_from(HUGE_INTS + [1.0, 3.5, "4"])), 30)
    n_small = st.integers(1, 2) if fields["max_tokens"] not in range(1, 4) else st.integers(1, 16)
    fields["n"] = _maybe(draw, st.one_of(n_small, st.sampled_from([0, -1, 17, 1000, 10**30, 1.0, "2"])), 25)
    fields["stream"] = _maybe(draw, st.one_of(st.booleans(), st.sampled_from([None, 0, 1, "true", []])), 50)
    fields["stream_options"] = _maybe(
        draw,
        st.one_of(
            st.fixed_dictionaries({"include_usage": st.one_of(st.booleans(), st.none(), st.sampled_from([1, "yes"]))}),
            st.sampled_from([None, {}, [], "x", {"unknown": 1}]),
        ),
        20,
    )
    fields["stop"] = _maybe(
        draw,
        st.one_of(
            odd_text,
            st.lists(odd_text, max_size=20),
            st.sampled_from([[""], ["a" * 10000], [None], [1, 2], "\n", ["w7", "w9"], None]),
        ),
        25,
    )
    fields["stop_token_ids"] = _maybe(
        draw, st.lists(st.one_of(st.integers(-5, small_vocab + 5), st.sampled_from(HUGE_INTS)), max_size=5), 10
    )
    fields["seed"] = _maybe(draw, st.one_of(st.sampled_from(HUGE_INTS), st.integers(), st.sampled_from([1.5, "7"])), 25)
    fields["ignore_eos"] = _maybe(draw, st.one_of(st.booleans(), st.sampled_from(["no", 0])), 10)
    for name in ("presence_penalty", "frequency_penalty"):
        fields[name] = _maybe(draw, st.sampled_from([0, 0.0, 0.5, -2, math.nan, "0"]), 5)
    fields["logit_bias"] = _maybe(
        draw,
        st.sampled_from(
            [{}, {"5": 100}, {"x": "y"}, [], None, {"5": 101}, {"-1": 1}, {"99999999": 1}, {"5": math.inf}]
        ),
        5,
    )
    fields["min_p"] = _maybe(draw, st.sampled_from([0, 0.1, 1.0, 1.5, -0.1, math.nan, "0"]), 5)
    fields["repetition_penalty"] = _maybe(draw, st.sampled_from([1.0, 1.3, 0.0, -1.0, 1e308, math.inf, "1"]), 5)
    fields["min_tokens"] = _maybe(draw, st.one_of(st.integers(-2, 40), st.sampled_from(HUGE_INTS)), 5)
    fields["user"] = _maybe(draw, odd_text, 5)
    return {k: v for k, v in fields.items() if v is not _OMIT}


@st.composite
def messages(draw) -> list:
    role = st.one_of(
        st.sampled_from(["user", "user", "system", "assistant", "developer", "tool", "bogus", "", "USER"]), json_scalars
    )
    part = st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": odd_text}),
        st.sampled_from(
            [
                {"type": "image_url", "image_url": {"url": "http://x"}},
                {"type": "text"},
                {"text": "x"},
                {"type": "text", "text": 5},
                "just a string",
                None,
                7,
            ]
        ),
    )
    content = weighted(draw, (6, odd_text), (2, st.lists(part, max_size=3)), (1, st.sampled_from([None, 5, {}, ["x"]])))
    message = {"role": draw(role), "content": content}
    if draw(st.integers(0, 9)) == 0:
        message.pop(draw(st.sampled_from(["role", "content"])))
    if draw(st.integers(0, 19)) == 0:
        message["name"] = draw(json_scalars)
    return message


@st.composite
def chat_bodies(draw, models: list[str], max_model_len: int, small_vocab: int) -> dict:
    body = draw(sampling_fields(max_model_len, small_vocab))
    body["model"] = weighted(
        draw,
        (8, st.sampled_from(models)),
        (
            1,
            st.sampled_from(
                [
                    "nope",
                    "",
                    "auto:",
                    "auto:2",
                    "auto:nan",
                    "AUTO",
                    "local:1",
                    "cloud:0.5",
                    "auto:0.3",
                    "x" * 5000,
                    None,
                ]
            ),
        ),
        (1, json_scalars),
    )
    body["messages"] = weighted(
        draw,
        (8, st.lists(messages(), min_size=1, max_size=3)),
        (1, st.sampled_from([[], None, {}, "hi", [[]], [{"role": "user", "content": "x" * 100_000}]])),
        (1, json_values),
    )
    body["logprobs"] = _maybe(draw, st.one_of(st.booleans(), st.sampled_from([None, 1, 5, "true"])), 20)
    body["top_logprobs"] = _maybe(draw, st.one_of(st.integers(-1, 25), st.sampled_from([10**30, 2.5, None])), 15)
    body["private"] = _maybe(draw, st.one_of(st.booleans(), st.sampled_from(["yes", 1])), 10)
    body = {k: v for k, v in body.items() if v is not _OMIT}
    return _scramble(draw, body)


@st.composite
def completion_bodies(draw, models: list[str], max_model_len: int, small_vocab: int, words: list[str]) -> dict:
    body = draw(sampling_fields(max_model_len, small_vocab))
    body["model"] = weighted(
        draw,
        (8, st.sampled_from(models)),
        (1, st.sampled_from(["nope", "", "auto", "cloud", "local", "auto:0.5", None])),
        (1, json_scalars),
    )
    sentence = st.lists(st.sampled_from(words), min_size=1, max_size=6).map(" ".join)
    body["prompt"] = weighted(
        draw,
        (10, sentence),
        (3, st.lists(st.integers(0, small_vocab - 1), min_size=1, max_size=8)),
        (2, st.lists(st.one_of(st.integers(-3, small_vocab + 3), st.sampled_from(HUGE_INTS)), max_size=4)),
        (1, st.lists(st.lists(st.integers(0, small_vocab - 1), max_size=4), max_size=2)),
        (1, st.lists(sentence, max_size=3)),
        (2, odd_text),
        (1, st.sampled_from(["", [], [[]], [""], None, " " * 5000, "w5 " * 2000, list(range(3, 3 + max_model_len))])),
        (1, json_values),
    )
    body["logprobs"] = _maybe(
        draw, st.one_of(st.integers(-1, 6), st.sampled_from([True, False, 10**30, 1.5, None])), 20
    )
    body["echo"] = _maybe(draw, st.one_of(st.booleans(), st.just("x")), 5)
    body["suffix"] = _maybe(draw, st.sampled_from([None, "", "x", 5]), 5)
    body["best_of"] = _maybe(draw, st.sampled_from([None, 1, 2, 0, -1, 10**30]), 5)
    body = {k: v for k, v in body.items() if v is not _OMIT}
    return _scramble(draw, body)


@st.composite
def response_items(draw) -> object:
    """One item of a Responses `input`: mostly messages, sometimes function calls and outputs, and odd ones."""
    kind = draw(st.integers(0, 9))
    if kind < 6:
        message = draw(messages())
        if draw(st.integers(0, 3)) == 0:
            message["type"] = "message"
        if isinstance(message.get("content"), list):  # the Responses part kinds, and chat's
            message["content"] = [
                {**part, "type": draw(st.sampled_from(["input_text", "output_text", "text", "input_image"]))}
                if isinstance(part, dict)
                else part
                for part in message["content"]
            ]
        return message
    if kind == 6:
        return {
            "type": "function_call",
            "call_id": draw(st.one_of(odd_text, st.none())),
            "name": draw(st.sampled_from(["get_weather", "", None, 5])),
            "arguments": draw(st.sampled_from(['{"city": "Paris"}', "{", "", None, 3])),
        }
    if kind == 7:
        return {
            "type": "function_call_output",
            "call_id": draw(st.one_of(odd_text, st.none())),
            "output": draw(st.one_of(odd_text, st.sampled_from([None, [], [{"type": "input_text", "text": "x"}], 5]))),
        }
    return draw(
        st.one_of(
            st.sampled_from(
                [{"type": "reasoning", "summary": []}, {"type": "item_reference", "id": "x"}, {}, None, "hi", []]
            ),
            json_values,
        )
    )


@st.composite
def valid_responses_bodies(draw, models: list[str]) -> dict:
    """Bodies the server should answer (200): what reaches the engine, the stream and the store."""
    plain = st.text(st.characters(codec="utf-8"), min_size=1, max_size=30)
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "developer", "assistant"]), "content": plain}
    )
    body = {
        "model": draw(st.sampled_from(models)),
        "input": draw(st.one_of(plain, st.lists(message, min_size=1, max_size=3))),
        "max_output_tokens": draw(st.integers(1, 4)),
    }
    optional = {
        "instructions": plain,
        "stream": st.booleans(),
        "store": st.booleans(),
        "temperature": st.sampled_from([0.0, 0.7, 1.5]),
        "top_p": st.sampled_from([0.5, 1.0]),
        "metadata": st.just({"k": "v"}),
        "text": st.sampled_from([{"format": {"type": "text"}}, {"format": {"type": "json_object"}}]),
        "include": st.just([]),
        "truncation": st.just("disabled"),
        "user": plain,
    }
    for name, strategy in optional.items():
        body[name] = _maybe(draw, strategy, 30)
    return {k: v for k, v in body.items() if v is not _OMIT}


# metadata at and past OpenAI's bounds (16 pairs, keys of 64 characters, values of 512): past them, a 400
# naming the field (tests/reliability/test_fuzz_http.py checks each once; the fuzz mixes them with the rest).
BOUNDED_METADATA = [
    {f"{i:02d}".ljust(64, "k"): "v" * 512 for i in range(16)},
    {f"k{i}": "v" for i in range(17)},
    {"x" * 65: "y"},
    {"k": "v" * 513},
]
# (a field of a valid body past its bound, the param its 400 names)
OVER_BOUNDS = [
    ({"metadata": BOUNDED_METADATA[1]}, "metadata"),
    ({"metadata": BOUNDED_METADATA[2]}, "metadata"),
    ({"metadata": BOUNDED_METADATA[3]}, "metadata.k"),
    ({"user": "u" * 65}, "user"),
    ({"text": {"format": {"type": "json_schema", "name": "n" * 65, "schema": {"type": "object"}}}}, "text.format.name"),
    ({"instructions": "x" * (2 * 1024 * 1024 + 1)}, "store"),  # one stored response past responses_max_row_mb
]


@st.composite
def responses_bodies(draw, models: list[str], max_model_len: int) -> dict:
    """POST /v1/responses bodies: a third answerable ones, the rest its own fields at odd values, chat's
    names it refuses, and tandem's extensions."""
    if draw(st.integers(0, 2)) == 0:
        return draw(valid_responses_bodies(models))
    body = {"model": weighted(draw, (8, st.sampled_from(models)), (1, st.sampled_from(["nope", "", "auto:2", None])))}
    body["input"] = weighted(
        draw,
        (4, st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)),  # mostly valid: the engine path runs
        (1, odd_text),
        (5, st.lists(response_items(), min_size=1, max_size=4)),
        (1, st.one_of(st.sampled_from([[], None, {}, "x" * 100_000]), json_values)),
    )
    body["instructions"] = _maybe(draw, st.one_of(st.text(max_size=20), odd_text, st.sampled_from([None, 5, []])), 30)
    body["max_output_tokens"] = weighted(
        draw,
        (70, st.integers(1, 3)),
        (10, st.sampled_from([max_model_len - 8, max_model_len + 1])),
        (20, st.sampled_from([0, -1, 10**30, 1.5, "16", None, True])),
    )
    body["temperature"] = _maybe(draw, st.one_of(st.floats(0, 2), st.sampled_from(ODD_FLOATS + [-0.1, "1"])), 40)
    body["top_p"] = _maybe(draw, st.sampled_from([0.5, 1.0, 1.1, math.nan, "0.5"]), 20)
    body["stream"] = _maybe(draw, st.one_of(st.booleans(), st.sampled_from([None, 1, "true"])), 50)
    body["store"] = _maybe(draw, st.one_of(st.booleans(), st.sampled_from([None, "no", 0])), 30)
    body["previous_response_id"] = _maybe(draw, st.one_of(odd_text, st.sampled_from(["resp_0", None, 5])), 15)
    body["metadata"] = _maybe(draw, st.sampled_from([{}, {"k": "v"}, {"k": 5}, [], None, *BOUNDED_METADATA]), 10)
    body["user"] = _maybe(draw, st.sampled_from(["u", "u" * 64, "u" * 65, "", None, 5]), 10)
    body["tools"] = _maybe(
        draw,
        st.sampled_from(
            [
                [],
                [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
                [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}],
                [{"type": "function"}],
                [{"type": "web_search"}],
                [{"type": "function", "function": {"name": "f"}}],  # chat's nesting
                None,
                "x",
            ]
        ),
        20,
    )
    body["tool_choice"] = _maybe(
        draw,
        st.sampled_from(
            ["auto", "none", "required", {"type": "function", "name": "get_weather"}, {"type": "file_search"}, 5]
        ),
        15,
    )
    body["text"] = _maybe(
        draw,
        st.sampled_from(
            [
                {"format": {"type": "text"}},
                {"format": {"type": "json_object"}},
                {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}, "strict": True}},
                {"format": {"type": "json_schema", "schema": {"type": "object"}}},  # no name
                {"format": {"type": "json_schema", "name": "n" * 65, "schema": {"type": "object"}}},  # name too long
                {"format": {"type": "json_schema", "name": "a", "schema": {"type": "bogus"}}},
                {"format": {"type": "grammar"}},
                {"verbosity": "low"},
                {},
                None,
            ]
        ),
        15,
    )
    for name, values in (
        ("include", [[], ["reasoning.encrypted_content"], None, "x"]),
        ("truncation", ["disabled", "auto", None, 5]),
        ("background", [False, True, None]),
        ("reasoning", [{"effort": "low"}, None, {}]),
        ("parallel_tool_calls", [True, False, None, "x"]),
        ("messages", [[{"role": "user", "content": "x"}], None]),
        ("max_tokens", [4, None]),
        ("private", [True, False, "yes"]),
        ("top_k", [5, -2, "4"]),
    ):
        body[name] = _maybe(draw, st.sampled_from(values), 8)
    body = {k: v for k, v in body.items() if v is not _OMIT}
    return _scramble(draw, body)


def _scramble(draw, body: dict) -> dict:
    """A quarter of the bodies get one field replaced by a random JSON value (any type) or dropped."""
    roll = draw(st.integers(0, 99))
    if roll < 25 and body:
        key = draw(st.sampled_from(sorted(body)))
        body[key] = draw(json_values)
    elif roll < 30 and body:
        body.pop(draw(st.sampled_from(sorted(body))))
    elif roll < 33:
        body[draw(odd_text)] = draw(json_values)  # an unknown field
    return body


def encode_body(body, ensure_ascii: bool) -> bytes:
    """JSON text as the server reads it: NaN/Infinity as literals, lone surrogates escaped
    (ensure_ascii) or written as raw surrogate bytes (invalid UTF-8)."""
    text = json.dumps(body, allow_nan=True, ensure_ascii=ensure_ascii)
    return text.encode("utf-8", "surrogatepass")


@st.composite
def malformed_bodies(draw, valid_body: dict) -> bytes:
    """Bytes a JSON parser must refuse (or a JSON value that is not a request object)."""
    good = encode_body(valid_body, ensure_ascii=True)
    kind = draw(st.integers(0, 11))
    if kind == 0:
        return good[: draw(st.integers(0, max(0, len(good) - 1)))]  # truncated
    if kind == 1:
        return draw(st.binary(max_size=200))
    if kind == 2:  # invalid UTF-8 spliced in
        at = draw(st.integers(0, len(good)))
        return (
            good[:at]
            + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80", b"\xf8\x88\x80\x80\x80"]))
            + good[at:]
        )
    if kind == 3:
        return draw(
            st.sampled_from(
                [b"", b" ", b"null", b"[]", b"{}", b"1", b'"x"', b"true", b"NaN", b"[1,2", b'{"a":}', b"{,}"]
            )
        )
    if kind == 4:
        depth = draw(st.sampled_from([100, 1000, 50_000]))
        return b'{"prompt":' + b"[" * depth + b"]" * depth + b"}"
    if kind == 5:
        return b"\xef\xbb\xbf" + good  # a BOM
    if kind == 6:
        return good.replace(b"{", b'{"prompt": NaN, "messages": Infinity, ', 1)
    if kind == 7:
        return good + b"garbage"
    if kind == 8:
        return good.replace(b'"', b"'")
    if kind == 9:
        return b'{"a":' * 500
    if kind == 10:  # duplicate keys, a number too long for any float
        return b'{"max_tokens": 1, "max_tokens": 1' + b"0" * 5000 + b"}"
    return json.dumps(valid_body).encode("utf-16")


# -- response checks -----------------------------------------------------------------------------


class _StrictError(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    message: str
    type: str
    param: str | None
    code: str | None


class _StrictErrorBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    error: _StrictError


def check_error_body(payload) -> None:
    """OpenAI's error shape, exactly: {"error": {"message": str, "type": str, "param": str|null, "code": str|null}}."""
    parsed = _StrictErrorBody.model_validate(payload)
    assert parsed.error.message.strip(), payload
    assert parsed.error.type, payload


def check_status(status: int, headers, body_text: str) -> None:
    """No 5xx, except a 503 for an overloaded or loading engine, which must carry Retry-After."""
    if status >= 500:
        assert status == 503 and "retry-after" in headers, f"{status}: {body_text[:2000]}"


def check_http_response(response, path: str, method: str = "POST") -> None:
    """Everything a fuzzed response must be, for any path."""
    check_status(response.status_code, response.headers, response.text)
    if method == "HEAD":
        return
    content_type = response.headers.get("content-type", "")
    if response.status_code >= 400:
        assert content_type.startswith("application/json"), (response.status_code, content_type, response.text[:500])
        check_error_body(response.json())
        return
    if response.status_code == 499:
        raise AssertionError("499 with the client still connected")
    if path.endswith("/v1/responses") and method == "POST":
        if content_type.startswith("text/event-stream"):
            check_response_events(response.text)
        else:
            _check_response_object(ResponseObject.model_validate_json(response.content))
    elif path.endswith("/chat/completions"):
        if content_type.startswith("text/event-stream"):
            check_stream(response.text, ChatCompletionChunk)
        else:
            _check_whole(ChatCompletionResponse.model_validate_json(response.content))
    elif path.endswith("/completions"):
        if content_type.startswith("text/event-stream"):
            check_stream(response.text, CompletionResponse)
        else:
            _check_whole(CompletionResponse.model_validate_json(response.content))
    elif 300 <= response.status_code < 400:
        assert "location" in response.headers, response.headers  # e.g. Starlette's trailing-slash redirect
    else:
        assert response.content, response


def _check_whole(parsed) -> None:
    assert parsed.choices, parsed
    assert parsed.usage is not None
    for i, choice in enumerate(parsed.choices):
        assert choice.index == i and choice.finish_reason in ("stop", "length"), parsed


def check_stream(text: str, chunk_model: type[BaseModel]) -> None:
    """SSE: `data:` events only, each an OpenAI chunk or error object, ending with [DONE];
    every choice that started gets a finish reason unless an error event ended the stream."""
    assert text.endswith("\n\n"), text[-500:]
    events = text[:-2].split("\n\n")
    assert events[-1] == "data: [DONE]", events[-3:]
    started, finished, errored = set(), set(), False
    for event in events[:-1]:
        assert event.startswith("data: ") and "\n" not in event, event[:500]
        payload = json.loads(event[len("data: ") :])
        if "error" in payload:
            check_error_body(payload)
            errored = True
            continue
        chunk = chunk_model.model_validate(payload)
        for choice in chunk.choices:
            started.add(choice.index)
            if choice.finish_reason is not None:
                assert choice.finish_reason in ("stop", "length"), payload
                finished.add(choice.index)
    assert errored or started == finished, (started, finished)


def _check_response_object(parsed) -> None:
    assert parsed.object == "response" and parsed.status in ("completed", "incomplete"), parsed
    assert parsed.usage is not None and parsed.output, parsed
    assert (parsed.status == "incomplete") == (parsed.incomplete_details is not None), parsed


def check_response_events(text: str) -> None:
    """The Responses API's stream: `event:` and `data:` lines, sequence numbers 0, 1, 2...; it opens with
    response.created and ends with response.completed / response.incomplete, or an error event."""
    assert text.endswith("\n\n"), text[-500:]
    kinds = []
    for number, event in enumerate(text[:-2].split("\n\n")):
        head, _, data = event.partition("\n")
        assert head.startswith("event: ") and data.startswith("data: ") and "\n" not in data, event[:500]
        payload = json.loads(data[len("data: ") :])
        assert payload["type"] == head[len("event: ") :] and payload["sequence_number"] == number, event[:500]
        kinds.append(payload["type"])
        if payload["type"] == "error":
            assert isinstance(payload.get("message"), str) and payload["message"], payload
        elif payload["type"] in ("response.completed", "response.incomplete"):
            _check_response_object(ResponseObject.model_validate(payload["response"]))
    assert kinds[0] == "response.created", kinds[:3]
    assert kinds[-1] in ("response.completed", "response.incomplete", "error"), kinds[-3:]


def timed(call):
    """Run call(); return (result, seconds). A call over REQUEST_TIMEOUT_S is a hang."""
    start = time.monotonic()
    result = call()
    elapsed = time.monotonic() - start
    assert elapsed < REQUEST_TIMEOUT_S, f"request took {elapsed:.1f}s (hang)"
    return result, elapsed
