"""The pieces OpenAI's request bodies are made of: messages and their content parts, tool
definitions and choices, response_format, stream options; and the two bases of every request model
(strict types; a body or a message keeps its extra fields for sdk.protocol.request_fields)."""

from __future__ import annotations

import json
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from sdk.protocol.engine import InvalidRequestError, StructuredOutput


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class _TopLevel(_Request):
    """A request body or a message: extra fields are kept for request_fields to classify."""

    model_config = ConfigDict(extra="allow", strict=True)


class StreamOptions(_Request):
    include_usage: bool | None = None  # one last chunk with empty choices and the usage


class ContentPart(_Request):
    type: str
    text: str | None = None  # other part kinds (images, audio) are refused by the chat template


class JsonSchemaFormat(_Request):
    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # None: any JSON object
    strict: bool | None = None  # constrained the same either way: the grammar enforces the schema

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)


class ResponseFormat(_Request):
    """OpenAI's response_format: "text" (no constraint), "json_object", or "json_schema"."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def structured(self) -> StructuredOutput | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return StructuredOutput("json_object")
        if self.json_schema is None:
            raise InvalidRequestError(
                "response_format of type json_schema needs a json_schema object", "response_format"
            )
        if self.json_schema.schema_ is None:
            return StructuredOutput("json_object")
        return StructuredOutput("json_schema", json.dumps(self.json_schema.schema_))


class FunctionDefinition(_Request):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # JSON Schema of the arguments; None: any object
    strict: bool | None = None  # constrained the same either way: the grammar enforces the schema


class ToolParam(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


class MessageFunctionCall(_Request):
    name: str
    arguments: str  # JSON text


class MessageToolCall(_Request):
    id: str | None = None
    type: Literal["function"] = "function"
    function: MessageFunctionCall


class ChatMessage(_TopLevel):
    role: str  # checked against the allowed roles by sdk.engine_common.chat_template
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None  # passed to the chat template (which may or may not print it)
    tool_calls: list[MessageToolCall] | None = None  # an earlier assistant turn's calls
    tool_call_id: str | None = None  # a tool result's call (role "tool")
