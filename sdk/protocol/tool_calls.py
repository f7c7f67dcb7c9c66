"""A chat with tools, in and out: OpenAI-shaped messages rendered for a tool format
(sdk.protocol.tool_formats), and the model's answer read back as content or calls.

In: the tools' system text goes first (the app's own system message follows it), earlier
assistant calls are written in the format, and tool results become the format's result turn.
Out: the answer is constrained by the format's grammar, so its first character says what it is:
an answer that opens like a call is a call (held back while streaming, parsed when it ends), any
other is plain text (streamed as it comes). A call cut off by max_tokens is returned as text.
"""

from __future__ import annotations

from collections.abc import Sequence

from sdk.protocol.tool_formats import ParsedCall, ToolFormat, ToolRequest


def _text(content) -> str:
    if isinstance(content, list):  # text parts (others are refused by the chat template)
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def render_tool_messages(messages: Sequence[dict], request: ToolRequest | None, tool_format: ToolFormat) -> list[dict]:
    """Messages with role and content only, for the chat template."""
    out: list[dict] = []
    for message in messages:
        role = message.get("role")
        if role == "tool":
            out.append(tool_format.result_message(_text(message.get("content"))))
        elif role == "assistant" and message.get("tool_calls"):
            calls = [ParsedCall(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
            before = _text(message.get("content"))
            out.append(
                {"role": "assistant", "content": (before + "\n" if before else "") + tool_format.calls_text(calls)}
            )
        else:
            out.append({k: v for k, v in message.items() if k not in ("tool_calls", "tool_call_id")})
    if request is not None:
        system = tool_format.system_text(request)
        if out and out[0].get("role") in ("system", "developer") and _text(out[0].get("content")):
            out[0] = {"role": "system", "content": f"{system}\n\n{_text(out[0]['content'])}"}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


class ToolAnswer:
    """Splits one streamed answer into content to send now and calls to send at its end."""

    def __init__(self, tool_format: ToolFormat, required: bool):
        self.format = tool_format
        self.is_call: bool | None = True if required else None  # None: no text seen yet
        self._held: list[str] = []

    def feed(self, text: str) -> str:
        """The content to send for this piece of text ("" while a call is being written)."""
        if self.is_call is None and text:
            self.is_call = text[0] == self.format.opener[0]  # the grammar allows no other reading
        if self.is_call:
            self._held.append(text)
            return ""
        return text

    def finish(self) -> tuple[str, list[ParsedCall] | None]:
        """(content still to send, the calls): a call that does not parse (cut off) is content."""
        if not self.is_call:
            return "", None
        whole = "".join(self._held)
        calls = self.format.parse(whole)
        return ("", calls) if calls else (whole, None)

    @classmethod
    def read(cls, tool_format: ToolFormat, required: bool, text: str) -> tuple[str, list[ParsedCall] | None]:
        """A whole answer: (content, calls)."""
        answer = cls(tool_format, required)
        content = answer.feed(text)
        rest, calls = answer.finish()
        return content + rest, calls


class ToolAnswers:
    """A ToolAnswer for each choice of one request; with no tools, text passes through as content."""

    def __init__(self, tool_format: ToolFormat, request: ToolRequest | None):
        self.format, self.request = tool_format, request
        self._answers: dict[int, ToolAnswer] = {}

    def _answer(self, index: int) -> ToolAnswer | None:
        if self.request is None:
            return None
        return self._answers.setdefault(index, ToolAnswer(self.format, self.request.required))

    def feed(self, index: int, text: str) -> str:
        answer = self._answer(index)
        return answer.feed(text) if answer is not None else text

    def finish(self, index: int) -> tuple[str, list[ParsedCall] | None]:
        answer = self._answer(index)
        return answer.finish() if answer is not None else ("", None)

    def read(self, text: str) -> tuple[str, list[ParsedCall] | None]:
        """A whole answer (any choice): (content, calls)."""
        if self.request is None:
            return text, None
        return ToolAnswer.read(self.format, self.request.required, text)
