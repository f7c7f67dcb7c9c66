"""Every request field a client may send, and what tandem does with it: honoured, refused with a
400 naming it, or accepted and listed as ignored. Nothing is dropped silently.

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
