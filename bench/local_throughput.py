"""Aggregate output tokens/s of tandem's local loop against llama.cpp, measured side by side.

    python -m bench.local_throughput --json bench/results/local_throughput.json [--quick]

For each concurrency c in 1, 4, 8, 16, c clients submit greedy requests (mixed prompt
and output lengths) back to back through `AsyncLocalEngine`; we report output
tokens/s over the wall time. Two references run in the same process:

* sequential: llama-cpp-python's high-level `Llama` answering the same requests one
  after another (what its own server does), via `Llama.generate` with top_k=1.
* ceiling: the same work through raw batched `llama_decode` with argmax and no
  scheduling: prompts prefilled c at a time, then decode as if every step carried a
  full batch of c (steady-state steps, scaled to the work's output tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time

import numpy as np

from bench.machine import report_header, write_report
from bench.penalty_compare import compare as compare_penalties
from local_runtime.async_engine import AsyncLocalEngine
from local_runtime.config import LocalEngineConfig
from local_runtime.llama_backend import LlamaBackend, LlamaBackendConfig
from sdk.engine_common.model_files import default_model_path
from sdk.protocol.engine import GenerationRequest, SamplingParams

CONCURRENCY_LEVELS = (1, 4, 8, 16)
WORDS = "the a river city model token light engine paper garden music window story number quiet".split()


def make_workload(
    num_requests: int, seed: int, engine_tokenize, output_range: tuple[int, int] = (64, 192)
) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) pairs, chat-like: prompts of 16-64 tokens, answers of 64-192.

    Prefill runs at only ~340 tokens/s on these 2-core CPUs (compute-bound), so the
    mix matters; this one matches an assistant answering short questions on a device.
    """
    rng = random.Random(seed)
    work = []
    for _ in range(num_requests):
        text = " ".join(rng.choice(WORDS) for _ in range(64))
        work.append((engine_tokenize(text)[: rng.randint(16, 64)], rng.randint(*output_range)))
    return work


async def run_tandem(
    engine: AsyncLocalEngine,
    work: list[tuple[list[int], int]],
    concurrency: int,
    sampling: dict | None = None,
    min_tokens: bool = False,
) -> dict:
    queue = list(enumerate(work))
    num_output = 0
    fields = sampling or {"temperature": 0.0}

    async def client() -> None:
        nonlocal num_output
        while queue:
            i, (prompt, max_tokens) = queue.pop(0)
            params = SamplingParams(
                max_tokens=max_tokens, ignore_eos=True, min_tokens=max_tokens if min_tokens else 0, **fields
            )
            async for event in engine.generate(GenerationRequest(f"bench-{concurrency}-{i}", prompt, params)):
                num_output += 1

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    return {
        "requests": len(work),
        "output_tokens": num_output,
        "seconds": elapsed,
        "output_tokens_per_s": num_output / elapsed,
    }


def run_sequential_llama(model_path: str, work: list[tuple[list[int], int]], n_ctx: int, threads: int) -> dict:
    from tests.local_runtime.reference_llama import load_reference_llama

    llama = load_reference_llama(model_path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads)
    num_output = 0
    start = time.perf_counter()
    for prompt, max_tokens in work:
        llama.reset()
        for n, _ in enumerate(llama.generate(prompt, top_k=1, temp=0.0, reset=True), start=1):
            if n == max_tokens:
                break
        num_output += max_tokens
    elapsed = time.perf_counter() - start
    llama.close()
    return {
        "requests": len(work),
        "output_tokens": num_output,
        "seconds": elapsed,
        "output_tokens_per_s": num_output / elapsed,
    }


def run_ceiling(model_path: str, work: list[tuple[list[int], int]], batch: int, config: LocalEngineConfig) -> dict:
    """The same work with no scheduler: prompts prefilled `batch` at a time, then full-batch argmax decode.

    Decode is timed over up to 128 steady-state steps and scaled to the steps the work
    needs (total output tokens / batch), as if every step ran the whole batch.
    """
    backend = LlamaBackend(
        LlamaBackendConfig(
            model_path=model_path,
            n_ctx=config.kv_cache_tokens,
            n_seq_max=max(batch, 2),
            n_batch=config.max_num_batched_tokens,
            n_threads=config.threads,
            flash_attn=config.flash_attn,
            batch_invariant=False,  # the raw ceiling: llama.cpp picks its fastest kernels
        )
    )
    start = time.perf_counter()
    last = []
    for group_start in range(0, len(work), batch):
        group = [prompt for prompt, _ in work[group_start : group_start + batch]]
        last = _prefill_group(backend, group)
        for slot in range(len(group)):
            if group_start + batch < len(work):
                backend.clear_slot(slot)
    prefill_s = time.perf_counter() - start

    group = (
        [prompt for prompt, _ in work[-batch:]]
        if len(work) >= batch
        else [work[i % len(work)][0] for i in range(batch)]
    )
    if len(last) < batch:
        for slot in range(batch):
            backend.clear_slot(slot)
        last = _prefill_group(backend, group)
    positions = np.array([len(p) for p in group], dtype=np.int32)
    slots = np.arange(batch, dtype=np.int32)
    want = np.ones(batch, dtype=np.int8)
    tokens = np.array(last, dtype=np.int32)
    num_output = sum(m for _, m in work)
    steps_needed = -(-num_output // batch)
    steps_timed = min(steps_needed, 128)
    start = time.perf_counter()
    for _ in range(steps_timed):
        logits = backend.decode(tokens, positions, slots, want)
        tokens = np.argmax(logits, axis=1).astype(np.int32)
        positions += 1
    decode_s = (time.perf_counter() - start) * steps_needed / steps_timed
    backend.close()
    seconds = prefill_s + decode_s
    return {
        "batch": batch,
        "output_tokens": num_output,
        "prefill_seconds": prefill_s,
        "decode_seconds": decode_s,
        "seconds": seconds,
        "output_tokens_per_s": num_output / seconds,
    }


def _prefill_group(backend: LlamaBackend, prompts: list[list[int]]) -> list[int]:
    """Prefill prompts into slots 0..n-1 in as few llama_decode calls as the batch size allows."""
    pieces = [(slot, pos, tok) for slot, prompt in enumerate(prompts) for pos, tok in enumerate(prompt)]
    last_token = {}
    n_batch = backend.config.n_batch
    for begin in range(0, len(pieces), n_batch):
        chunk = pieces[begin : begin + n_batch]
        want = np.array([1 if pos == len(prompts[slot]) - 1 else 0 for slot, pos, _ in chunk], dtype=np.int8)
        logits = backend.decode(
            np.array([t for _, _, t in chunk], np.int32),
            np.array([p for _, p, _ in chunk], np.int32),
            np.array([s for s, _, _ in chunk], np.int32),
            want,
        )
        for row, index in enumerate(np.flatnonzero(want)):
            last_token[chunk[index][0]] = int(np.argmax(logits[row]))
    return [last_token[slot] for slot in range(len(prompts))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--quick", action="store_true", help="fewer requests (finishes in under 3 minutes here)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="c=1 and c=8 only, 8-16 output tokens, one penalty repetition: checks the bench works",
    )
    parser.add_argument("--model", default=None, help="GGUF to measure; default: the embedded SmolLM2")
    args = parser.parse_args()

    requests_per_client = 1 if args.quick or args.smoke else 3
    levels = (1, 8) if args.smoke else CONCURRENCY_LEVELS  # the headline ratios need c=1 and c=8
    output_range = (8, 16) if args.smoke else (64, 192)
    model_path = args.model or default_model_path()
    config = LocalEngineConfig(model_path=args.model, max_num_seqs=16)

    engine = AsyncLocalEngine(config).start()
    engine.wait_ready()
    tokenize = engine.tokenize
    workloads = {
        c: make_workload(max(4, c * requests_per_client), seed=c, engine_tokenize=tokenize, output_range=output_range)
        for c in levels
    }

    results: dict = {"tandem": {}, "ceiling": {}}
    asyncio.run(run_tandem(engine, workloads[1][:1], 1))  # warm-up: page in weights, build graphs
    for c in levels:
        results["tandem"][f"c{c}"] = asyncio.run(run_tandem(engine, workloads[c], c))
        print(f"tandem c={c}: {results['tandem'][f'c{c}']['output_tokens_per_s']:.1f} tok/s", flush=True)
    penalties = compare_penalties(
        lambda sampling, min_tokens: asyncio.run(run_tandem(engine, workloads[8], 8, sampling, min_tokens))[
            "output_tokens_per_s"
        ],
        repeats=1 if args.smoke else 3,
    )
    print(
        f"penalties on/off at c=8: {penalties['ratio_median']:.3f} "
        f"(spread of off runs {penalties['off_run_spread']:.3f})",
        flush=True,
    )
    engine.shutdown()

    results["sequential"] = run_sequential_llama(model_path, workloads[8], n_ctx=1024, threads=config.threads)
    print(f"sequential Llama: {results['sequential']['output_tokens_per_s']:.1f} tok/s", flush=True)
    for c in levels:
        results["ceiling"][f"b{c}"] = run_ceiling(model_path, workloads[c], c, config)
        print(f"ceiling batch={c}: {results['ceiling'][f'b{c}']['output_tokens_per_s']:.1f} tok/s", flush=True)

    tps = {c: results["tandem"][f"c{c}"]["output_tokens_per_s"] for c in levels}
    seq = results["sequential"]["output_tokens_per_s"]
    report = {
        **report_header("local_throughput", smoke=args.smoke),
        "model": os.path.basename(model_path),
        "config": {
            "kv_cache_tokens": config.kv_cache_tokens,
            "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "threads": config.threads,
            "flash_attn": config.flash_attn,
            "batch_invariant": config.batch_invariant,
        },
        "workload": f"greedy, ignore_eos; prompts 16-64 tokens, outputs {output_range[0]}-{output_range[1]} tokens; "
        f"c clients back to back, {requests_per_client} request(s) each (at least 4 requests per level)",
        "baselines": {
            "sequential": "llama-cpp-python high-level Llama.generate, one request after another",
            "ceiling": "the same prompts and output tokens through raw batched llama_decode + argmax, "
            "no scheduler: prompts prefilled c at a time, then every decode step a full batch of c",
        },
        "results": results,
        "ratio_vs_sequential": {f"c{c}": tps[c] / seq for c in levels},
        "efficiency": {f"c{c}": tps[c] / results["ceiling"][f"b{c}"]["output_tokens_per_s"] for c in levels},
        "penalties_c8": penalties,
        "penalty_throughput_ratio_local_c8": penalties["ratio_median"],
        "ratio_vs_sequential_c8": tps[8] / seq,
        "efficiency_c8": tps[8] / results["ceiling"]["b8"]["output_tokens_per_s"],
        "single_stream_ratio": tps[1] / seq,
        "targets": {
            "efficiency_c8": 0.85,
            "ratio_vs_sequential_c8": 1.7,
            "single_stream_ratio": 0.9,
            "penalty_throughput_ratio_local_c8": 0.95,
        },
    }
    write_report(
        args.json,
        report,
        ("ratio_vs_sequential_c8", "efficiency_c8", "single_stream_ratio", "penalty_throughput_ratio_local_c8"),
    )


if __name__ == "__main__":
    main()
