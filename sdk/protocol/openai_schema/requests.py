"""OpenAI's request bodies (chat, completions), strict about types, refusing what tandem does not do.

A string where a number belongs is a 400, never silently coerced. Refusals are the models' own
validators: a field tandem does not implement, or a combination it cannot honour, fails
validation with InvalidRequestError naming the field (400), so /openapi.json's typed bodies
and the server's checks are one thing. Fields beyond the schema's own are classified by
sdk.protocol.request_fields (refused, or accepted and listed as ignored); validating with
context {"strict_fields": True} refuses unknown names too (--strict-fields). Requests turn
themselves into engine `SamplingParams`, so both tiers read a request the same way.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal, Union

from pydantic import ConfigDict, Field, PrivateAttr, ValidationInfo, create_model, model_validator

from sdk.protocol.engine import ContextLengthError, InvalidRequestError, SamplingParams, StructuredOutput
from sdk.protocol.openai_schema.request_parts import (
    ChatMessage,
    NamedToolChoice,
    ResponseFormat,
    StreamOptions,
    ToolParam,
    _TopLevel,
)
from sdk.protocol.sampling_params import TUNABLES
from sdk.protocol.request_fields import classify_extra_fields, classify_message_fields, refuse_unknown_fields
from sdk.protocol.tool_calls import render_tool_messages
from sdk.protocol.tool_formats import LIST, ToolFormat, ToolFunction, ToolRequest

MAX_STOP_STRINGS = 16  # OpenAI allows 4; vLLM allows more; 16 keeps stop matching cheap
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions API's limit
MAX_CHOICES = 16  # each choice is its own engine request; more would let one client fill the queue
_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1  # OpenAI takes any 64-bit seed

_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names


def _document_refusals(schema: dict[str, Any], model: type[_SamplingFields]) -> None:
    # The validators' rules that JSON Schema cannot state (one field against another, a value
    # refused rather than mistyped), as an extension of the document: param -> rule.
    schema["x-tandem-refusals"] = model.refusal_rules()


# The tunables (temperature, top_p, top_k, ...), one optional field each as SamplingParams declares
# them (sdk.protocol.sampling_params): null or absent means the tier's default for its model.
_TunableFields = create_model(
    "_TunableFields",
    __base__=_TopLevel,
    **{name: (knob.type | None, Field(default=None, description=knob.doc)) for name, knob in TUNABLES.items()},
)


class _SamplingFields(_TunableFields):
    """Fields chat and completions share; all optional so `null` means the default."""

    model_config = ConfigDict(json_schema_extra=_document_refusals)
    # What the validator below refuses, by the param its error names (the document lists them).
    _REFUSALS: ClassVar[dict[str, str]] = {
        "stream_options": "only with stream true",
        "stop": f"at most {MAX_STOP_STRINGS} strings",
        "logit_bias": "keys are token ids (non-negative integers)",
    }
    _ignored_fields: list[str] = PrivateAttr(default_factory=list)

    model: str | None = None  # None: the first served model (vLLM's lenient default)
    max_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: Union[str, list[str], None] = None
    stop_token_ids: list[int] | None = None  # extension (vLLM)
    seed: int | None = Field(default=None, ge=_SEED_MIN, le=_SEED_MAX)
    user: str | None = None  # per-user budgets (sdk.budgets) bill it; ignored on a server without budgets
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    min_tokens: int | None = Field(default=None, ge=0)  # extension (vLLM): no end-of-text before this many
    ignore_eos: bool | None = None  # extension (vLLM): keep generating past end-of-text
    repetition_stop: bool | None = None  # extension (tandem): stop an exact loop (None: the tier's default)
    # extension (tandem): a structured answer takes its grammar's closing path before max_tokens, and
    # an object never repeats a key (None: the tier's default, on; false: the grammar alone, as OpenAI's)
    close_within_max_tokens: bool | None = None
    response_format: ResponseFormat | None = None  # json_object / json_schema: a grammar constrains the output

    @classmethod
    def refusal_rules(cls) -> dict[str, str]:
        """Every refusal of this body's validators, by param (the endpoint's own included)."""
        rules: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            rules.update(getattr(klass, "_REFUSALS", {}))
        return rules

    @property
    def num_choices(self) -> int:
        return self.n or 1

    def check_fields(self, strict: bool = False, uses_user: bool = False) -> list[str]:
        """Refuse output-changing fields tandem does not implement (InvalidRequestError names the
        field); return the names accepted but ignored. `strict`: unknown names are refused too.
        `uses_user`: the server bills `user` (budgets), so it is not an ignored field."""
        ignored = (["user"] if self.user is not None and not uses_user else []) + classify_extra_fields(
            self.model_extra or {}
        )
        # Only a chat request's own messages: on /v1/completions a stray "messages" is just an extra field.
        messages = self.messages if "messages" in type(self).model_fields else []
        for index, message in enumerate(messages):
            ignored += classify_message_fields(message.model_extra or {}, index)
        refuse_unknown_fields(ignored, strict)
        self._ignored_fields = ignored
        return ignored

    @property
    def ignored_fields(self) -> list[str]:
        """What check_fields accepted but ignored (empty before it ran)."""
        return list(self._ignored_fields)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @model_validator(mode="after")
    def _refuse_what_tandem_does_not_do(self, info: ValidationInfo):
        """Refusals as validation (InvalidRequestError passes through pydantic unchanged, naming its
        field): what would otherwise be ignored silently, worded the way OpenAI words it; then
        the fields beyond the schema (check_fields; context {"strict_fields": True} refuses unknown ones,
        {"uses_user": True} says the server bills `user`)."""
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError("stream_options is only allowed when stream is true", "stream_options")
        if len(self.stop_list) > MAX_STOP_STRINGS:
            raise InvalidRequestError(
                f"stop accepts at most {MAX_STOP_STRINGS} strings, got {len(self.stop_list)}", "stop"
            )
        self.token_logit_bias  # noqa: B018  (raises for keys that are not token ids)
        self._refuse_for_endpoint()
        context = info.context or {}
        self.check_fields(strict=bool(context.get("strict_fields")), uses_user=bool(context.get("uses_user")))
        return self

    def _refuse_for_endpoint(self) -> None:
        """What one endpoint's body cannot ask for (subclasses)."""

    @property
    def token_logit_bias(self) -> dict[int, float]:
        """logit_bias with its keys as token ids (JSON object keys are strings)."""
        bias = {}
        for key, value in (self.logit_bias or {}).items():
            if not re.fullmatch(r"\s*[0-9]+\s*", key):  # str.isdigit() takes "²", which int() refuses
                raise InvalidRequestError(
                    f"logit_bias keys must be token ids (non-negative integers), got {key!r}", "logit_bias"
                )
            bias[int(key)] = value
        return bias

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def _structured(self) -> StructuredOutput | None:
        return self.response_format.structured() if self.response_format is not None else None

    def _sampling_params(
        self, max_tokens: int, logprobs: int | None, choice_index: int, structured: StructuredOutput | None
    ) -> SamplingParams:
        seed = self.seed
        if seed is not None:
            # Each choice gets its own reproducible stream; numpy wants a non-negative seed.
            seed = (seed + choice_index) % 2**64
        return SamplingParams(
            max_tokens=max_tokens,
            # Left out: unset, and the tier that runs the request uses its default for the model.
            **{name: knob.from_request(getattr(self, name)) for name, knob in TUNABLES.items()},
            logit_bias=self.token_logit_bias,
            min_tokens=self.min_tokens or 0,
            seed=seed,
            stop=self.stop_list,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=bool(self.ignore_eos),
            repetition_stop=self.repetition_stop,
            close_within_max_tokens=self.close_within_max_tokens,
            structured=structured,
            logprobs=logprobs,
        )


class ChatCompletionRequest(_SamplingFields):
    _REFUSALS: ClassVar[dict[str, str]] = {
        "messages": "at least one message",
        "top_logprobs": "only with logprobs true",
        "tools": "function names match [A-Za-z0-9_-]{1,64} and are unique",
        "tool_choice": "required or a named function only with tools, a named function among them",
    }
    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(default=None, ge=1)  # the newer name of max_tokens
    logprobs: bool | None = False
    top_logprobs: int | None = None
    private: bool | None = None  # extension (tandem): routed models answer on the device only
    tools: list[ToolParam] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None  # None: auto with tools
    parallel_tool_calls: bool | None = None  # False: at most one call per answer

    def _refuse_for_endpoint(self) -> None:
        if not self.messages:
            raise InvalidRequestError("messages must contain at least one message", "messages")
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequestError("top_logprobs requires logprobs to be true", "top_logprobs")
        names = [tool.function.name for tool in self.tools or []]
        bad = next((name for name in names if not _FUNCTION_NAME.fullmatch(name)), None)
        if bad is not None:
            raise InvalidRequestError(f"tools: function name {bad!r} must match [A-Za-z0-9_-]{{1,64}}", "tools")
        if len(set(names)) != len(names):
            raise InvalidRequestError("tools: function names must be unique", "tools")
        choice = self.tool_choice
        if choice == "required" and not names:
            raise InvalidRequestError("tool_choice 'required' needs tools", "tool_choice")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise InvalidRequestError(
                f"tool_choice names function {choice.function.name!r}, which is not in tools", "tool_choice"
            )

    def tool_request(self) -> ToolRequest | None:
        """The tools this answer may call, or None (no tools, or tool_choice "none": the tools are
        then left out of the prompt too, so a small model is not tempted)."""
        if not self.tools or self.tool_choice == "none":
            return None
        named = self.tool_choice.function.name if isinstance(self.tool_choice, NamedToolChoice) else None
        functions = tuple(
            ToolFunction(t.function.name, t.function.description or "", t.function.parameters)
            for t in self.tools
            if named in (None, t.function.name)
        )
        return ToolRequest(
            functions,
            required=named is not None or self.tool_choice == "required",
            parallel=self.parallel_tool_calls is not False,
        )

    def message_dicts(self, tool_format: ToolFormat = LIST) -> list[dict[str, Any]]:
        """Messages as the plain dicts sdk.engine_common.chat_template expects: with tools (offered, or
        calls and results in the history) rendered in the model's `tool_format`."""
        dicts = [m.model_dump(exclude_none=True) for m in self.messages]
        request = self.tool_request()
        if request is None and not any(m.tool_calls or m.role == "tool" for m in self.messages):
            return dicts
        return render_tool_messages(dicts, request, tool_format)

    def sampling_params(
        self, num_prompt_tokens: int, max_model_len: int, choice_index: int = 0, tool_format: ToolFormat = LIST
    ) -> SamplingParams:
        """Engine parameters; the default completion budget is what the context has left. With
        tools, the answer is constrained by `tool_format`'s grammar (response_format, if any,
        constrains its text branch)."""
        max_tokens = self.max_completion_tokens or self.max_tokens
        if max_tokens is None:
            max_tokens = max_model_len - num_prompt_tokens
            if max_tokens < 1:
                raise context_length_error(max_model_len, num_prompt_tokens)
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        tools = self.tool_request()
        structured = tool_format.grammar(tools, self._structured()) if tools is not None else self._structured()
        return self._sampling_params(max_tokens, logprobs, choice_index, structured)


class CompletionRequest(_SamplingFields):
    _REFUSALS: ClassVar[dict[str, str]] = {
        "echo": "true is not supported",
        "suffix": "not supported",
        "best_of": "only equal to n",
    }
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool | None = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1)
    private: bool | None = None  # extension (tandem): routed models answer on the device only

    def single_prompt(self) -> str | list[int]:
        """The one prompt, as text or token ids; batched prompts are refused."""
        prompt = self.prompt
        if isinstance(prompt, list):
            if len(prompt) == 0:
                raise InvalidRequestError("prompt must not be empty", "prompt")
            if isinstance(prompt[0], (str, list)):
                if len(prompt) != 1:
                    raise InvalidRequestError(
                        f"this server takes one prompt per request, got {len(prompt)}; send them as separate requests",
                        "prompt",
                    )
                return prompt[0]
        return prompt

    def _refuse_for_endpoint(self) -> None:
        if self.echo:
            raise InvalidRequestError("echo is not supported by this server; send false or leave it out", "echo")
        if self.suffix is not None:
            raise InvalidRequestError("suffix is not supported by this server; leave it out", "suffix")
        if self.best_of not in (None, self.num_choices):
            raise InvalidRequestError("best_of is not supported by this server; leave it out or set it to n", "best_of")

    def sampling_params(self, choice_index: int = 0) -> SamplingParams:
        return self._sampling_params(self.max_tokens or 16, self.logprobs, choice_index, self._structured())


def context_length_error(max_model_len: int, num_prompt_tokens: int) -> ContextLengthError:
    """The error for a prompt that leaves no room to generate."""
    return ContextLengthError(
        f"This model's maximum context length is {max_model_len} tokens. However, your messages use "
        f"{num_prompt_tokens} tokens, which leaves no room for a completion. Please reduce the messages.",
        "messages",
    )
