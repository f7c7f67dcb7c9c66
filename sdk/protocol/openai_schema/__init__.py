"""The one copy of the OpenAI request/response/error schema, for every tandem server: the request
bodies and their refusals (`requests`, made of `request_parts`), the response shapes with tandem's
extensions (`responses`)."""

from sdk.protocol.openai_schema.request_parts import ChatMessage, ContentPart, StreamOptions  # noqa: F401
from sdk.protocol.openai_schema.requests import (  # noqa: F401
    MAX_CHOICES,
    MAX_COMPLETION_LOGPROBS,
    MAX_STOP_STRINGS,
    ChatCompletionRequest,
    CompletionRequest,
    context_length_error,
)
from sdk.protocol.openai_schema.responses import (  # noqa: F401
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatResponseMessage,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    CompletionTokensDetails,
    DeltaMessage,
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
    ToolCall,
    ToolCallDelta,
    TopLogprobEntry,
    Usage,
    now,
    tool_call_deltas,
    tool_call_objects,
)
