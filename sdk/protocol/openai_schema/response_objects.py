"""The Responses API's answer (`object: "response"`) and its output items, with tandem's `tandem`
field: built from what the chat machinery produced (the text, the tool calls, the finish, the usage).

A finish for length is status "incomplete" with `incomplete_details.reason: "max_output_tokens"`,
as OpenAI answers it; any other finish is "completed"."""

from __future__ import annotations

import uuid
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from sdk.protocol.openai_schema.responses import ToolCall, Usage, _Response


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = Field(default_factory=list)


class FunctionCallItem(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int

    @classmethod
    def of(cls, usage: Usage) -> ResponseUsage:
        return cls(
            input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens, total_tokens=usage.total_tokens
        )


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseObject(_Response):
    """POST /v1/responses' answer (and what GET /v1/responses/{id} returns)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    model: str
    output: list[OutputMessage | FunctionCallItem] = Field(default_factory=list)
    usage: ResponseUsage | None = None
    error: dict[str, Any] | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    parallel_tool_calls: bool = True
    tool_choice: Any = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    store: bool = False
    user: str | None = None
    tandem: dict[str, Any] | None = None  # extension: how it was routed, the request fields ignored
    _omitted_when_none: ClassVar[tuple[str, ...]] = ("tandem",)


def output_items(text: str, calls: list[ToolCall] | None, status: str) -> list[OutputMessage | FunctionCallItem]:
    """The output of one answer: its message (when it has text, or nothing at all) and its function calls."""
    items: list[OutputMessage | FunctionCallItem] = []
    if text or not calls:
        items.append(OutputMessage(id=item_id("msg"), status=status, content=[OutputText(text=text)]))
    for call in calls or []:
        items.append(
            FunctionCallItem(
                id=item_id("fc"), call_id=call.id, name=call.function.name, arguments=call.function.arguments
            )
        )
    return items


def finish_status(finish_reason: str | None) -> tuple[str, IncompleteDetails | None]:
    """The response's status for a chat finish reason."""
    if finish_reason == "length":
        return "incomplete", IncompleteDetails(reason="max_output_tokens")
    return "completed", None


class ResponseDeleted(BaseModel):
    """DELETE /v1/responses/{id}'s answer."""

    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True
