"""Tool formats (sdk.protocol.tool_formats) without a model: each family's grammar compiles and
takes exactly its own calls, what it writes parses back, the format is picked from the chat
template, and a conversation with calls and results renders into plain messages."""

from __future__ import annotations

import json

import pytest

from sdk.engine_common.chat_template import render_chat
from sdk.engine_common.grammar import GrammarMasks
from sdk.protocol.tool_calls import ToolAnswer, render_tool_messages
from sdk.protocol.tool_formats import HERMES, LIST, LLAMA3, ParsedCall, ToolFunction, ToolRequest, format_for_template

WEATHER = ToolFunction(
    "get_weather",
    "Weather in a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
TIME = ToolFunction("get_time", "", None)
TOOLS = ToolRequest((WEATHER, TIME))
PARIS = ParsedCall("get_weather", '{"city": "Paris"}')
NOW = ParsedCall("get_time", "{}")

# One token per byte (ids 0-255) and an end token: any text can be spelled, so the grammar alone decides.
EOS = 256
BYTES = GrammarMasks(lambda: [bytes([i]) for i in range(256)] + [b""], EOS, lambda text: list(text.encode()))


def accepts(structured, text: str) -> bool:
    matcher = BYTES.matcher(structured)
    return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()


@pytest.mark.parametrize("tool_format", [LIST, HERMES, LLAMA3], ids=lambda f: f.name)
def test_written_calls_parse_back_and_fit_the_grammar(tool_format):
    calls = [PARIS] if tool_format is LLAMA3 else [PARIS, NOW]  # Llama 3's JSON format: one call a turn
    text = tool_format.calls_text(calls)
    assert tool_format.parse(text) == calls
    required = ToolRequest(TOOLS.functions, required=True)
    assert accepts(tool_format.grammar(required), text)
    assert accepts(tool_format.grammar(TOOLS), text)  # auto: a call is one of the two readings
    assert accepts(tool_format.grammar(TOOLS), "It is sunny.") and not accepts(
        tool_format.grammar(required), "It is sunny."
    )


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>[{"name": "get_wether", "arguments": {"city": "Paris"}}]</tool_call>',  # unknown function
        '<tool_call>[{"name": "get_weather", "arguments": {}}]</tool_call>',  # a required argument missing
        '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}]</tool_call>',  # undeclared
        '<tool_call>[{"name": "get_weather", "arguments": {"city": 3}}]</tool_call>',  # wrong type
        "<tool_call>[]</tool_call>",  # no call at all
        "<b>bold</b>",  # auto: text that opens like a call must be one
    ],
)
def test_the_list_grammar_refuses_what_is_not_a_valid_call(text):
    assert not accepts(LIST.grammar(TOOLS), text)


def test_parallel_false_allows_one_call_and_a_named_choice_only_that_function():
    two = LIST.calls_text([PARIS, NOW])
    assert not accepts(LIST.grammar(ToolRequest(TOOLS.functions, required=True, parallel=False)), two)
    assert accepts(LIST.grammar(ToolRequest(TOOLS.functions, required=True, parallel=False)), LIST.calls_text([NOW]))
    assert not accepts(LIST.grammar(ToolRequest((TIME,), required=True)), LIST.calls_text([PARIS]))
    assert not accepts(
        HERMES.grammar(ToolRequest(TOOLS.functions, required=True, parallel=False)), HERMES.calls_text([PARIS, NOW])
    )


def test_response_format_constrains_the_text_branch():
    from sdk.protocol.engine import StructuredOutput

    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    structured = LIST.grammar(TOOLS, StructuredOutput("json_schema", json.dumps(schema)))
    assert accepts(structured, '{"answer": "sunny"}') and not accepts(structured, "sunny")
    assert accepts(structured, LIST.calls_text([PARIS]))


def test_an_answer_reads_as_calls_only_when_it_opens_like_one():
    assert ToolAnswer.read(LIST, False, "It is sunny.") == ("It is sunny.", None)
    assert ToolAnswer.read(LIST, False, LIST.calls_text([PARIS])) == ("", [PARIS])
    cut = LIST.calls_text([PARIS])[:20]  # max_tokens ended it mid-call: the text is the answer
    assert ToolAnswer.read(LIST, True, cut) == (cut, None)
    streamed = ToolAnswer(LIST, False)
    assert [
        streamed.feed(piece) for piece in ("<tool", "_call>[", '{"name": "get_time", "arguments": {}}]</tool_call>')
    ] == ["", "", ""]
    assert streamed.finish() == ("", [NOW])


QWEN_LIKE = "{% for message in messages %}{% if tools %}<tool_call>{% endif %}{{ message.content }}{% endfor %}"
LLAMA_LIKE = "{% for message in messages %}<|python_tag|>{{ message.content }}{% endfor %}"


def test_the_format_follows_the_chat_template():
    assert format_for_template(QWEN_LIKE) is HERMES and format_for_template(LLAMA_LIKE) is LLAMA3
    assert format_for_template("{{ messages[0].content }}") is LIST and format_for_template(None) is LIST


CHATML = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_tool_loop_renders_into_plain_messages_for_the_template():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'},
    ]
    rendered = render_tool_messages(history, TOOLS, LIST)
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    assert rendered[0]["content"].startswith(LIST.system_text(TOOLS)) and rendered[0]["content"].endswith("Be brief.")
    assert '"name": "get_weather"' in rendered[0]["content"] and "<tools>" in rendered[0]["content"]
    assert LIST.parse(rendered[2]["content"]) == [PARIS]
    assert rendered[3]["content"] == '<tool_response>\n{"sky": "clear"}\n</tool_response>'
    prompt = render_chat(CHATML, rendered)
    assert prompt.endswith("<|im_start|>assistant\n") and "</tool_response>" in prompt
    # Llama 3 results are the template's own tool turn; with no tools offered, no tools text is added.
    plain = render_tool_messages(history[1:], None, LLAMA3)
    assert plain[0] == history[1] and plain[2] == {"role": "tool", "content": '{"sky": "clear"}'}


def test_objects_are_closed_unless_the_schema_says_otherwise():
    """As vLLM's default backend does: a pydantic model's schema (no additionalProperties) takes no
    keys of the model's own invention; a schema that opens an object keeps it open."""
    from sdk.protocol.engine import StructuredOutput

    pydantic_like = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "pet": {"type": "object", "properties": {"kind": {"type": "string"}}},
        },
    }
    closed = StructuredOutput("json_schema", json.dumps(pydantic_like))
    assert accepts(closed, '{"name": "Ann", "pet": {"kind": "cat"}}')
    assert not accepts(closed, '{"name": "Ann", "required": ["name"]}')
    assert not accepts(closed, '{"name": "Ann", "pet": {"kind": "cat", "age": 3}}')
    opened = StructuredOutput("json_schema", json.dumps({**pydantic_like, "additionalProperties": True}))
    assert accepts(opened, '{"name": "Ann", "required": ["name"]}')
    combined = {"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"b": {"type": "integer"}}}]}
    assert accepts(StructuredOutput("json_schema", json.dumps(combined)), '{"a": 1, "b": 2}')  # allOf stays satisfiable
