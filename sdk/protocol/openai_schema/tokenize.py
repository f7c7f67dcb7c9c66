"""POST /tokenize and /detokenize in vLLM's shape (outside /v1, as vLLM serves them).

    {"model"?, "prompt": "text", "add_special_tokens": true}            -> {"count", "max_model_len", "tokens"}
    {"model"?, "messages": [...], "add_generation_prompt": true}        -> the same, through the chat template
    {"model"?, "tokens": [ids]}                                          -> {"prompt": "text"}

`return_token_strs: true` adds each token's text. Fields this shape does not define are refused
by name (it is no OpenAI endpoint: nothing to stay lenient for)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator

from sdk.protocol.engine import InvalidRequestError


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TokenizeRequest(_Body):
    model: str | None = None  # None: the server's own model
    prompt: str | None = None
    messages: list[dict] | None = None  # chat messages, rendered with the model's template
    add_special_tokens: bool | None = None  # prompt: BOS and the like (default true); messages: the template's own
    add_generation_prompt: bool | None = None  # messages: the template always ends ready for the answer
    return_token_strs: bool | None = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise InvalidRequestError("send exactly one of prompt (text) and messages (a chat)", "prompt")
        if self.messages is not None and self.add_generation_prompt is False:
            raise InvalidRequestError(
                "add_generation_prompt false is not supported: the chat template always ends "
                "ready for the assistant's answer",
                "add_generation_prompt",
            )
        if self.messages is not None and self.add_special_tokens:
            raise InvalidRequestError(
                "add_special_tokens applies to prompt; a chat's template writes its own", "add_special_tokens"
            )
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str
