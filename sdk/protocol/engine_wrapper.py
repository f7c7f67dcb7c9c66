"""An EngineProtocol engine that hands everything to the engine it wraps: the base of the
serving layers that change one thing about an engine (a budget on each generation, a drain).
Subclasses override what they change; the rest, and any attribute beyond the protocol
(wait_ready, vocabulary_fingerprint, sampling_defaults, ...), is the wrapped engine's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from sdk.protocol.engine import EngineProtocol, EngineStats, GenerationRequest, TokenEvent


class EngineWrapper:
    def __init__(self, engine: EngineProtocol):
        self.engine = engine

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def is_ready(self) -> bool:
        return self.engine.is_ready

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.engine.tokenize(text, add_special)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.engine.detokenize(token_ids)

    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]:
        return self.engine.apply_chat_template(messages)

    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        return self.engine.generate(request)

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def __getattr__(self, name: str) -> Any:
        if name == "engine":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.engine, name)
