"""Decode and verification steps as one compiled graph ([cloud] compile), over static buckets and
preallocated buffers.

Why: an eager decode step issues thousands of small ops (about 4,000 at 32 sequences for the
135M model), each paying Python and dispatch overhead, and runs the elementwise work between the
matmuls (norms, rotary, SwiGLU, residual adds) as separate passes over memory. torch.compile
turns the step into one graph: inductor fuses that work into a few C++ loops (Triton on CUDA),
and the matmuls and attention stay single opaque calls (cloud_engine.custom_ops).

A step qualifies when every token it computes is sampled: each request adds one token (decode),
or its last token and a draft to verify (its own n-gram proposal, or a device's). Every such token
is a row: its request's block table, its context up to and including itself, so the rows of one
draft attend causally to each other with no mask (each row's K/V is written before any row reads),
and a verification step is a decode step with more rows (cloud_engine.model_runner). Its rows are
padded up to a bucket (2, 4, then multiples of 8) and written into buffers allocated once, so the
graph sees a handful of shapes and never a Python value that changes between steps (no host
synchronization inside it). Steps holding a prompt chunk stay eager.

Pad rows decode token 0 at position 0 and write their K/V into the pad block, one block past
the pool the block manager hands out; each attends to that one slot only. So a pad row never
writes a live slot, and since rows never read each other, a live row's output is what it
would be without them (tests/cloud_engine/test_compiled_decode.py pins both).

One graph serves every bucket (the row dimension is dynamic), so warming up compiles once;
inductor keeps the compiled code on disk (`compile_cache_dir`), so a second start traces but
does not recompile.
"""

from __future__ import annotations

import os
import types
from pathlib import Path

import numpy as np
import torch

from cloud_engine.attention_metadata import DecodeMetadata
from cloud_engine.custom_ops import load_cpu_ops
from cloud_engine.kernels import kernel_cache_dir
from cloud_engine.model.packed_linear import row_bucket

# No bucket of 1: a lone sequence decodes with one pad row, so a single graph (its row dimension
# dynamic; dynamo specializes a size of 1) serves every step. The second row costs little (the
# step streams the weights once either way) and halves the trace on every start.
SMALL_BUCKETS = (2, 4)
BUCKET_STEP = 8  # above SMALL_BUCKETS: multiples of this many rows


def decode_buckets(max_rows: int) -> list[int]:
    """Row counts compiled steps are padded to, enough for `max_rows`. Each is also its own
    packed-linear row bucket, so oneDNN's warmed-up primitives serve it without more padding."""
    sizes = [*SMALL_BUCKETS, *range(BUCKET_STEP, max_rows + BUCKET_STEP, BUCKET_STEP)]
    buckets = sorted({row_bucket(size) for size in sizes})
    return [b for b in buckets if b < max_rows] + [next(b for b in buckets if b >= max_rows)]


def resolve_compile(mode: str, device: torch.device, packed_linears: bool, decode_kernel) -> tuple[bool, str]:
    """Whether decode steps compile under [cloud] compile = `mode`, and why (the engine logs it).

    auto leaves them eager. On CPU they measured faster (2-core Xeon, bf16 with packed linears and the
    CPU kernel: 0.78 of the eager step at 1 sequence, 0.81-0.87 at 32; served, TPOT 0.85 of eager at
    32 clients), but the compile has to happen somewhere and each place measured worse: at start it
    adds about 28 s to a machine's first start and 6-8 s to every later one (tracing; inductor's code
    comes from the disk cache), past the cloud tier's 15 s ready-on-second-start target; in a
    background thread after ready it made the eager steps meanwhile 5-14 times slower (tracing holds
    the GIL that every eager op needs back). Long-running servers set compile = on. On CUDA they are
    not measured (no device was lent). docs/cloud-engine.md, "Compiled decode steps".

    Where auto stays eager on CPU, the engine still looks for a step compiled ahead of time for its settings
    (cloud_engine.precompiled_decode, `tandem cloud precompile`), which loads in seconds."""
    if mode in ("on", "off"):
        return mode == "on", f"compile = {mode}"
    if device.type != "cpu":
        return False, f"auto: compiled decode steps are not measured on {device.type} yet (compile = on to try them)"
    if packed_linears and decode_kernel is not None:
        return False, (
            "auto: compiled decode steps measured faster here (0.78-0.87 of eager) but cost ~6-8 s of every start "
            "(~28 s the first time), or slow eager steps 5-14x while compiling in the background; compile = on "
            "for long-running servers"
        )
    return False, "auto: compiled decode steps are measured with packed bf16 linears and the CPU kernel only"


def _own_code(method):
    """`method` bound to a copy of its code object. Dynamo keeps compiled graphs per code object,
    at most 8 (recompile_limit): engines sharing one `step` would pile their graphs onto
    it until a process's ninth engine failed to compile, and an engine's graphs would outlive it.
    With its own code, each engine's graphs live and die with the engine."""
    function = method.__func__
    copy = types.FunctionType(function.__code__.replace(), function.__globals__, function.__name__)
    return types.MethodType(copy, method.__self__)


def compile_cache_dir() -> Path:
    """Inductor's on-disk cache: $TORCHINDUCTOR_CACHE_DIR where set, else beside tandem's kernels."""
    configured = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return Path(configured) if configured else kernel_cache_dir().parent / "inductor"


class CompiledDecode:
    """The buffers and the compiled forward (ids, positions, decode layout -> float32 logits) of the steps
    whose every token samples; `max_rows`: the most such tokens a step holds (CloudEngineConfig.max_sampled_rows)."""

    def __init__(
        self,
        model,
        max_rows: int,
        max_blocks_per_seq: int,
        pad_block: int,
        block_size: int,
        native_attention: bool,
        packed_linears: bool,
        device: torch.device,
    ):
        if (native_attention or packed_linears) and not load_cpu_ops():
            raise RuntimeError("compiled decode steps need the CPU kernels' ops, which could not be built here")
        self.model = model
        self.buckets = decode_buckets(max_rows)
        self.max_rows = self.buckets[-1]
        self.native_attention = native_attention
        self.pad_block, self.pad_slot = pad_block, pad_block * block_size
        rows = self.max_rows
        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=device)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((rows,), self.pad_slot, dtype=torch.int64, device=device)
        self.block_tables = torch.full((rows, max_blocks_per_seq), pad_block, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(rows, dtype=torch.int64, device=device)
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(compile_cache_dir()))
        self._compiled = torch.compile(_own_code(self.step), fullgraph=True, dynamic=False)  # traced on first call
        self._precompiled = None  # or a step loaded from disk (cloud_engine.precompiled_decode), called with self

    def step(self, input_ids, positions, slot_mapping, block_tables, seq_lens) -> torch.Tensor:
        """The graph: one step's rows -> float32 logits."""
        metadata = DecodeMetadata(slot_mapping, block_tables, seq_lens, self.native_attention)
        return self.model.compute_logits(self.model(input_ids, positions, metadata))

    def bucket(self, rows: int) -> int:
        return next(b for b in self.buckets if b >= rows)

    def stage(
        self,
        token_ids: np.ndarray,
        positions: np.ndarray,
        slots: np.ndarray,
        block_tables: np.ndarray,
        seq_lens: np.ndarray,
    ) -> int:
        """Write one step (one row per sampled token; block tables [rows, width]) into the buffers, pad
        rows after it up to its bucket; returns the bucket. Rows past the previous step's become pad rows."""
        rows, bucket = len(token_ids), self.bucket(len(token_ids))
        for buffer, values in (
            (self.input_ids, token_ids),
            (self.positions, positions),
            (self.slot_mapping, slots),
            (self.seq_lens, seq_lens),
        ):
            buffer[:rows].copy_(torch.from_numpy(np.asarray(values, dtype=np.int64)))
        self.block_tables[:rows, : block_tables.shape[1]].copy_(torch.from_numpy(block_tables))
        self._pad(rows, bucket)
        return bucket

    def _pad(self, start: int, end: int) -> None:
        if start == end:
            return
        self.input_ids[start:end] = 0
        self.positions[start:end] = 0
        self.slot_mapping[start:end] = self.pad_slot
        self.block_tables[start:end, 0] = self.pad_block  # later columns: never read at length 1
        self.seq_lens[start:end] = 1

    def views(self, bucket: int) -> tuple[torch.Tensor, ...]:
        """The staged step's first `bucket` rows: input ids, positions, slot mapping, block tables, lengths."""
        buffers = (self.input_ids, self.positions, self.slot_mapping, self.block_tables, self.seq_lens)
        return tuple(buffer[:bucket] for buffer in buffers)

    def forward(self, bucket: int) -> torch.Tensor:
        """float32 logits [bucket, vocab] for the staged step (pad rows' included)."""
        args = self.views(bucket)
        if self._precompiled is not None:
            return self._precompiled(self, *args)
        if self.max_rows > 2:  # one graph for every bucket
            for arg in args:
                torch._dynamo.mark_dynamic(arg, 0)  # no range: cached graphs are shared by engines of any size
        return self._compiled(*args)

    def prepare_precompiled_call(self) -> tuple:
        """The arguments a saved step is compiled for or checked against: (self, the smallest bucket's views), on pad
        rows, after one eager step (it builds what the model makes on first use, such as rotary tables per device,
        so a saved graph's guards see it there)."""
        self._pad(0, self.max_rows)
        args = self.views(self.buckets[0])
        self.step(*args)
        return (self, *args)

    def use_precompiled(self, function) -> None:
        """Run steps through `function` (a loaded ahead-of-time compiled `step`) instead of tracing."""
        self._precompiled = function

    def warm_up(self) -> None:
        """Compile now, on pad rows only (they write the pad block alone), rather than at the first decode steps."""
        with torch.inference_mode():
            self._pad(0, self.max_rows)
            self.forward(self.buckets[0])
