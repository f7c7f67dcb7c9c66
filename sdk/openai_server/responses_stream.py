"""The Responses API's answer, whole or streamed as its semantic events, from what the chat
machinery produced: token events from the engine itself, or chat chunks from the cascade.

A stream goes: response.created, response.in_progress; for the text, output_item.added (the
message), content_part.added, output_text.delta..., output_text.done, content_part.done,
output_item.done; for each function call, output_item.added, function_call_arguments.delta and
.done, output_item.done; then response.completed (response.incomplete when max_output_tokens cut
it). Each event has its `event:` line and a `sequence_number`, in the order the openai client's
stream helper accepts. An error once the stream has begun is an `error` event, then the end.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from sdk.openai_server.errors import from_exception
from sdk.openai_server.generation import ChoiceState, usage_of
from sdk.protocol.openai_schema import Usage
from sdk.protocol.openai_schema.response_objects import (
    FunctionCallItem,
    IncompleteDetails,
    OutputMessage,
    OutputText,
    ResponseObject,
    ResponseUsage,
    finish_status,
    item_id,
)
from sdk.protocol.openai_schema.responses import ToolCall
from sdk.protocol.openai_schema.responses_api import ResponseCreateRequest
from sdk.protocol.tool_calls import ToolAnswers

if TYPE_CHECKING:
    from sdk.openai_server.stored_responses import Keeper


class ResponseEvents:
    """One response being answered: its echo of the request, and its stream's events in order."""

    def __init__(
        self,
        body: ResponseCreateRequest,
        response_id: str,
        created_at: int,
        model: str,
        ignored_fields: list[str],
        keeper: Keeper | None = None,
    ):
        self.body = body
        self.keeper = keeper  # keeps the whole response before its last event (or the answer) goes out
        self.final: ResponseObject | None = None
        self.id = response_id
        self.created_at = created_at
        self.model = model
        self.ignored_fields = ignored_fields
        self._sequence = 0
        self._message: OutputMessage | None = None  # the message item while its text streams
        self._text: list[str] = []
        self._output: list[OutputMessage | FunctionCallItem] = []

    def object(
        self,
        status: str,
        output: list,
        usage: ResponseUsage | None = None,
        incomplete: IncompleteDetails | None = None,
        tandem: dict | None = None,
    ) -> ResponseObject:
        """The response object, the request's settings echoed as OpenAI echoes them."""
        body = self.body
        extension = dict(tandem or {})
        if self.ignored_fields:
            extension["ignored_fields"] = self.ignored_fields
        text_format = (
            body.text.format.model_dump(by_alias=True, exclude_none=True) if body.text and body.text.format else None
        )
        return ResponseObject(
            id=self.id,
            created_at=self.created_at,
            status=status,
            model=self.model,
            output=output,
            usage=usage,
            incomplete_details=incomplete,
            instructions=body.instructions,
            metadata=body.metadata or {},
            max_output_tokens=body.max_output_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            parallel_tool_calls=body.parallel_tool_calls is not False,
            tool_choice=_echo(body.tool_choice, "auto"),
            tools=[tool.model_dump(exclude_none=True) for tool in body.tools or []],
            text={"format": text_format or {"type": "text"}},
            user=body.user,
            store=self.keeper is not None,
            previous_response_id=body.previous_response_id,
            tandem=extension or None,
        )

    async def keep(self, response: ResponseObject) -> ResponseObject:
        """Store the whole response (when it is to be stored) before the answer naming it goes out: the
        response to send, saying `store: false` when it was not kept after all (Keeper.keep)."""
        if self.keeper is not None and not await self.keeper.keep(response):
            self.keeper = None
            response = response.model_copy(update={"store": False})
        return response

    # ------------------------------------------------------------------ events

    def _event(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"

    def opening(self) -> list[str]:
        started = self.object("in_progress", []).model_dump(mode="json")
        return [
            self._event("response.created", response=started),
            self._event("response.in_progress", response=started),
        ]

    def text(self, delta: str) -> list[str]:
        """Events for text the answer added (the message item and its part open before the first)."""
        if not delta:
            return []
        events = []
        if self._message is None:
            self._message = OutputMessage(id=item_id("msg"), status="in_progress")
            events.append(self._added(self._message))
            events.append(self._event("response.content_part.added", **self._where(), part=_part("")))
        self._text.append(delta)
        events.append(self._event("response.output_text.delta", **self._where(), delta=delta, logprobs=[]))
        return events

    def finish(
        self, rest: str, calls: list[ToolCall] | None, finish_reason: str | None, usage: Usage, tandem: dict | None
    ) -> list[str]:
        """The closing events but the last: the rest of the text, the message done, each call (then `final`
        is the whole response; `completion` is its event)."""
        status, incomplete = finish_status(finish_reason)
        events = self.text(rest)
        if self._message is None and not calls:
            events += self.text_item_for_nothing()
        if self._message is not None:
            text = "".join(self._text)
            events.append(self._event("response.output_text.done", **self._where(), text=text, logprobs=[]))
            events.append(self._event("response.content_part.done", **self._where(), part=_part(text)))
            done = self._message.model_copy(update={"status": status, "content": [OutputText(text=text)]})
            events.append(self._done(done))
            self._message = None
        for call in calls or []:
            item = FunctionCallItem(
                id=item_id("fc"), call_id=call.id, name=call.function.name, arguments="", status="in_progress"
            )
            events.append(self._added(item))
            where = {"item_id": item.id, "output_index": len(self._output) - 1}
            arguments = call.function.arguments
            events.append(self._event("response.function_call_arguments.delta", **where, delta=arguments))
            events.append(self._event("response.function_call_arguments.done", **where, arguments=arguments))
            events.append(self._done(item.model_copy(update={"arguments": arguments, "status": "completed"})))
        self.final = self.object(status, self._output, ResponseUsage.of(usage), incomplete, tandem)
        return events  # the last (the whole response) once it is kept: _closing

    def completion(self) -> str:
        """The last event: the whole response, response.completed (response.incomplete when cut)."""
        kind = "response.completed" if self.final.status == "completed" else "response.incomplete"
        return self._event(kind, response=self.final.model_dump(mode="json"))

    def text_item_for_nothing(self) -> list[str]:
        """An answer with neither text nor calls still has its (empty) message, as OpenAI's does."""
        self._message = OutputMessage(id=item_id("msg"), status="in_progress")
        return [self._added(self._message), self._event("response.content_part.added", **self._where(), part=_part(""))]

    def error(self, exc: Exception) -> str:
        error = from_exception(exc).body()["error"]
        return self._event("error", code=error.get("code"), message=error.get("message"), param=error.get("param"))

    def _added(self, item) -> str:
        self._output.append(item)
        return self._event("response.output_item.added", output_index=len(self._output) - 1, item=item.model_dump())

    def _done(self, item) -> str:
        index = next(i for i, known in enumerate(self._output) if known.id == item.id)
        self._output[index] = item
        return self._event("response.output_item.done", output_index=index, item=item.model_dump())

    def _where(self) -> dict:
        index = next(i for i, known in enumerate(self._output) if known.id == self._message.id)
        return {"item_id": self._message.id, "output_index": index, "content_index": 0}


async def _closing(response: ResponseEvents, events: list[str]) -> AsyncIterator[str]:
    """The closing events, then the response kept and the last event (response.completed names its id)."""
    for event in events:
        yield event
    response.final = await response.keep(response.final)
    yield response.completion()


def _part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _echo(value, default):
    if value is None:
        return default
    return value if isinstance(value, str) else value.model_dump(exclude_none=True)


async def token_events(
    response: ResponseEvents, first, choices: AsyncIterator, answers: ToolAnswers, num_prompt_tokens: int
) -> AsyncIterator[str]:
    """The stream of one engine request (the model's own name): its token events as the API's events."""
    state = ChoiceState()
    try:
        for event in response.opening():
            yield event
        item = first
        while item is not None:
            _, token = item
            state.add(token, keep_event=False)
            for event in response.text(answers.feed(0, token.text)):
                yield event
            if token.finish_reason is not None:
                rest, calls = answers.finish(0)
                usage = usage_of(num_prompt_tokens, [state])
                async for event in _closing(response, response.finish(rest, calls, token.finish_reason, usage, None)):
                    yield event
            item = await anext(choices, None)
    except Exception as exc:  # the status line went out already
        yield response.error(exc)
    finally:
        await choices.aclose()


async def chunk_events(response: ResponseEvents, chunks: AsyncIterator) -> AsyncIterator[str]:
    """The stream of a routed request: the cascade's chat chunks as the API's events."""
    calls: list[ToolCall] = []
    try:
        for event in response.opening():
            yield event
        async for chunk in chunks:
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            for event in response.text(choice.delta.content or ""):
                yield event
            calls += [ToolCall(id=call.id, function=call.function) for call in choice.delta.tool_calls or []]
            if chunk.usage is not None:  # the final chunk: the finish, the usage and the routing
                closing = response.finish("", calls, choice.finish_reason, chunk.usage, chunk.tandem)
                async for event in _closing(response, closing):
                    yield event
    except Exception as exc:
        yield response.error(exc)
    finally:
        await chunks.aclose()
