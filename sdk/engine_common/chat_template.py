"""Render OpenAI chat messages with the model's own Jinja chat template.

Both tiers read the template from their model (GGUF metadata or HF tokenizer
config) and render it here, in a sandbox, the way Hugging Face does.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from sdk.protocol.engine import InvalidRequestError

ALLOWED_ROLES = {"system", "developer", "user", "assistant", "tool"}


def normalise_messages(messages: Sequence[dict]) -> list[dict]:
    """Plain {role, content: str} dicts; text content parts are joined, other parts refused."""
    if not messages:
        raise InvalidRequestError("messages must contain at least one message", "messages")
    out = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ALLOWED_ROLES:
            raise InvalidRequestError(
                f"messages[{i}].role must be one of {sorted(ALLOWED_ROLES)}, got {role!r}", f"messages[{i}].role"
            )
        content = message.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise InvalidRequestError(
                        f"messages[{i}].content: only text parts are supported by this model", f"messages[{i}].content"
                    )
                texts.append(part["text"])
            content = "".join(texts)
        elif not isinstance(content, str):
            raise InvalidRequestError(
                f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content"
            )
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


@lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def render_chat(template: str | None, messages: Sequence[dict], bos_token: str = "", eos_token: str = "") -> str:
    """The prompt text for `messages`, ending with the assistant's turn opened."""
    if not template:
        raise InvalidRequestError(
            "this model has no chat template; use /v1/completions with a plain prompt", "messages"
        )
    from jinja2.exceptions import TemplateError

    try:
        return _compile(template).render(
            messages=normalise_messages(messages),
            add_generation_prompt=True,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except TemplateError as exc:
        raise InvalidRequestError(f"the model's chat template rejected the messages: {exc}", "messages") from exc
