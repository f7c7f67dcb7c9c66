"""The one module that talks to llama.cpp's decoding (through llama-cpp-python's low-level ctypes API).

One model, one context with `n_seq_max` sequence slots over a unified KV pool or one KV stream
per slot, one reusable `llama_batch`. Everything above sees plain Python and numpy. What the
model's vocabulary and metadata say is the other half, `llama_vocabulary.LlamaVocabulary`.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass

import numpy as np

from local_runtime import kv_state
from local_runtime.llama_vocabulary import LlamaVocabulary

_backend_lock = threading.Lock()
_backend_initialised = False

# KV cell types tandem offers (LocalEngineConfig.kv_cache_type): llama.cpp's ggml type ids (ggml.h), and the
# bytes one block of values takes with the values it holds (ggml's type traits: f16 2 per value; q8_0 32 int8
# and an f16 scale; q4_0 32 nibbles and an f16 scale).
KV_CACHE_GGML_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}
_KV_TYPE_BLOCK_BYTES = {"f16": (2, 1), "q8_0": (34, 32), "q4_0": (18, 32)}


def cpu_reports_amx() -> bool:
    """Whether /proc/cpuinfo lists AMX tiles (Sapphire Rapids and later; some VMs report it too)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            return any(line.startswith("flags") and " amx_tile" in line for line in cpuinfo)
    except OSError:
        return False


class LlamaLoadError(RuntimeError):
    """The GGUF could not be loaded or a context could not be made."""


@dataclass
class LlamaBackendConfig:
    """How to load the model and size the context."""

    model_path: str
    n_ctx: int  # KV cells in the unified pool, shared by all slots
    n_seq_max: int  # sequence slots
    n_batch: int  # most tokens one llama_decode may carry
    n_threads: int
    n_gpu_layers: int = 0
    flash_attn: bool = True
    kv_cache_type: str = "f16"  # K and V cells (KV_CACHE_GGML_TYPES); a quantized V needs flash_attn
    extra_buffer_types: bool = False  # llama.cpp's repacked (CPU_REPACK, AMX) weight layouts (its own default is on)
    batch_invariant: bool = False  # keep prefill ubatches on the per-row attention kernel (see below)
    pad_single_decodes: bool = False  # also keep lone decodes off the split-KV kernel (costs ~40%)
    # One KV stream per slot (llama.cpp's kv_unified off), n_ctx / n_seq_max cells each, instead of
    # one pool. A decode then attends over its own stream only; see decode() for the batch order
    # this layout needs, and share_prefix() for what a prefix copy costs in it.
    kv_streams: bool = False
    # One more sequence id than the slots (unified pool only), through which write_sequence_tail
    # adds cells to a slot without dropping the ones it has (local_runtime.prefill_context).
    scratch_sequence: bool = False


# llama.cpp's CPU flash attention picks its kernel from the ubatch shape: a tiled kernel
# from 64 query rows up, a split-KV kernel for exactly one query row over >= 512 cells,
# and a per-row kernel otherwise. Only the per-row kernel gives a sequence the same
# numbers whatever else shares its batch (it walks the sequence's own cells in order
# and skips masked ones), and the weight matmuls are per row already. So in
# batch-invariant mode ubatches hold at most 63 tokens (free: decode steps are small
# anyway), and with `pad_single_decodes` a lone token is decoded beside one scratch
# token, which costs most of a second row on a compute-bound CPU. Without it a lone
# decode over >= 512 cells rounds differently from the same decode in a batch.
# Attention also sums a sequence's cells in cell order, so invariance further needs the
# cells in position order: llama.cpp refills cells freed by a request that finished
# mid-flight, which can put a running sequence's next token before its earlier ones.
_INVARIANT_MAX_UBATCH = 63
# Otherwise ubatches are llama.cpp's own default size (llama-server's -ub): a lone 128-token
# prompt then goes through in one ubatch on the tiled kernel, 1.1-1.2x faster than in 63-token
# pieces on an AVX2 EPYC and more on AVX-512 (docs/local-engine.md "Batch invariance"), and a larger
# max_num_batched_tokens does not grow llama.cpp's compute buffers past its default.
_DEFAULT_MAX_UBATCH = 512


def _init_backend_once(llama_cpp) -> None:
    global _backend_initialised
    with _backend_lock:
        if not _backend_initialised:
            llama_cpp.llama_backend_init()
            _silence_llama_logs(llama_cpp)
            _backend_initialised = True


def _silence_llama_logs(llama_cpp) -> None:
    """llama.cpp logs every load step to stderr; keep warnings and errors only."""
    if os.environ.get("TANDEM_LLAMA_VERBOSE"):
        return

    @llama_cpp.llama_log_callback
    def _log(level, text, user_data):  # noqa: ARG001
        if level in (3, 4):  # GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR
            os.write(2, text)

    _silence_llama_logs.callback = _log  # keep a reference alive for the C side
    llama_cpp.llama_log_set(_log, ctypes.c_void_p(0))


def convert_weights(source: str, target: str, kind: str) -> None:
    """Write `source`'s weights as `kind` ("bf16" or "f16") to `target` with llama.cpp's own converter
    (llama_model_quantize, requantizing; norms and other small tensors stay as they are)."""
    import llama_cpp

    _init_backend_once(llama_cpp)  # its per-tensor log lines go through the same filter
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = {"bf16": llama_cpp.LLAMA_FTYPE_MOSTLY_BF16, "f16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16}[kind]
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    if llama_cpp.llama_model_quantize(source.encode(), target.encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama.cpp could not convert {source} to {kind}")


class LlamaBackend(LlamaVocabulary):
    """A loaded GGUF model and its multi-sequence context (tokenizing and metadata: LlamaVocabulary)."""

    def __init__(self, config: LlamaBackendConfig):
        import llama_cpp  # heavy: loads the shared library

        self._lib = llama_cpp
        self.config = config
        if config.kv_cache_type not in KV_CACHE_GGML_TYPES:  # before anything is loaded
            raise ValueError(
                f"kv_cache_type must be one of {', '.join(KV_CACHE_GGML_TYPES)}, got {config.kv_cache_type!r}"
            )
        if not os.path.isfile(config.model_path):
            raise LlamaLoadError(f"model file not found: {config.model_path}")
        _init_backend_once(llama_cpp)

        model_params = llama_cpp.llama_model_default_params()
        # Repacked layouts exist per tensor type (Q4_0, Q4_K, IQ4_NL, ... on x86; none for Q4_1, so
        # on the embedded SmolLM2 this changes nothing). Off by default because their kernels make
        # a row's logits depend on its batch (docs/local-engine.md: "Extra buffer types"), not for the crash that
        # once kept them off and no longer reproduces.
        if config.extra_buffer_types and cpu_reports_amx():
            raise LlamaLoadError(
                "extra_buffer_types: this CPU reports AMX, whose repacked layout llama.cpp then uses, and that "
                "layout crashed the process here on any prompt of 8 tokens or more (an Intel Xeon VM, llama.cpp "
                "of llama-cpp-python 0.3.36; docs/local-engine.md, Extra buffer types); leave it off"
            )
        model_params.use_extra_bufts = config.extra_buffer_types
        model_params.n_gpu_layers = config.n_gpu_layers
        self.model = llama_cpp.llama_model_load_from_file(config.model_path.encode(), model_params)
        if not self.model:
            raise LlamaLoadError(f"llama.cpp could not load {config.model_path} (is it a GGUF file?)")
        LlamaVocabulary.__init__(self, llama_cpp, self.model)
        self.n_ctx_train = llama_cpp.llama_model_n_ctx_train(self.model)

        if config.n_batch < 2:
            raise ValueError("n_batch must be >= 2")
        if config.kv_streams and (config.pad_single_decodes or config.scratch_sequence):
            raise ValueError("a scratch sequence needs the unified pool (it would take a whole stream)")
        # The scratch slot (last sequence id) holds cells only within one call: a padded decode's
        # one cell, or cells on their way into a slot.
        self.scratch_slot = config.n_seq_max if (config.pad_single_decodes or config.scratch_sequence) else None
        n_slots = config.n_seq_max + (1 if self.scratch_slot is not None else 0)
        ctx_params = llama_cpp.llama_context_default_params()
        ctx_params.n_ctx = config.n_ctx + (1 if config.pad_single_decodes else 0)
        ctx_params.n_batch = config.n_batch
        ctx_params.n_ubatch = min(
            config.n_batch, _INVARIANT_MAX_UBATCH if config.batch_invariant else _DEFAULT_MAX_UBATCH
        )
        ctx_params.n_seq_max = n_slots
        ctx_params.n_threads = config.n_threads
        ctx_params.n_threads_batch = config.n_threads
        ctx_params.kv_unified = not config.kv_streams
        ctx_params.no_perf = True
        ctx_params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if config.flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        ctx_params.type_k = ctx_params.type_v = KV_CACHE_GGML_TYPES[config.kv_cache_type]
        self.ctx = llama_cpp.llama_init_from_model(self.model, ctx_params)
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            raise LlamaLoadError(
                f"llama.cpp could not create a context with n_ctx={config.n_ctx}, n_seq_max={config.n_seq_max}, "
                f"kv_cache_type={config.kv_cache_type}, flash_attn={config.flash_attn}"
            )
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        # Cells one sequence can hold: its stream, or the whole pool.
        self.cells_per_slot = llama_cpp.llama_n_ctx_seq(self.ctx) if config.kv_streams else config.n_ctx
        self._batch = llama_cpp.llama_batch_init(config.n_batch, 0, 1)
        n = config.n_batch
        self._tokens = np.ctypeslib.as_array(self._batch.token, shape=(n,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(n,))
        self._n_seq_id = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n,))
        self._want_logits = np.ctypeslib.as_array(self._batch.logits, shape=(n,))
        self._seq_id_rows = [self._batch.seq_id[i] for i in range(n)]
        self._closed = False

    # -- decoding --------------------------------------------------------------------------

    def decode(
        self,
        token_ids: np.ndarray,
        positions: np.ndarray,
        slots: np.ndarray,
        want_logits: np.ndarray,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Run one llama_decode over a flat batch; logits rows for the tokens that asked, in order.

        With kv_streams, llama.cpp puts sequences into one ubatch only while their slots count up by
        one in batch order (llama_batch_allocr::split_equal, "sequential"): a batch ordered by slot
        over slots 0..7 is one pass over the weights, the same rows over slots 0, 2, .., 14 are eight.
        The engine orders its batches by slot and the scheduler hands out the lowest free slot.

        `out`: a float32 [rows, n_vocab] buffer the caller reuses step after step (the rows are
        written into its head and a view returned; it is overwritten by the next call). A fresh
        1.5 MB array per step costs its page faults every step."""
        n = len(token_ids)
        if n == 0 or n > self.config.n_batch:
            raise ValueError(f"batch of {n} tokens; must be 1..{self.config.n_batch}")
        self._tokens[:n] = token_ids
        self._pos[:n] = positions
        self._n_seq_id[:n] = 1
        self._want_logits[:n] = want_logits
        rows = self._seq_id_rows
        for i, slot in enumerate(slots.tolist()):
            rows[i][0] = slot
        padded = n == 1 and self.config.pad_single_decodes
        if padded:  # a second query row keeps llama.cpp off the split-KV kernel
            self._tokens[1], self._pos[1], self._n_seq_id[1], self._want_logits[1] = token_ids[0], 0, 1, 0
            rows[1][0] = self.scratch_slot
        self._batch.n_tokens = n + padded
        rc = self._lib.llama_decode(self.ctx, self._batch)
        if padded:
            self.clear_slot(self.scratch_slot)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc} on a batch of {n} tokens")
        n_out = int(np.count_nonzero(want_logits))
        if out is not None and out.shape[0] >= n_out and out.shape[1] == self.n_vocab and out.dtype == np.float32:
            logits = out[:n_out]
        else:
            logits = np.empty((n_out, self.n_vocab), dtype=np.float32)
        if n_out:  # llama_get_logits: every output row, in batch order (llama.cpp undoes its ubatch reordering)
            logits[:] = np.ctypeslib.as_array(self._lib.llama_get_logits(self.ctx), shape=(n_out, self.n_vocab))
        return logits

    def clear_slot(self, slot: int) -> None:
        """Drop every cell of a sequence slot (cells shared with other slots stay for them)."""
        self._lib.llama_memory_seq_rm(self.memory, slot, -1, -1)

    def share_prefix(self, src_slot: int, dst_slot: int, num_tokens: int) -> None:
        """Give `dst_slot` the cells of positions [0, num_tokens) of `src_slot`; `src_slot == dst_slot`
        keeps a slot's first `num_tokens` positions and drops the rest (a slot taken over as is).

        In the unified pool the cells are shared, not copied. Between streams the source's cells are
        read and written into `dst_slot` (which must be empty) at once, then the positions past the
        prefix dropped again. llama.cpp's own stream copy (seq_cp) would copy a whole stream's buffer,
        and only at the next decode: until then reading the destination gives stale cells, and a
        write into it before that decode is overwritten (a step that fails between the two would
        leave such a copy pending for the next one)."""
        if src_slot == dst_slot:
            self._lib.llama_memory_seq_rm(self.memory, dst_slot, num_tokens, -1)
        elif self.config.kv_streams:
            self.write_sequence(dst_slot, self.read_sequence(src_slot))
            self._lib.llama_memory_seq_rm(self.memory, dst_slot, num_tokens, -1)
        else:
            self._lib.llama_memory_seq_cp(self.memory, src_slot, dst_slot, 0, num_tokens)

    def clear_all(self) -> None:
        """Drop every cell of every slot and start placing cells from the pool's first cell again."""
        self._lib.llama_memory_clear(self.memory, False)

    # -- moving a sequence's cells between contexts (local_runtime.prefill_context) ----------

    @property
    def n_params(self) -> int:
        return int(self._lib.llama_model_n_params(self.model))

    @property
    def kv_bytes_per_cell(self) -> int:
        """Bytes one KV cell (one token) takes over all layers in the context's kv_cache_type: the K and V
        widths of each layer's KV heads, in whole blocks of the type. For a model with sliding-window layers
        this counts every layer as full (llama.cpp sizes their separate cache by the window instead)."""
        lib, model = self._lib, self.model
        n_layer, n_head, n_head_kv = (
            lib.llama_model_n_layer(model),
            lib.llama_model_n_head(model),
            lib.llama_model_n_head_kv(model),
        )
        arch = self.metadata("general.architecture") or ""
        default_width = lib.llama_model_n_embd(model) // max(1, n_head)
        key_width = int(self.metadata(f"{arch}.attention.key_length") or default_width)
        value_width = int(self.metadata(f"{arch}.attention.value_length") or default_width)
        block_bytes, block_values = _KV_TYPE_BLOCK_BYTES[self.config.kv_cache_type]
        row_bytes = sum(-(-n_head_kv * width // block_values) * block_bytes for width in (key_width, value_width))
        return n_layer * row_bytes

    @property
    def memory_is_one_kv_cache(self) -> bool:
        """Whether the model's memory is one plain KV cache, the only kind kv_state converts (no
        sliding-window attention's second cache, no recurrent state)."""
        lib, model = self._lib, self.model
        return not (
            lib.llama_model_is_recurrent(model) or lib.llama_model_is_hybrid(model) or lib.llama_model_n_swa(model) > 0
        )

    @property
    def n_streams(self) -> int:
        return self.config.n_seq_max if self.config.kv_streams else 1

    def read_sequence(self, slot: int) -> bytes:
        """A slot's cells (positions, K and V of every layer) in llama.cpp's sequence-state format,
        rewritten as if the context had one stream (kv_state), so any context of the model can load them."""
        lib = self._lib
        size = lib.llama_state_seq_get_size(self.ctx, slot)
        buf = (ctypes.c_uint8 * size)()
        n = lib.llama_state_seq_get_data(self.ctx, buf, size, slot)
        if n == 0:
            raise RuntimeError(f"llama.cpp could not read the cells of slot {slot}")
        return kv_state.to_one_stream(memoryview(buf)[:n], self.n_streams, slot if self.config.kv_streams else 0)

    def write_sequence(self, slot: int, state: bytes) -> None:
        """Replace a slot's cells with `state` (from read_sequence of any context of the same model)."""
        data = bytearray(kv_state.from_one_stream(state, self.n_streams))
        buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
        if self._lib.llama_state_seq_set_data(self.ctx, buf, len(data), slot) != len(data):
            raise RuntimeError(
                f"llama.cpp could not load {len(data)} bytes of cells into slot {slot} (is the pool full?)"
            )

    def write_sequence_tail(self, slot: int, state: bytes, start: int) -> None:
        """Add `state`'s cells (positions >= `start`) to a slot, keeping its positions below `start`.

        llama.cpp loads a sequence's state only whole, over whatever the sequence had; in the unified
        pool the cells go to the scratch sequence first and are then shared into the slot, which keeps
        the slot's own (possibly shared) prefix cells as they are. With streams a slot owns every cell
        of its stream, so the state is loaded whole (it must then hold the prefix as well)."""
        if self.config.kv_streams:
            self.write_sequence(slot, state)
            return
        if self.scratch_slot is None:
            raise ValueError("write_sequence_tail on the unified pool needs scratch_sequence")
        lib = self._lib
        lib.llama_memory_seq_rm(self.memory, slot, start, -1)
        try:
            self.write_sequence(self.scratch_slot, state)
            lib.llama_memory_seq_cp(self.memory, self.scratch_slot, slot, -1, -1)
        finally:
            self.clear_slot(self.scratch_slot)

    def drop_positions(self, slot: int, start: int, end: int = -1) -> None:
        """Drop a slot's cells of positions [start, end) (end -1: to the last)."""
        self._lib.llama_memory_seq_rm(self.memory, slot, start, end)

    def slot_max_position(self, slot: int) -> int:
        """Largest position held for a slot, -1 when empty (for tests and checks)."""
        return self._lib.llama_memory_seq_pos_max(self.memory, slot)

    def slot_min_position(self, slot: int) -> int:
        """Smallest position held for a slot, -1 when empty (for tests and checks)."""
        return self._lib.llama_memory_seq_pos_min(self.memory, slot)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._lib.llama_batch_free(self._batch)
        self._lib.llama_free(self.ctx)
        self._lib.llama_model_free(self.model)
