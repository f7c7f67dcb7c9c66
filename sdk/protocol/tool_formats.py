"""How a model family writes tool calls in text, and how a conversation with tools is rendered for it.

Chat templates render role and content (sdk.engine_common.chat_template); tools are rendered into those
messages here, in the text format the model was trained on, and its answer is constrained by a
grammar (StructuredOutput kind "lark") so that a call always parses. One format per family, chosen
from the model's chat template (`format_for_template`):

- `ListFormat`: `<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>`, the tools listed
  in `<tools>...</tools>` in the system prompt, results in a user turn inside
  `<tool_response>...</tool_response>`. SmolLM2-Instruct was trained on this (Synth-APIGen); its
  GGUF template has no tools section, and it is the default for any template without one.
- `HermesFormat` (Qwen 2.5, Hermes): one `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
  per call; chosen when the template mentions `<tool_call>`.
- `Llama3Format` (Llama 3.1+ JSON tool calling): one bare `{"name": ..., "parameters": {...}}`;
  results as the template's `ipython`/`tool` turn; chosen when the template mentions `<|python_tag|>`.

The system prompt wording is tandem's own; the markers are each family's.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from sdk.protocol.engine import StructuredOutput
from sdk.protocol.json_schema_rules import JSON_FORMAT, closed_objects


@dataclass(frozen=True)
class ToolFunction:
    """One function the model may call: OpenAI's tools[i].function."""

    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None  # JSON Schema of the arguments; None: any object

    def as_json(self) -> dict:
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        out["parameters"] = self.parameters if self.parameters is not None else {"type": "object", "properties": {}}
        return out


@dataclass(frozen=True)
class ToolRequest:
    """What a request asks of tools: the functions offered, and whether a call is required."""

    functions: tuple[ToolFunction, ...]
    required: bool = False  # tool_choice "required" or a named function: the whole answer is calls
    parallel: bool = True  # parallel_tool_calls: False allows at most one call

    def names(self) -> list[str]:
        return [f.name for f in self.functions]


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text, as OpenAI's function.arguments


class ToolFormat(ABC):
    """One family's text format (subclasses); `opener` starts every answer that is a call."""

    name = ""
    opener = ""

    # -- rendering the conversation ----------------------------------------------------------

    def system_text(self, request: ToolRequest) -> str:
        # Measured on SmolLM2-135M (tool_choice required, 10 one-tool questions, greedy): the tools
        # as bare function objects with this wording picked 6 right; wrapped in OpenAI's
        # {"type": "function", ...} with a chattier wording, 5; the training set's own wording, 6.
        listing = json.dumps([f.as_json() for f in request.functions], ensure_ascii=False)
        text = (
            "You are an expert at composing function calls. You get a question and a set of functions. "
            "Based on the question, make the function calls that achieve its purpose.\n"
            f"You have access to these functions:\n<tools>{listing}</tools>\n"
            f"Your output must follow this format exactly, with no other text:\n{self.example()}"
        )
        return (
            text if request.required else text + "\nIf no function fits the question, answer it in plain text instead."
        )

    @abstractmethod
    def example(self) -> str: ...

    @abstractmethod
    def calls_text(self, calls: list[ParsedCall]) -> str:
        """An earlier assistant turn's calls, as the model would have written them."""
        ...

    def result_message(self, content: str) -> dict:
        """A tool's result as a message the chat template can render."""
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}

    # -- constraining and reading the answer ------------------------------------------------

    def grammar(self, request: ToolRequest, text: StructuredOutput | None = None) -> StructuredOutput:
        """The answer's grammar: calls only (required), or calls or text; `text` (a response_format)
        constrains the text branch."""
        calls = self.calls_rule(request)
        if request.required:
            return StructuredOutput("lark", grammar=f"start: {calls}\n{self.extra_rules(request)}")
        if text is not None:
            schema = closed_objects(json.loads(text.schema)) if text.schema is not None else {"type": "object"}
            answer = f"%json{json.dumps({'x-guidance': JSON_FORMAT, **schema})}"
        else:  # any text that cannot be mistaken for a call
            answer = f"/[^{self.opener[0]}][\\s\\S]*/"
        return StructuredOutput(
            "lark", grammar=f"start: answer | calls\nanswer: {answer}\ncalls: {calls}\n{self.extra_rules(request)}"
        )

    @abstractmethod
    def calls_rule(self, request: ToolRequest) -> str: ...

    def extra_rules(self, request: ToolRequest) -> str:
        """Named rules calls_rule refers to (one line each)."""
        return ""

    @abstractmethod
    def parse(self, text: str) -> list[ParsedCall] | None:
        """The calls in a whole answer, or None when it is not (or not entirely) calls."""
        ...

    @staticmethod
    def call_schema(function: ToolFunction, arguments_key: str = "arguments") -> dict:
        # Arguments the function does not declare are a small model's inventions (SmolLM2 added
        # "temperature" to get_weather(city)): objects are closed unless the schema opens them.
        parameters = closed_objects(function.parameters) if function.parameters is not None else {"type": "object"}
        return {
            "type": "object",
            "properties": {"name": {"const": function.name}, arguments_key: parameters},
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }

    def one_call_schema(self, request: ToolRequest, arguments_key: str = "arguments") -> dict:
        return {"x-guidance": JSON_FORMAT, "anyOf": [self.call_schema(f, arguments_key) for f in request.functions]}


def _load(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _call(item: Any, arguments_key: str = "arguments") -> ParsedCall | None:
    if (
        not isinstance(item, dict)
        or not isinstance(item.get("name"), str)
        or not isinstance(item.get(arguments_key), dict)
    ):
        return None
    return ParsedCall(item["name"], json.dumps(item[arguments_key], ensure_ascii=False))


class ListFormat(ToolFormat):
    name = "list"
    opener, closer = "<tool_call>", "</tool_call>"

    def example(self) -> str:
        return '<tool_call>[\n{"name": "function_name", "arguments": {"parameter": "value"}}\n]</tool_call>'

    def calls_text(self, calls: list[ParsedCall]) -> str:
        items = ",\n".join(
            json.dumps({"name": c.name, "arguments": _load(c.arguments)}, ensure_ascii=False) for c in calls
        )
        return f"{self.opener}[\n{items}\n]{self.closer}"

    def calls_rule(self, request: ToolRequest) -> str:
        schema = {
            "x-guidance": JSON_FORMAT,
            "type": "array",
            "minItems": 1,
            "items": {"anyOf": [self.call_schema(f) for f in request.functions]},
        }
        if not request.parallel:
            schema["maxItems"] = 1
        return f'"{self.opener}" %json{json.dumps(schema)} "{self.closer}"'

    def parse(self, text: str) -> list[ParsedCall] | None:
        text = text.strip()
        if not (text.startswith(self.opener) and text.endswith(self.closer)):
            return None
        items = _load(text[len(self.opener) : -len(self.closer)])
        calls = [_call(item) for item in items] if isinstance(items, list) and items else [None]
        return None if None in calls else calls


class HermesFormat(ToolFormat):
    name = "hermes"
    opener, closer = "<tool_call>", "</tool_call>"

    def example(self) -> str:
        return '<tool_call>\n{"name": "function_name", "arguments": {"parameter": "value"}}\n</tool_call>'

    def calls_text(self, calls: list[ParsedCall]) -> str:
        return "\n".join(
            f"{self.opener}\n"
            f"{json.dumps({'name': c.name, 'arguments': _load(c.arguments)}, ensure_ascii=False)}\n{self.closer}"
            for c in calls
        )

    def calls_rule(self, request: ToolRequest) -> str:
        return 'one_call ("\\n" one_call)*' if request.parallel else "one_call"

    def extra_rules(self, request: ToolRequest) -> str:
        return f'one_call: "{self.opener}\\n" %json{json.dumps(self.one_call_schema(request))} "\\n{self.closer}"\n'

    def parse(self, text: str) -> list[ParsedCall] | None:
        calls, rest = [], text.strip()
        while rest:
            if not rest.startswith(self.opener) or self.closer not in rest:
                return None
            body, rest = rest[len(self.opener) :].split(self.closer, 1)
            call = _call(_load(body))
            if call is None:
                return None
            calls.append(call)
            rest = rest.strip()
        return calls or None


class Llama3Format(ToolFormat):
    name = "llama3"
    opener = "{"

    def example(self) -> str:
        return '{"name": "function_name", "parameters": {"parameter": "value"}}'

    def calls_text(self, calls: list[ParsedCall]) -> str:
        return "; ".join(
            json.dumps({"name": c.name, "parameters": _load(c.arguments)}, ensure_ascii=False) for c in calls
        )

    def result_message(self, content: str) -> dict:
        return {"role": "tool", "content": content}  # Llama 3 templates render it as the ipython turn

    def calls_rule(self, request: ToolRequest) -> str:
        return f"%json{json.dumps(self.one_call_schema(request, 'parameters'))}"  # one call per turn

    def parse(self, text: str) -> list[ParsedCall] | None:
        call = _call(_load(text.strip()), "parameters")
        return [call] if call is not None else None


LIST, HERMES, LLAMA3 = ListFormat(), HermesFormat(), Llama3Format()


def format_for_template(template: str | None) -> ToolFormat:
    """The tool format a model's chat template implies (the list format when it has no tools section)."""
    template = template or ""
    if "<|python_tag|>" in template:
        return LLAMA3
    if "<tool_call>" in template:
        return HERMES
    return LIST


def tool_format_of(engine) -> ToolFormat:
    """The tool format of the model an engine serves (from its chat_template, when it has one)."""
    return format_for_template(engine.chat_template)
