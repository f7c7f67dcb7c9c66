"""OpenAI's response shapes (chat, completions, models, errors), with tandem's extension fields:
`tandem` on a response, `stop_reason` on a choice, `sampling_defaults` and
`vocabulary_fingerprint` on a model card. Extras that are unset are left out, not sent as null."""

from __future__ import annotations

import time
import uuid
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, model_serializer


def now() -> int:
    return int(time.time())


class _Response(BaseModel):
    """A response model whose optional extras are left out, not sent as null, when unset."""

    _omitted_when_none: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_unset_extras(self, handler):
        data = handler(self)
        for name in self._omitted_when_none:
            if data.get(name) is None:
                data.pop(name, None)
        return data


class CompletionTokensDetails(BaseModel):
    """OpenAI's Predicted Outputs counters; tandem's cloud engine fills them with its
    speculative decoding figures (draft tokens the target accepted / rejected)."""

    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails | None = None  # only when the engine speculated
    _omitted_when_none: ClassVar[tuple[str, ...]] = (
        "completion_tokens_details",
    )  # absent, as OpenAI's usage without it


class TopLogprobEntry(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprobEntry):
    top_logprobs: list[TopLogprobEntry] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolCallDelta(ToolCall):
    """A streamed call: tandem sends each call whole, in one delta (the openai client assembles either way)."""

    index: int


def tool_call_objects(calls) -> list[ToolCall]:
    """OpenAI tool_calls, with fresh ids, for sdk.protocol.tool_formats.ParsedCall objects."""
    return [
        ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=FunctionCall(name=c.name, arguments=c.arguments))
        for c in calls
    ]


def tool_call_deltas(calls) -> list[ToolCallDelta]:
    """The calls of a streamed answer, each whole, indexed in order."""
    return [ToolCallDelta(index=i, **call.model_dump()) for i, call in enumerate(tool_call_objects(calls))]


class ChatResponseMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None  # with finish_reason "tool_calls" (content is then null)
    _omitted_when_none: ClassVar[tuple[str, ...]] = ("tool_calls",)

    @classmethod
    def answer(cls, content: str, calls=None) -> ChatResponseMessage:
        """The message for an answer read by sdk.protocol.tool_calls.ToolAnswer (calls: content is null when empty)."""
        if calls:
            return cls(content=content or None, tool_calls=tool_call_objects(calls))
        return cls(content=content)


def _answer_finish_reason(calls, finish_reason: str | None) -> str | None:
    """An answer that calls tools finishes with "tool_calls", whatever stopped its generation."""
    return "tool_calls" if calls else finish_reason


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    # vLLM's field; tandem: "repetition" when a loop was stopped (finish_reason "length"),
    # "closed_within_max_tokens" when a structured answer took its closing path ("stop")
    stop_reason: str | None = None

    @classmethod
    def answer(
        cls,
        index: int,
        content: str,
        calls,
        finish_reason: str | None,
        stop_reason: str | None = None,
        logprobs: ChatLogprobs | None = None,
    ) -> ChatChoice:
        """The choice for an answer read by sdk.protocol.tool_calls.ToolAnswers (its content and calls)."""
        return cls(
            index=index,
            message=ChatResponseMessage.answer(content, calls),
            logprobs=logprobs,
            finish_reason=_answer_finish_reason(calls, finish_reason),
            stop_reason=stop_reason,
        )


class _WithTandem(_Response):
    """A response with tandem's optional extension field, left out when there is nothing to say."""

    tandem: dict[str, Any] | None = None  # e.g. {"ignored_fields": [...]}; routed answers: how they were routed
    _omitted_when_none: ClassVar[tuple[str, ...]] = ("tandem",)


class ChatCompletionResponse(_WithTandem):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChoice]
    usage: Usage


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler):
        # A delta carries only what changed: {"content": "x"}, never {"role": null, ...}.
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | None = None  # on the chunk with finish_reason, as ChatChoice's

    @classmethod
    def opening(cls, index: int) -> ChatChunkChoice:
        """OpenAI opens every streamed choice with the assistant role and empty content."""
        return cls(index=index, delta=DeltaMessage(role="assistant", content=""))

    @classmethod
    def ending(
        cls, index: int, calls, finish_reason: str | None, stop_reason: str | None = None
    ) -> list[ChatChunkChoice]:
        """What ends a streamed choice after its content: the calls, each whole, then the finish in a
        choice of its own (as OpenAI streams them); without calls, the finish alone."""
        finish = cls(
            index=index,
            delta=DeltaMessage(),
            finish_reason=_answer_finish_reason(calls, finish_reason),
            stop_reason=stop_reason,
        )
        if not calls:
            return [finish]
        return [cls(index=index, delta=DeltaMessage(tool_calls=tool_call_deltas(calls))), finish]


class ChatCompletionChunk(_WithTandem):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | None = None  # as ChatChoice's


class CompletionResponse(_WithTandem):
    """Both the whole response and each streamed chunk: OpenAI uses one object name for both."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "tandem"
    max_model_len: int | None = None  # extension (vLLM): prompt + completion limit
    # extension (tandem): what a request that leaves a sampling field out gets, and where it comes
    # from: {"temperature": {"value": 0.2, "source": "built-in: ..."}, ...}; absent when not known
    sampling_defaults: dict[str, dict[str, Any]] | None = None
    vocabulary_fingerprint: str | None = None  # extension (tandem): sdk.protocol.vocabulary; equal = same token ids
    # extension (LM Studio's /api/v0/models field): what the model is for, so a client picks a chat
    # model by it instead of by its place in the list
    type: Literal["llm", "embeddings"] = "llm"
    # extension (tandem): for the cascade's routed names only, the tier the name sends a request to
    # ("auto" lets the router choose); absent on a model the server runs itself
    route: Literal["auto", "local", "cloud"] | None = None
    _omitted_when_none: ClassVar[tuple[str, ...]] = ("sampling_defaults", "vocabulary_fingerprint", "route")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
