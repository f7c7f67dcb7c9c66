"""OpenAI's Responses API body (POST /v1/responses), read into the chat request tandem runs.

A Responses request is a conversation (`input`: a string, or items: messages, function calls
and their outputs), `instructions`, function tools, and `text.format`. tandem answers it with
the chat machinery both tiers already have, so the body becomes a ChatCompletionRequest
(`chat_payload`): the same validators, sampling parameters, tool grammar and structured output.

What the API has that tandem cannot give is refused with a 400 naming it (other item kinds,
content parts that are not text, hosted tools, reasoning, background runs, conversations);
values that ask for nothing (`include: []`, `truncation: "disabled"`, `background: false`)
are accepted. tandem's body extensions (`private`, `top_k`, `min_p`, ...) are passed on to
the chat request, where they work as on chat.

What a stored response echoes but no prompt bounds is held to OpenAI's own limits, refused with
OpenAI's wording and a 400 naming the field: `metadata` (16 pairs, keys up to 64 characters,
values up to 512), `user` (64) and `text.format.name` (64). The rest it echoes is in the prompt
(bounded by the context) or falls under the server's bound on one stored response.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import ConfigDict, Field, model_validator

from sdk.protocol.engine import InvalidRequestError
from sdk.protocol.openai_schema.request_parts import _Request, _TopLevel
from sdk.protocol.request_fields import refuse_responses_fields

# OpenAI's bounds on what a response echoes (and a stored one keeps) outside the prompt.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_USER_CHARS = 64
MAX_FORMAT_NAME_CHARS = 64

# Message roles a client may send; `developer` is OpenAI's newer name for the system prompt.
INPUT_ROLES = ("system", "developer", "user", "assistant")
TEXT_PARTS = ("input_text", "output_text")
ITEM_BOOKKEEPING = frozenset(
    {"id", "status"}
)  # an output item's own id and state, replayed as input  # a replayed assistant message carries output_text parts


class InputPart(_Request):
    type: str
    text: str | None = None


class InputItem(_TopLevel):
    """One item of `input`: a message (`type` "message", or absent with a role), a function call an
    earlier answer made, or that call's output."""

    type: str | None = None
    role: str | None = None
    content: Union[str, list[InputPart], None] = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: Union[str, list[InputPart], None] = None


class ResponseTextFormat(_Request):
    """`text.format`: as chat's response_format, with the schema's fields on the format itself."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, json_schema_extra={"maxLength": MAX_FORMAT_NAME_CHARS})
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    def response_format(self) -> dict[str, Any]:
        """Chat's response_format for this format."""
        if self.type != "json_schema":
            return {"type": self.type}
        if not self.name:
            raise InvalidRequestError("text.format of type json_schema needs a name", "text.format.name")
        inner = {"name": self.name, "description": self.description, "schema": self.schema_, "strict": self.strict}
        return {"type": "json_schema", "json_schema": {k: v for k, v in inner.items() if v is not None}}


class ResponseText(_Request):
    format: ResponseTextFormat | None = None


class ResponseTool(_Request):
    """A tool: function tools only (flat: name, description, parameters, strict)."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseNamedToolChoice(_Request):
    type: str
    name: str | None = None


class ResponseCreateRequest(_TopLevel):
    """POST /v1/responses. Fields beyond these are chat's (tandem's extensions pass on) or refused."""

    model: str | None = None
    input: Union[str, list[InputItem]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    # OpenAI's bounds, stated in the document too (the validator below refuses past them, in OpenAI's words).
    user: str | None = Field(default=None, json_schema_extra={"maxLength": MAX_USER_CHARS})
    metadata: dict[str, str] | None = Field(
        default=None,
        json_schema_extra={
            "maxProperties": MAX_METADATA_PAIRS,
            "propertyNames": {"maxLength": MAX_METADATA_KEY_CHARS},
            "additionalProperties": {"type": "string", "maxLength": MAX_METADATA_VALUE_CHARS},
        },
    )
    stream: bool | None = False
    store: bool | None = True  # keep the response (sdk.openai_server.stored_responses); None reads as true
    previous_response_id: str | None = None
    tools: list[ResponseTool] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], ResponseNamedToolChoice, None] = None
    parallel_tool_calls: bool | None = None
    text: ResponseText | None = None
    private: bool | None = None  # extension (tandem): routed models answer on the device only

    @model_validator(mode="after")
    def _within_openai_bounds(self) -> ResponseCreateRequest:
        """OpenAI's limits on the fields echoed outside the prompt (module docstring), in its words."""
        metadata = self.metadata or {}
        if len(metadata) > MAX_METADATA_PAIRS:
            raise InvalidRequestError(
                f"Invalid 'metadata': too many properties. Expected an object with at most {MAX_METADATA_PAIRS} "
                f"properties, but got an object with {len(metadata)} properties instead.",
                "metadata",
            )
        for key, value in metadata.items():
            if len(key) > MAX_METADATA_KEY_CHARS:
                raise InvalidRequestError(
                    f"Invalid 'metadata': key {key[:MAX_METADATA_KEY_CHARS]!r}... is too long. Expected keys with "
                    f"maximum length {MAX_METADATA_KEY_CHARS}, but got a key with length {len(key)} instead.",
                    "metadata",
                )
            _at_most(value, MAX_METADATA_VALUE_CHARS, f"metadata.{key}")
        if self.user is not None:
            _at_most(self.user, MAX_USER_CHARS, "user")
        if self.text is not None and self.text.format is not None and self.text.format.name is not None:
            _at_most(self.text.format.name, MAX_FORMAT_NAME_CHARS, "text.format.name")
        return self

    @property
    def ignored_fields(self) -> list[str]:
        """The input items' fields that change nothing (`input[i].name`); the body's own extra fields go on
        to the chat request it becomes, which says which of those were ignored. An item's `id` and `status`
        (what a client replaying earlier output items sends) are the API's bookkeeping and ask for nothing."""
        if isinstance(self.input, str):
            return []
        return [
            f"input[{index}].{name}"
            for index, item in enumerate(self.input)
            for name in (item.model_extra or {})
            if name not in ITEM_BOOKKEEPING
        ]

    def chat_payload(self, history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The chat request body that answers this one: `history` (a stored response's conversation,
        for previous_response_id) goes after the instructions and before this request's input."""
        extra = refuse_responses_fields(self.model_extra or {})  # the rest go on to chat, whose tables apply
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        messages += self.conversation(history)
        payload: dict[str, Any] = {
            **extra,
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_output_tokens,
            "stream": self.stream or None,  # the chat request runs streamed when this one is
            "temperature": self.temperature,
            "top_p": self.top_p,
            "user": self.user,
            "private": self.private,
            "parallel_tool_calls": self.parallel_tool_calls,
        }
        if self.tools:
            payload["tools"] = [_chat_tool(i, tool) for i, tool in enumerate(self.tools)]
        if self.tool_choice is not None:
            payload["tool_choice"] = _chat_tool_choice(self.tool_choice)
        if self.text is not None and self.text.format is not None:
            payload["response_format"] = self.text.format.response_format()
        # Unset fields are left out; an extra sent as null stays (chat lists an unknown one as ignored).
        return {name: value for name, value in payload.items() if value is not None or name in extra}

    def conversation(self, history: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The chat messages this request continues and adds, without its instructions (a stored
        response keeps these; OpenAI does not carry instructions over to the next response)."""
        return [*(history or []), *input_messages(self.input)]


def _at_most(value: str, limit: int, param: str) -> None:
    if len(value) > limit:
        raise InvalidRequestError(
            f"Invalid '{param}': string too long. Expected a string with maximum length {limit}, but got a string "
            f"with length {len(value)} instead.",
            param,
        )


def input_messages(items: str | list[InputItem]) -> list[dict[str, Any]]:
    """Chat messages for `input`: consecutive function calls become one assistant turn's tool calls,
    their outputs tool messages."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not items:
        raise InvalidRequestError("input must contain at least one item", "input")
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        where = f"input[{index}]"
        kind = item.type or ("message" if item.role is not None else None)
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            if not item.call_id or not item.name or item.arguments is None:
                raise InvalidRequestError(f"{where}: a function_call needs call_id, name and arguments", where)
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            previous = messages[-1] if messages else None
            if previous is not None and previous["role"] == "assistant" and "tool_calls" in previous:
                previous["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not item.call_id or item.output is None:
                raise InvalidRequestError(f"{where}: a function_call_output needs call_id and output", where)
            output = item.output if isinstance(item.output, str) else _text(item.output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
        else:
            raise InvalidRequestError(
                f"{where}.type {kind!r} is not supported; send messages, function_call and function_call_output items",
                f"{where}.type",
            )
    return messages


def _message(item: InputItem, where: str) -> dict[str, Any]:
    if item.role not in INPUT_ROLES:
        raise InvalidRequestError(f"{where}.role must be one of {', '.join(INPUT_ROLES)}, got {item.role!r}", where)
    if item.content is None:
        raise InvalidRequestError(f"{where}.content is required", f"{where}.content")
    content = item.content if isinstance(item.content, str) else _text(item.content, f"{where}.content")
    return {"role": "system" if item.role == "developer" else item.role, "content": content}


def _text(parts: list[InputPart], where: str) -> str:
    """The text of text parts; any other kind (images, files, audio) is refused, naming it."""
    texts = []
    for index, part in enumerate(parts):
        if part.type not in TEXT_PARTS or part.text is None:
            raise InvalidRequestError(
                f"{where}[{index}].type {part.type!r} is not supported; only text parts ({', '.join(TEXT_PARTS)})",
                f"{where}[{index}].type",
            )
        texts.append(part.text)
    return "".join(texts)


def _chat_tool(index: int, tool: ResponseTool) -> dict[str, Any]:
    if tool.type != "function":
        raise InvalidRequestError(
            f"tools[{index}].type {tool.type!r} is not supported; only function tools", f"tools[{index}].type"
        )
    if not tool.name:
        raise InvalidRequestError(f"tools[{index}] needs a name", f"tools[{index}].name")
    function = {
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "strict": tool.strict,
    }
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def _chat_tool_choice(choice: str | ResponseNamedToolChoice) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    if choice.type != "function" or not choice.name:
        raise InvalidRequestError(
            f"tool_choice {{'type': {choice.type!r}}} is not supported; name a function tool", "tool_choice"
        )
    return {"type": "function", "function": {"name": choice.name}}
