"""The compiled decode step saved to disk, so a later start loads it instead of tracing ([cloud] compile = auto).

Why: compiling the decode step measured faster steps on CPU, but tracing the 30-layer model costs every start 6-8 s
and a first start ~28 s more (cloud_engine.compiled_decode.resolve_compile), past the cloud tier's 15 s
ready-on-second-start target; so `auto` stayed eager. Dynamo's ahead-of-time compile (`aot_compile`) keeps the traced
graph, its guards and inductor's code in one file; loading it took ~2.4 s and its first call ~2 s for SmolLM2-135M on
a 2-core EPYC (float32, int8 weights), where tracing took 6-8 s and a first compile ~60 s.

The weights are not in the file: the step reads them through the CompiledDecode it is called with (its first
argument), so one artifact serves any checkpoint of the same shapes. Its guards check those shapes (the model's,
the KV pool's, the buffers') at load, and a mismatch leaves the engine eager. oneDNN-packed weights (bf16 on CPUs
with native bf16) cannot be saved: the guards pickle a meta copy of every tensor the graph reads, and a packed one has
none; those engines keep `compile = on` (JIT) as their only compiled path.

`tandem cloud precompile` (same settings as `tandem cloud serve`) writes the artifact; a start with `compile = auto`
then finds it by a key of everything its graph depends on: tandem's engine code, torch, the CPU, the model's
shapes, and the engine's dtype, pool and buffers.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

import torch

from cloud_engine.compiled_decode import CompiledDecode, compile_cache_dir, decode_buckets
from cloud_engine.kv_quant import cache_row_width
from cloud_engine.cpu_features import fingerprint

logger = logging.getLogger("tandem.cloud")

ENGINE_SOURCES = Path(__file__).parent  # every .py and .cpp under it is in the key: a code change recompiles


def artifact_key(engine) -> str:
    """What the saved graph depends on, hashed: code, torch, CPU, model shapes, dtypes, the pool's block shape and the
    buffers CompiledDecode would make for `engine` (its guards check them again at load). Not the pool's number of
    blocks: by default it is a share of the memory free at start, which differs from one start to the next, so the
    graph takes it as a dynamic size."""
    code = hashlib.sha256()
    for path in sorted(ENGINE_SOURCES.rglob("*")):
        if path.suffix in (".py", ".cpp"):
            code.update(path.relative_to(ENGINE_SOURCES).as_posix().encode() + path.read_bytes())
    config, mc = engine.config, engine.model_config
    parts = [
        code.hexdigest(),
        torch.__version__,
        fingerprint(),
        repr(mc),
        str(engine.dtype),
        str(engine.kv_dtype),
        f"int8 weights {engine.int8_weights}",
        f"native attention {engine.attention_backend == 'cpu-kernel'}",
        f"pool blocks of {config.block_size} x {cache_row_width(mc.head_dim, engine.kv_dtype)}",
        f"rows {decode_buckets(config.max_sampled_rows)}",
        f"tables {-(-engine.max_model_len // config.block_size)}",
        str(engine.device),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def artifact_path(engine) -> Path:
    """Where `tandem cloud precompile` saves `engine`'s step and a start with compile = auto looks for it."""
    return compile_cache_dir() / "precompiled" / f"decode-{artifact_key(engine)}.bin"


def precompile(engine, compiled: CompiledDecode) -> tuple[Path, float]:
    """Compile `compiled`'s step ahead of time and save it where `compile = auto` looks; returns (path, seconds)."""
    started = time.perf_counter()
    with torch.inference_mode():
        args = compiled.prepare_precompiled_call()
        for arg in args[1:]:
            torch._dynamo.mark_dynamic(arg, 0)  # one graph for every bucket
        for layer in compiled.model.model.layers:
            for cache in layer.self_attn.kv_cache:
                torch._dynamo.mark_dynamic(cache, 0)  # and for every pool size
        function = torch.compile(CompiledDecode.step, fullgraph=True, dynamic=False).aot_compile((args, {}))
    path = artifact_path(engine)
    path.parent.mkdir(parents=True, exist_ok=True)
    function.save_compiled_function(str(path))
    return path, time.perf_counter() - started


def load_precompiled(engine, compiled: CompiledDecode) -> tuple[bool, str]:
    """Give `compiled` the saved step for this engine, if there is one whose guards hold; (loaded, why)."""
    path = artifact_path(engine)
    started = time.perf_counter()
    try:
        with path.open("rb") as file, torch.inference_mode():
            function = torch.compiler.load_compiled_function(file)
            args = compiled.prepare_precompiled_call()
            if not function.guard_check(*args):
                return False, f"the precompiled decode step at {path} does not fit this engine (its guards failed)"
            function(*args)  # inductor's first call loads its code: part of the start, not of the first request
    except Exception as error:  # a stale or foreign file must never stop the engine: it starts eager
        return False, f"the precompiled decode step at {path} could not be loaded ({type(error).__name__}: {error})"
    compiled.use_precompiled(function)
    return True, f"auto: decode steps precompiled ({path.name}, loaded in {time.perf_counter() - started:.1f} s)"
