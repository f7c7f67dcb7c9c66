"""Whether an engine's prompts prefill through a 16-bit copy of the weights, and which: decided by measuring.

`prefill_weights = "auto"` (the default) decides on the first use of a model on a machine. One
fixed prompt of PROBE_TOKENS tokens is timed through three paths, each the way the engine runs it,
interleaved over ROUNDS rounds after one warm-up of each (which pages the weights in):
  own    the prompt on the model's own weights (one llama_decode, the last token's logits);
  bf16   all but the prompt's last token in a context over a BF16 copy, their cells moved to a context
         on the model's own weights, the last token decoded there (local_runtime.prefill_context);
  f16    the same through an F16 copy.
The faster copy is taken when its median takes at most MARGIN of the own path's and its whole cost,
the copy's weights and its context's KV pool, fits 1/MEMORY_SHARE of the memory this process may use
(physical memory, or its cgroup's limit where lower). Otherwise prompts prefill on the model's own
weights. What was measured (times, the copies' bytes, the KV bytes a cell) is cached as JSON beside
the copies, keyed by the model file, the CPU (model name and flags), llama.cpp's build and the thread
count; a copy that cannot win is deleted. Remove the JSON file to measure again.

Every failure on the way under `auto` (a conversion, a cached copy that does not load, a context that
cannot be made) leaves the engine on its own weights with one warning; an explicit "bf16"/"f16" that
fails is an error.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from local_runtime.config import LocalEngineConfig
from local_runtime.llama_backend import LlamaBackend, LlamaBackendConfig
from local_runtime.prefill_context import PrefillContext, PromptChunk
from local_runtime.prefill_weights import (
    COPY_KINDS,
    UNQUANTIZED_FILE_TYPES,
    cache_dir,
    cached_copy,
    cpu_signature,
    discard_copy,
    memory_limit_bytes,
    model_key,
    prefill_copy_path,
)

logger = logging.getLogger("tandem.local")

PROBE_TOKENS = 128  # a short chat prompt; bench.local_prefill's prompt length
ROUNDS = 3
WARM_UP_TOKENS = 8
# A copy must prefill in at most this share of the own weights' time (1.25x faster): it costs memory
# and a conversion on first start, and a gain inside the timing noise of a busy machine is no gain.
MARGIN = 0.8
MEMORY_SHARE = 8  # the copy and its KV pool may take at most 1/8 of the memory the process may use
FORMAT_VERSION = 1
_PROBE_TEXT = (
    "The city council met on Tuesday to discuss the new bus routes, the repairs to the old bridge "
    "over the river, and a proposal to plant trees along the main street. Residents asked questions "
    "about noise, parking and the cost of each project, and the council promised answers next month. "
)


@dataclass(frozen=True)
class PrefillMeasurement:
    """What one machine measured for one model: the median milliseconds of each path, and sizes."""

    timings_ms: dict[str, float]  # "own", "bf16", "f16"
    copy_bytes: dict[str, int]  # each copy's file
    kv_bytes_per_cell: int  # of the model's KV cache (the copy's context has the same)
    probe_tokens: int
    rounds: int
    threads: int
    measured_at: str

    @property
    def fastest_copy(self) -> str:
        return min(COPY_KINDS, key=lambda kind: self.timings_ms[kind])


@dataclass(frozen=True)
class PrefillChoice:
    """The copy an engine prefills through (None: its own weights), and why."""

    kind: str | None
    reason: str


def decide(measured: PrefillMeasurement, n_cells: int, memory_limit: int | None) -> PrefillChoice:
    """`auto`'s rule over a measurement, for a copy context of `n_cells` KV cells."""
    own = measured.timings_ms["own"]
    kind = measured.fastest_copy
    ratio = measured.timings_ms[kind] / own
    figures = f"{measured.probe_tokens}-token prompt: own weights {own:.0f} ms, " + ", ".join(
        f"{k} copy {measured.timings_ms[k]:.0f} ms" for k in COPY_KINDS
    )
    if ratio > MARGIN:
        return PrefillChoice(None, f"no copy prefills in <= {MARGIN}x the own weights' time ({figures})")
    cost = measured.copy_bytes[kind] + n_cells * measured.kv_bytes_per_cell
    if memory_limit is not None and cost * MEMORY_SHARE > memory_limit:
        return PrefillChoice(
            None,
            f"the {kind} copy would prefill in {ratio:.2f}x the time but cost {cost >> 20} MiB (weights + KV pool), "
            f"more than 1/{MEMORY_SHARE} of the {memory_limit >> 20} MiB this process may use",
        )
    bound = "no memory limit read" if memory_limit is None else f"1/{MEMORY_SHARE} of {memory_limit >> 20} MiB"
    return PrefillChoice(kind, f"{ratio:.2f}x the own weights' time ({figures}); {cost >> 20} MiB, within {bound}")


def open_prefill_context(
    main: LlamaBackend, config: LocalEngineConfig, model_path: str, max_model_len: int
) -> tuple[PrefillContext | None, PrefillChoice]:
    """The prefill context `config.prefill_weights` asks for on this model and machine, and why.

    Between steps it is empty; within one it holds that step's prompt chunks and their prefixes (the
    engine sends chunks only while they fit), so one whole prompt always fits."""
    n_cells = max_model_len + config.max_num_batched_tokens
    setting = config.prefill_weights
    if not config.may_prefill_on_copy:
        return None, PrefillChoice(
            None, f"prefill_weights={setting}" if setting == "off" else "batch_invariant or GPU layers"
        )
    if main.metadata("general.file_type") in UNQUANTIZED_FILE_TYPES:
        return None, PrefillChoice(None, "the model's weights are 16 or 32 bits already")
    if not main.memory_is_one_kv_cache:
        if setting != "auto":
            raise ValueError(
                f"prefill_weights={setting!r} needs a model with one plain KV cache; {model_path} has "
                'recurrent state or sliding-window attention (set prefill_weights = "off")'
            )
        return None, PrefillChoice(None, "the model has recurrent state or sliding-window attention")
    if setting != "auto":  # asked for: its failures are the caller's errors
        return PrefillContext(main, prefill_copy_path(model_path, setting), n_cells, setting), PrefillChoice(
            setting, "asked for"
        )
    try:
        choice = decide(measurement(model_path, main.config.n_threads), n_cells, memory_limit_bytes())
    except Exception as exc:  # a conversion or a measurement that failed: the model's own weights serve
        logger.warning("prefilling on the model's own weights: measuring the prefill copies failed (%s)", exc)
        return None, PrefillChoice(None, f"measuring the copies failed: {exc}")
    if choice.kind is None:
        return None, choice
    path = None
    try:
        path = prefill_copy_path(model_path, choice.kind)
        return PrefillContext(main, path, n_cells, choice.kind), choice
    except Exception as exc:
        if path is not None:
            discard_copy(path)  # the next start converts it again
        logger.warning("prefilling on the model's own weights: the %s copy did not load (%s)", choice.kind, exc)
        return None, PrefillChoice(None, f"the {choice.kind} copy did not load: {exc}")


def measurement(model_path: str, threads: int) -> PrefillMeasurement:
    """This machine's measurement for the model: cached, or made now (a few seconds at 135M)."""
    path = _measurement_path(model_path, threads)
    try:
        return PrefillMeasurement(**json.loads(path.read_text())["measurement"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or unreadable: measure
    logger.info("timing prompt prefill through the model's own weights and 16-bit copies (once per model and machine)")
    measured = measure(model_path, threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "format_version": FORMAT_VERSION,
        "key": _key_fields(model_path, threads),
        "measurement": asdict(measured),
    }
    fd, partial = tempfile.mkstemp(prefix=path.name, suffix=".partial", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(partial, path)
    winner = (
        measured.fastest_copy
        if measured.timings_ms[measured.fastest_copy] <= MARGIN * measured.timings_ms["own"]
        else None
    )
    for kind in COPY_KINDS:
        if kind != winner:  # the copies are the same size, so only the faster one can ever be taken
            discard_copy(str(cached_copy(model_path, kind)))
    return measured


def measure(model_path: str, threads: int, rounds: int = ROUNDS) -> PrefillMeasurement:
    """Time the own path and each copy's path on PROBE_TOKENS tokens (see the module docstring)."""
    copies = {kind: prefill_copy_path(model_path, kind) for kind in COPY_KINDS}
    config = LlamaBackendConfig(
        model_path, n_ctx=2 * PROBE_TOKENS, n_seq_max=1, n_batch=PROBE_TOKENS, n_threads=threads, scratch_sequence=True
    )
    own = LlamaBackend(config)
    contexts: dict[str, PrefillContext] = {}
    try:
        for kind, path in copies.items():
            contexts[kind] = PrefillContext(own, path, PROBE_TOKENS, kind)
        tokens = _probe_tokens(own)
        runs = {"own": lambda probe=tokens: _prefill_own(own, probe)}
        for kind, context in contexts.items():
            runs[kind] = lambda probe=tokens, context=context: _prefill_through(own, context, probe)
        for run in runs.values():
            run(tokens[:WARM_UP_TOKENS])  # the first pass over a file pages its weights in: not timed
        samples: dict[str, list[float]] = {name: [] for name in runs}
        names = list(runs)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:  # each path first in turn
                started = time.perf_counter()
                runs[name](tokens)
                samples[name].append((time.perf_counter() - started) * 1000)
        kv_bytes_per_cell = -(-len(own.read_sequence(0)) // len(tokens))  # every path leaves the prompt's cells there
    finally:
        for context in contexts.values():
            context.close()
        own.close()
    return PrefillMeasurement(
        timings_ms={name: round(statistics.median(values), 2) for name, values in samples.items()},
        copy_bytes={kind: os.path.getsize(path) for kind, path in copies.items()},
        kv_bytes_per_cell=kv_bytes_per_cell,
        probe_tokens=len(tokens),
        rounds=rounds,
        threads=threads,
        measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )


def _probe_tokens(backend: LlamaBackend) -> np.ndarray:
    ids = backend.tokenize(_PROBE_TEXT, add_special=False, parse_special=False)
    return np.resize(np.asarray(ids, dtype=np.int32), PROBE_TOKENS)


def _prefill_own(own: LlamaBackend, tokens: np.ndarray) -> None:
    n = len(tokens)
    want = np.zeros(n, dtype=np.int8)
    want[-1] = 1
    own.clear_all()
    own.decode(tokens, np.arange(n, dtype=np.int32), np.zeros(n, dtype=np.int32), want)


def _prefill_through(own: LlamaBackend, context: PrefillContext, tokens: np.ndarray) -> None:
    n = len(tokens)
    own.clear_all()
    context.prefill([PromptChunk(0, 0, tokens[:-1])])
    own.decode(tokens[-1:], np.array([n - 1], dtype=np.int32), np.zeros(1, dtype=np.int32), np.ones(1, dtype=np.int8))


def _key_fields(model_path: str, threads: int) -> dict:
    import llama_cpp

    return {
        "model": model_key(model_path),
        "cpu": cpu_signature(),
        "llama_cpp": llama_cpp.__version__,
        "ggml_features": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "threads": threads,
        "probe_tokens": PROBE_TOKENS,
        "format_version": FORMAT_VERSION,
    }


def _measurement_path(model_path: str, threads: int) -> Path:
    digest = hashlib.sha256(json.dumps(_key_fields(model_path, threads), sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"{Path(model_path).stem}.{digest}.prefill-timing.json"
