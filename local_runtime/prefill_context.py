"""Prompts prefilled through a 16-bit copy of the weights, their cells then moved to the main context.

The main context decodes on the model file's quantized weights. A second llama.cpp context over
the copy (local_runtime.prefill_weights) runs the prompt chunks of a step: before the chunk, the
slot's cells so far (a shared prefix, earlier chunks) are loaded into it from the main context;
after it, the new cells go back to the main context and the prefill context is emptied. Between
steps it holds nothing, so its pool only needs room for one step's chunks and their prefixes,
and the main context stays the one place the scheduler's books describe.

Which copy, if any, an engine opens is local_runtime.prefill_choice's decision.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from local_runtime.llama_backend import LlamaBackend, LlamaBackendConfig


@dataclass(frozen=True)
class PromptChunk:
    """Prompt tokens of one slot to compute: positions start .. start + len(token_ids) - 1."""

    slot: int
    start: int  # the main context's slot holds exactly positions [0, start) when the chunk runs
    token_ids: np.ndarray


class PrefillContext:
    """The second context, and the moves of cells between it and `main`."""

    def __init__(self, main: LlamaBackend, copy_path: str, n_cells: int, kind: str = "copy"):
        self.main = main
        self.kind = kind  # "bf16" or "f16"
        config = main.config
        self.backend = LlamaBackend(
            LlamaBackendConfig(
                model_path=copy_path,
                n_ctx=n_cells,
                n_seq_max=config.n_seq_max,
                n_batch=config.n_batch,
                n_threads=config.n_threads,
                flash_attn=config.flash_attn,
                kv_cache_type=config.kv_cache_type,  # llama.cpp loads a sequence's state only into cells of its type
            )
        )
        if self.backend.n_vocab != main.n_vocab:
            self.backend.close()
            raise ValueError(f"the prefill copy {copy_path} has another vocabulary than the model")
        self.n_cells = n_cells

    @staticmethod
    def cells_needed(chunks: list[tuple[int, int]]) -> int:
        """Cells one prefill() of (start, number of tokens) chunks holds at its peak: every prefix is
        loaded before the decode, and nothing leaves before the moves after it."""
        return sum(start + num_tokens for start, num_tokens in chunks)

    def prefill(self, chunks: list[PromptChunk]) -> None:
        """Compute the chunks' cells here and hand them to the main context's slots.

        On return each chunk's slot holds positions [0, start + len(token_ids)) in the main context,
        and this context is empty. If it raises, this context is emptied too, while a main slot may
        hold anything from its prefix to the whole (LocalEngine restores the books or recomputes)."""
        try:
            for chunk in chunks:
                if chunk.start:
                    self.backend.write_sequence(chunk.slot, self.main.read_sequence(chunk.slot))
            self._decode(chunks)
            for chunk in chunks:
                self._move_to_main(chunk)
        finally:
            self.backend.clear_all()

    def _decode(self, chunks: list[PromptChunk]) -> None:
        """One llama_decode over every chunk, without logits: the engine samples from the main context."""
        n = sum(len(chunk.token_ids) for chunk in chunks)
        token_ids, positions, slots = (np.empty(n, dtype=np.int32) for _ in range(3))
        i = 0
        for chunk in chunks:
            j = i + len(chunk.token_ids)
            token_ids[i:j] = chunk.token_ids
            positions[i:j] = np.arange(chunk.start, chunk.start + j - i)
            slots[i:j] = chunk.slot
            i = j
        self.backend.decode(token_ids, positions, slots, np.zeros(n, dtype=np.int8))

    def _move_to_main(self, chunk: PromptChunk) -> None:
        slot = chunk.slot
        if self.main.config.kv_streams:  # the slot's stream is rewritten whole: prefix and new cells
            self.main.write_sequence(slot, self.backend.read_sequence(slot))
        else:  # the main pool keeps its own prefix cells (maybe shared with other slots)
            self.backend.drop_positions(slot, 0, chunk.start)
            self.main.write_sequence_tail(slot, self.backend.read_sequence(slot), chunk.start)
        self.backend.clear_slot(slot)

    def close(self) -> None:
        self.backend.close()
