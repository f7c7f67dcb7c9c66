"""Offline batch generation: `LLM(...).generate(prompts, params)`.

All prompts go into the engine at once and are served by the same continuous-batching
loop as online traffic, so an offline batch gets chunked prefill, prefix caching and
the token-budget scheduler for free.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields
from typing import Sequence

from cloud_engine.config import CloudEngineConfig
from cloud_engine.engine import CloudEngine
from sdk.protocol.engine import GenerationRequest, SamplingParams, TokenEvent


@dataclass
class CompletionOutput:
    """One prompt's finished generation."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    events: list[TokenEvent] = field(default_factory=list)  # per-token logprobs and confidence signals


class LLM:
    """A cloud engine for offline use; keyword arguments are CloudEngineConfig fields."""

    def __init__(self, model: str | None = None, **config):
        known = {f.name for f in fields(CloudEngineConfig)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise TypeError(f"unknown LLM option(s) {unknown}; valid ones: {sorted(known - {'model'})}")
        self.engine = CloudEngine(CloudEngineConfig(model=model, **config))
        self._ids = itertools.count()

    def generate(
        self, prompts: Sequence[str | list[int]], params: SamplingParams | Sequence[SamplingParams] | None = None
    ) -> list[CompletionOutput]:
        """Generate for every prompt (text, tokenized with BOS, or token ids); outputs in prompt order."""
        if isinstance(prompts, str):
            prompts = [prompts]
        params_list = list(params) if isinstance(params, (list, tuple)) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts")
        requests = []
        for prompt, p in zip(prompts, params_list):
            ids = self.engine.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
            requests.append(GenerationRequest(f"llm-{next(self._ids)}", ids, p))
        for request in requests:  # all of them first: a bad prompt raises before anything runs
            self.engine.validate(request)
        outputs = {r.request_id: CompletionOutput(r.request_id, r.prompt_token_ids) for r in requests}
        try:
            for request in requests:
                self.engine.add_request(request)
            while self.engine.has_unfinished_requests():
                for event in self.engine.step():
                    out = outputs[event.request_id]
                    out.token_ids.append(event.token_id)
                    out.text += event.text
                    out.events.append(event)
                    out.finish_reason = event.finish_reason
        except BaseException:
            self.engine.abort_all()
            raise
        return list(outputs.values())

    def chat(
        self, conversations: Sequence[Sequence[dict]], params: SamplingParams | Sequence[SamplingParams] | None = None
    ) -> list[CompletionOutput]:
        """Generate replies to chat conversations rendered with the model's own template."""
        return self.generate([self.engine.apply_chat_template(messages) for messages in conversations], params)
