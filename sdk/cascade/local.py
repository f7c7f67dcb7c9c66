"""The local tier's part of one cascade request: generate, stop on escalation, resume."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

from sdk.protocol.engine import EngineProtocol, GenerationRequest, SamplingParams, TokenEvent


class LocalRun:
    """Every local token of one request, across the first run and a resumed one."""

    def __init__(self, engine: EngineProtocol, prompt, params: SamplingParams, request_id: str):
        # `prompt`: an sdk.cascade.prompt prompt (chat messages or a raw prompt)
        self.engine, self.prompt, self.params, self.request_id = engine, prompt, params, request_id
        self.prompt_token_ids: list[int] | None = None  # rendered on first use (private requests need it only here)
        self.events: list[TokenEvent] = []  # every local token generated, released or not
        self._stream: AsyncIterator[TokenEvent] | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids or ())

    @property
    def num_generated(self) -> int:
        return len(self.events)

    @property
    def finished(self) -> bool:
        return bool(self.events) and self.events[-1].finish_reason is not None

    async def _prompt(self) -> list[int]:
        if self.prompt_token_ids is None:
            self.prompt_token_ids = await self.prompt.local_tokens(self.engine)
        return self.prompt_token_ids

    async def stream(self) -> AsyncIterator[TokenEvent]:
        """The local answer, token by token (stop() ends it early)."""
        self._stream = self.engine.generate(GenerationRequest(self.request_id, await self._prompt(), self.params))
        try:
            async for event in self._stream:
                self.events.append(event)
                yield event
        finally:
            await self._stream.aclose()  # the engine frees an unfinished request's KV blocks

    async def stop(self) -> None:
        """Abort the local request after an escalation: the cloud takes over."""
        if self._stream is not None and not self.finished:
            await self.engine.abort(self.request_id)
            await self._stream.aclose()

    async def resume(self) -> AsyncIterator[TokenEvent]:
        """Generate the rest of the answer after the tokens already in `events` (none: from scratch)."""
        if self.finished:
            return
        prompt_tail = [event.token_id for event in self.events]
        async for event in self._generate_after(prompt_tail, len(self.events), "-resume" if self.events else ""):
            yield event

    async def take_over(self, text: str, num_emitted: int) -> AsyncIterator[TokenEvent]:
        """Finish an answer the cloud started and could not end: generate after the
        prompt plus `text` (what the client already has, re-tokenized by the local model)."""
        prompt_tail = list(self.engine.tokenize(text, add_special=False))
        async for event in self._generate_after(prompt_tail, num_emitted, "-takeover"):
            yield event

    async def _generate_after(
        self, prompt_tail: list[int], num_emitted: int, id_suffix: str
    ) -> AsyncIterator[TokenEvent]:
        """The prompt plus `prompt_tail`, continued within what is left of max_tokens."""
        remaining = self.params.max_tokens - num_emitted
        if remaining < 1:
            return
        params = dataclasses.replace(self.params, max_tokens=remaining)
        # The tail is the answer's start: a structured request's grammar consumes it first.
        request = GenerationRequest(
            self.request_id + id_suffix,
            await self._prompt() + prompt_tail,
            params,
            num_continuation_tokens=len(prompt_tail),
        )
        async for event in self.engine.generate(request):
            self.events.append(event)
            yield event
