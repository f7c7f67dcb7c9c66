"""Every request field a client may send, and what tandem does with it: honoured, refused with a
400 naming it, or accepted and listed as ignored. Nothing is dropped silently. The tables are
chat's and completions'; /v1/responses has a view of its own on top of them (RESPONSES_*).

- Honoured fields are the schema's own (sdk.protocol.openai_schema); some are honoured only for
  some values or models, and refuse the rest there (e.g. `n > 1` on routed models).
- Refused: fields of the OpenAI API or a known extension that would change the output and that
  tandem does not implement yet. A null value, or a value that asks for nothing (`tools: []`,
  `tool_choice: "none"`, `response_format: {"type": "text"}`, `modalities: ["text"]`), is accepted.
- Ignored: fields that change nothing about the output (bookkeeping, caching, billing).
- Unknown names (neither OpenAI's nor a known extension's) are ignored the way vLLM does it: a
  warning log line names them, and the response's `tandem.ignored_fields` lists them; a server
  started with `--strict-fields` refuses them with a 400 instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sdk.protocol.engine import InvalidRequestError

# Output-changing fields not implemented yet, with what a client should do instead.
_TOOLS = "tools are supported on /v1/chat/completions only"
_FUNCTIONS = "the deprecated functions API is not supported; send tools and tool_choice instead"
_STRUCTURE = "vLLM's guided decoding fields are not supported; send OpenAI's response_format instead"
REFUSED_FIELDS: dict[str, str] = {
    # OpenAI chat completions
    "tools": _TOOLS,
    "tool_choice": _TOOLS,
    "parallel_tool_calls": _TOOLS,
    "functions": _FUNCTIONS,
    "function_call": _FUNCTIONS,
    "audio": "audio output is not supported; leave it out",
    "modalities": 'only text output is supported; send ["text"]',
    "web_search_options": "web search is not supported; leave it out",
    "reasoning_effort": "the served models do not reason; leave it out",
    "verbosity": "verbosity is not supported; leave it out",
    "moderation": "moderation is not supported; leave it out",
    # vLLM's extensions that change the output
    "chat_template_kwargs": "chat_template_kwargs is not supported; leave it out",
    "chat_template": "a per-request chat template is not supported; leave it out",
    "add_generation_prompt": "add_generation_prompt is not supported (always true); leave it out",
    "continue_final_message": "continue_final_message is not supported; leave it out",
    "documents": "documents is not supported; leave it out",
    "guided_json": _STRUCTURE,
    "guided_regex": _STRUCTURE,
    "guided_choice": _STRUCTURE,
    "guided_grammar": _STRUCTURE,
    "guided_decoding_backend": _STRUCTURE,
    "guided_whitespace_pattern": _STRUCTURE,
    "structured_outputs": _STRUCTURE,
    "use_beam_search": "beam search is not supported; leave it out",
    "length_penalty": "beam search is not supported; leave it out",
    "include_stop_str_in_output": "include_stop_str_in_output is not supported; leave it out",
    "skip_special_tokens": "skip_special_tokens is not supported (special tokens are always skipped); leave it out",
    "spaces_between_special_tokens": "spaces_between_special_tokens is not supported; leave it out",
    "truncate_prompt_tokens": "truncate_prompt_tokens is not supported; leave it out",
    "allowed_token_ids": "allowed_token_ids is not supported; use logit_bias",
    "bad_words": "bad_words is not supported; use logit_bias",
    "prompt_logprobs": "prompt_logprobs is not supported; leave it out",
    "add_special_tokens": "add_special_tokens is not supported; leave it out",
    "return_tokens_as_token_ids": "return_tokens_as_token_ids is not supported; leave it out",
    "logits_processors": "custom logits processors are not supported; leave them out",
    "mm_processor_kwargs": "multimodal input is not supported; leave it out",
    "priority": "request priority is not supported over HTTP; leave it out",
    "vllm_xargs": "vllm_xargs is not supported; leave it out",
}

# Values of a refused field that ask for nothing, and so are accepted.
NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "tools": ([],),
    "functions": ([],),
    "tool_choice": ("none",),
    "modalities": (["text"],),
    "add_generation_prompt": (True,),
    "skip_special_tokens": (True,),
    "include_stop_str_in_output": (False,),
    "use_beam_search": (False,),
    "chat_template_kwargs": ({},),
}

# Fields that change nothing about the output: accepted, and listed as ignored.
IGNORED_FIELDS = frozenset(
    {
        "user",
        "metadata",
        "store",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "prediction",  # OpenAI: a speed hint (Predicted Outputs); the output is the same
        "request_id",
        "cache_salt",
        "kv_transfer_params",  # vLLM: bookkeeping and caching
    }
)

# /v1/responses: its body's fields beyond its own schema go on to the chat request it becomes (sdk.protocol.
# openai_schema.responses_api), so the tables above apply to them too; this view adds what the Responses API
# has and tandem cannot give, the values of those that ask for nothing, and chat's names the API does not have.
RESPONSES_REFUSED_FIELDS: dict[str, str] = {
    "reasoning": "the served models do not reason; leave it out",
    "background": "background runs are not supported; send false or leave it out",
    "conversation": "conversations are not supported; pass previous_response_id instead",
    "prompt": "stored prompt templates are not supported; send input and instructions",
    "include": "this server has no extra output data to include (no reasoning, search or file results, logprobs); "
    "send [] or leave it out",
    "truncation": 'truncation "auto" is not supported (a prompt past the context is a 400); send "disabled"',
    "max_tool_calls": "max_tool_calls is not supported; leave it out",
    "top_logprobs": "logprobs are not supported on /v1/responses; use /v1/chat/completions",
    "stream_options": "stream obfuscation is not supported; send include_obfuscation: false or leave it out",
    "context_management": "context management (compaction) is not supported; leave it out",
}
RESPONSES_NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "include": ([],),  # the Agents SDK always sends it
    "truncation": ("disabled",),
    "background": (False,),
    "stream_options": ({}, {"include_obfuscation": False}),  # no padding is added to the events anyway
}
# Chat's fields the Responses API spells otherwise or does not have: refused, naming the endpoint they belong to.
CHAT_ONLY_FIELDS: dict[str, str] = {
    "messages": "send input (and instructions)",
    "max_tokens": "send max_output_tokens",
    "max_completion_tokens": "send max_output_tokens",
    "response_format": "send text.format",
    "n": "one answer per response",
    "logprobs": "use /v1/chat/completions for logprobs",
}


def refuse_responses_fields(extra: Mapping[str, Any]) -> dict[str, Any]:
    """/v1/responses' view: InvalidRequestError naming a field its endpoint refuses; the rest (for the chat
    request, where chat's tables apply), with the accepted no-op values taken out."""
    passed = {}
    for name, value in extra.items():
        known = name in RESPONSES_REFUSED_FIELDS or name in CHAT_ONLY_FIELDS
        if known and (value is None or value in RESPONSES_NO_OP_VALUES.get(name, ())):
            continue  # asks for nothing
        if name in RESPONSES_REFUSED_FIELDS:
            raise InvalidRequestError(f"{name}: {RESPONSES_REFUSED_FIELDS[name]}", name)
        elif name in CHAT_ONLY_FIELDS:
            raise InvalidRequestError(
                f"{name} is a chat completions field; /v1/responses does not take it: {CHAT_ONLY_FIELDS[name]}", name
            )
        else:
            passed[name] = value
    return passed


# Message fields: the chat template reads role, content and name; these would change the conversation.
REFUSED_MESSAGE_FIELDS: dict[str, str] = {
    "function_call": _FUNCTIONS,
    "audio": "audio in messages is not supported; leave it out",
    "refusal": "assistant refusals in the history are not supported; send the text as content",
}
NO_OP_MESSAGE_VALUES: dict[str, tuple[Any, ...]] = {}


def classify_extra_fields(extra: Mapping[str, Any], where: str = "") -> list[str]:
    """Check the fields a request sent beyond the schema's own; return the names it ignores
    (no-op and unknown ones, `where` prefixed). InvalidRequestError names a refused one."""
    ignored = []
    for name, value in extra.items():
        if value is None:
            if name not in IGNORED_FIELDS and name not in REFUSED_FIELDS:
                ignored.append(where + name)
            continue
        if name in REFUSED_FIELDS and value not in NO_OP_VALUES.get(name, ()):
            raise InvalidRequestError(f"{where}{name}: {REFUSED_FIELDS[name]}", where + name)
        if name not in REFUSED_FIELDS:
            ignored.append(where + name)
    return ignored


def classify_message_fields(extra: Mapping[str, Any], index: int) -> list[str]:
    """The same for one message's fields beyond role, content and name."""
    where = f"messages[{index}]."
    ignored = []
    for name, value in extra.items():
        if name in REFUSED_MESSAGE_FIELDS:
            if value is not None and value not in NO_OP_MESSAGE_VALUES.get(name, ()):
                raise InvalidRequestError(f"{where}{name}: {REFUSED_MESSAGE_FIELDS[name]}", where + name)
        else:
            ignored.append(where + name)
    return ignored


def unknown_fields(ignored: list[str]) -> list[str]:
    """Of the ignored names, those neither OpenAI nor a known extension defines (the `--strict-fields` set)."""
    return [name for name in ignored if name.rpartition(".")[2] not in IGNORED_FIELDS]


def refuse_unknown_fields(ignored: list[str], strict: bool) -> None:
    """Under --strict-fields, InvalidRequestError naming the first ignored name no one defines."""
    unknown = unknown_fields(ignored)
    if strict and unknown:
        raise InvalidRequestError(
            f"unknown field {unknown[0]!r} (this server refuses fields it does not know: --strict-fields)", unknown[0]
        )
