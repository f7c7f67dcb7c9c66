"""An EngineProtocol engine that hands everything to the engine it wraps: the base of the
serving layers that change one thing about an engine (a budget on each generation, a drain).
Subclasses override what they change; the rest of the protocol is forwarded, and any attribute
beyond it (wait_ready, shutdown, ...) is the wrapped engine's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from sdk.protocol.engine import Caller, EngineProtocol, EngineStats, GenerationRequest, TokenEvent

if TYPE_CHECKING:
    from sdk.protocol.sampling_params import SamplingDefaults
    from sdk.protocol.drafts import OutsideDraft


class EngineWrapper(EngineProtocol):
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

    @property
    def chat_template(self) -> str | None:
        return self.engine.chat_template

    @property
    def vocabulary_fingerprint(self) -> str:
        return self.engine.vocabulary_fingerprint

    @property
    def max_token_bytes(self) -> int | None:
        return self.engine.max_token_bytes

    @property
    def sampling_defaults(self) -> SamplingDefaults | None:
        return self.engine.sampling_defaults

    @property
    def model_path(self) -> str | None:
        return self.engine.model_path

    @property
    def vocab_size(self) -> int | None:
        return self.engine.vocab_size

    @property
    def max_draft_tokens(self) -> int:
        return self.engine.max_draft_tokens

    def offer_draft(self, draft: OutsideDraft) -> None:
        self.engine.offer_draft(draft)

    def num_drafts_waiting(self, request_id: str) -> int:
        return self.engine.num_drafts_waiting(request_id)

    @property
    def draining(self) -> bool:
        return self.engine.draining

    @property
    def bills_callers(self) -> bool:
        return self.engine.bills_callers

    async def soft_warning(self, caller: Caller) -> str | None:
        return await self.engine.soft_warning(caller)

    def __getattr__(self, name: str) -> Any:
        if name == "engine":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.engine, name)
