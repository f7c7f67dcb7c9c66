"""Factories for real local engines on the embedded default model."""

from __future__ import annotations

import numpy as np
import pytest

from local_runtime.config import LocalEngineConfig
from local_runtime.engine import LocalEngine
from sdk.protocol.engine import GenerationRequest, SamplingParams

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers.",
    "Who wrote Hamlet?",
    "Translate 'good morning' to Spanish.",
    "What is 12 times 7?",
    "Describe a cat in detail: its habits, its fur, and what it likes to eat on long winter days.",
]


def make_engine(**overrides) -> LocalEngine:
    config = dict(kv_cache_tokens=2048, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=512)
    config.update(overrides)
    return LocalEngine(LocalEngineConfig(**config))


def assert_no_blocks_held(engine: LocalEngine) -> None:
    """No request holds a KV block, and evicting the prompt cache returns every block to the pool."""
    assert engine.stats().num_kv_blocks_used == 0
    engine.clear_prompt_cache()
    assert (
        engine.block_manager.num_used_blocks == 0
        and engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    )


def run_to_completion(engine: LocalEngine, requests: list[GenerationRequest]) -> dict[str, list]:
    """Submit all requests at once and step until done; the events of each request."""
    for request in requests:
        engine.add_request(request)
    events: dict[str, list] = {r.request_id: [] for r in requests}
    while engine.has_unfinished_requests():
        for event in engine.step():
            events.setdefault(event.request_id, []).append(event)
    return events


def greedy(request_id: str, prompt: list[int], max_tokens: int, **kwargs) -> GenerationRequest:
    return GenerationRequest(request_id, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, **kwargs))


@pytest.fixture(scope="module")
def engine(request):
    """One engine per module; a module that needs another configuration sets ENGINE_OVERRIDES
    (the modules comparing run against run set batch_invariant=True)."""
    e = make_engine(**getattr(request.module, "ENGINE_OVERRIDES", {}))
    yield e
    e.close()


@pytest.fixture(scope="module")
def chat_prompts(engine):
    return [engine.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]


# -- the prefill copy, pointed at references ----------------------------------------------------


class ChunksInMain:
    """The reference for the prefill copy: the same chunks the engine gives the copy, computed in the
    main context itself, with no second context and no moves. An engine with this in place of its
    prefill context splits its prompts exactly as one with a copy does (all but the token that samples
    in one pass, that token in the next), so the two answer alike unless moving cells loses some."""

    kind = "reference"

    def __init__(self, main, n_cells: int):
        self.main = main
        self.n_cells = n_cells

    def prefill(self, chunks) -> None:
        n = sum(len(chunk.token_ids) for chunk in chunks)
        token_ids = np.concatenate([chunk.token_ids for chunk in chunks]).astype(np.int32)
        positions = np.concatenate([np.arange(c.start, c.start + len(c.token_ids)) for c in chunks]).astype(np.int32)
        slots = np.concatenate([np.full(len(c.token_ids), c.slot) for c in chunks]).astype(np.int32)
        self.main.decode(token_ids, positions, slots, np.zeros(n, dtype=np.int8))

    def close(self) -> None:
        pass


def copy_cells(engine) -> int:
    return engine.max_model_len + engine.config.max_num_batched_tokens


def own_file_as_copy(engine: LocalEngine) -> LocalEngine:
    """Point the engine's prefill context at the model file itself: same weights, same kernels."""
    from local_runtime.prefill_context import PrefillContext
    from sdk.engine_common.model_files import default_model_path

    engine.prefill.close()
    engine.prefill = PrefillContext(engine.backend, default_model_path(), copy_cells(engine))
    return engine


def chunks_in_main(engine: LocalEngine) -> LocalEngine:
    """Replace the engine's prefill context with ChunksInMain (the reference own_file_as_copy is held to)."""
    engine.prefill.close()
    engine.prefill = ChunksInMain(engine.backend, copy_cells(engine))
    return engine
