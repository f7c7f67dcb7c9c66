"""Prompts prefilled through a 16-bit copy of the weights, their cells then moved to the main context.

The main context decodes on the model file's quantized weights. A second llama.cpp context over
the copy (local_runtime.prefill_weights) runs the prompt chunks of a step: before the chunk, the
slot's cells so far (a shared prefix, earlier chunks) are loaded into it from the main context;
after it, the new cells go back to the main context and the prefill context is emptied. Between
steps it holds nothing, so its pool only needs room for one step's prompts and their prefixes,
and the main context stays the one place the scheduler's books describe.
"""

from __future__ import annotations

import logging

from local_runtime.config import LocalEngineConfig
from local_runtime.llama_backend import LlamaBackend, LlamaBackendConfig
from local_runtime.prefill_weights import cpu_has_bf16_dot, physical_memory_bytes, prefill_copy_path, resolve_prefill_weights

logger = logging.getLogger("tandem.local")


def open_prefill_context(main: LlamaBackend, config: LocalEngineConfig, model_path: str,
                         max_model_len: int) -> PrefillContext | None:
    """The prefill context `config.prefill_weights` asks for on this model and CPU, or None.

    An explicit "bf16"/"f16" that cannot apply is an error; "auto" then quietly stays off."""
    if not config.may_prefill_on_copy:
        return None
    kind = resolve_prefill_weights(config.prefill_weights, main.metadata("general.file_type"), cpu_has_bf16_dot(),
                                   2 * main.n_params, physical_memory_bytes())
    if kind is None:
        return None
    explicit = config.prefill_weights != "auto"
    if not main.memory_is_one_kv_cache:
        if explicit:
            raise ValueError(f"prefill_weights={kind!r} needs a model with one plain KV cache; {model_path} has "
                             "recurrent state or sliding-window attention (set prefill_weights = \"off\")")  # fmt: skip
        return None
    try:
        copy_path = prefill_copy_path(model_path, kind)
    except (OSError, RuntimeError) as exc:
        if explicit:
            raise
        logger.warning("prefilling on the model's own weights: no %s copy (%s)", kind, exc)
        return None
    # Between steps the context is empty; within one it holds that step's prompt chunks and their
    # prefixes. The engine sends a chunk here only while they fit, so one whole prompt always does.
    return PrefillContext(main, copy_path, max_model_len + config.max_num_batched_tokens, kind)


class PrefillContext:
    """The second context, and the moves of cells between it and `main`."""

    def __init__(self, main: LlamaBackend, copy_path: str, n_cells: int, kind: str = "copy"):
        self.main = main
        self.kind = kind  # "bf16" or "f16"
        config = main.config
        self.backend = LlamaBackend(
            LlamaBackendConfig(model_path=copy_path, n_ctx=n_cells, n_seq_max=config.n_seq_max, n_batch=config.n_batch,
                               n_threads=config.n_threads, flash_attn=config.flash_attn)
        )  # fmt: skip
        if self.backend.n_vocab != main.n_vocab:
            self.backend.close()
            raise ValueError(f"the prefill copy {copy_path} has another vocabulary than the model")
        self.n_cells = n_cells

    def load_prefix(self, slot: int, source_slot: int, num_tokens: int) -> None:
        """Give the prefill context's `slot` the main context's cells of `source_slot` below `num_tokens`."""
        self.backend.write_sequence(slot, self.main.read_sequence(source_slot))
        self.backend.drop_positions(slot, num_tokens)

    def move_to_main(self, slot: int, start: int) -> None:
        """Hand the slot's cells from position `start` on to the main context, and empty the slot here."""
        try:
            if not self.main.config.kv_streams:  # the main pool keeps its own prefix cells (maybe shared)
                self.backend.drop_positions(slot, 0, start)
            self.main.write_sequence_tail(slot, self.backend.read_sequence(slot), start)
        finally:
            self.backend.clear_slot(slot)

    def close(self) -> None:
        self.backend.close()
