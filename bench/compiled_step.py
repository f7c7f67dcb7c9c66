"""Compiled vs eager decode steps of the cloud engine ([cloud] compile), timed in-process.

    python -m bench.compiled_step [--quick|--smoke] [--dtype auto|float32|bfloat16] \
        --json bench/results/compiled_step.json

One engine with compile = on serves both modes: each repetition times `steps` decode steps of the
same running batch through the compiled graph, then as many eager (the runner's compiled path
switched off), interleaved so drift on the machine hits both alike. A step here is the runner's
prepare + execute for every running sequence (one new token each, KV slots already allocated):
what the engine's decode-only step costs minus scheduling and sampling, which compile leaves alone.
HTTP benches see no step time (bench.serve's /metrics has none), hence in-process.

Keys: compiled_step_ratio_c{N} (compiled / eager, median of repetitions, with min and max),
compiled_step_ms_c{N}, eager_step_ms_c{N}, engine_start_s (this run's start, compile included:
cold or warm, as `compile_cache` says), and max_logit_diff_c{N} / argmax_agreement_c{N} between the
two modes on the same step (bf16 rounds differently when elementwise work is fused).
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.machine import report_header, write_report

BATCHES = (1, 4, 8, 16, 32)
HEADLINE = ("compiled_step_ratio_c32", "compiled_step_ratio_c1", "engine_start_s")


def _start_decoding(engine, count: int, prompt_len: int) -> list[str]:
    from sdk.protocol.engine import GenerationRequest, SamplingParams

    ids = [f"c{count}-{i}" for i in range(count)]
    for i, rid in enumerate(ids):
        prompt = [(7 * i + 13 * j) % 2000 + 100 for j in range(prompt_len + 3 * i)]
        engine.add_request(GenerationRequest(rid, prompt, SamplingParams(max_tokens=1000, temperature=0.0)))
    while any(engine.scheduler.requests[rid].num_output_tokens == 0 for rid in ids):
        engine.step()
    for rid in ids:
        if engine.kv_manager.allocate_slots(engine.scheduler.requests[rid], 1) is None:
            raise RuntimeError("no KV room for the decode batch")
    return ids


def _time_steps(runner, engine, ids: list[str], steps: int) -> float:
    scheduled = dict.fromkeys(ids, 1)
    requests, blocks = engine.scheduler.requests, engine.kv_manager.get_block_ids
    started = time.perf_counter()
    for _ in range(steps):
        runner.execute(runner.prepare(scheduled, requests, blocks))
    return (time.perf_counter() - started) / steps


def measure(
    dtype: str, batches: tuple[int, ...], steps: int, repetitions: int, prompt_len: int, model: str | None = None
) -> dict:
    """`model`: a GGUF or HF directory (None: the embedded default)."""
    from cloud_engine.compiled_decode import compile_cache_dir
    from cloud_engine.llm import LLM

    cache_was_there = compile_cache_dir().exists()
    started = time.perf_counter()
    llm = LLM(model, dtype=dtype, compile="on", max_num_seqs=max(batches), max_num_batched_tokens=512, kv_cache_gb=0.5)
    out: dict = {
        "engine_start_s": round(time.perf_counter() - started, 2),
        "compile_cache": "warm" if cache_was_there else "cold",
        "dtype": str(llm.engine.dtype).removeprefix("torch."),
        "attention_backend": llm.engine.attention_backend,
    }
    engine, runner = llm.engine, llm.engine.runner
    compiled = runner.compiled_decode
    for count in batches:
        ids = _start_decoding(engine, count, prompt_len)
        batch = runner.prepare(dict.fromkeys(ids, 1), engine.scheduler.requests, engine.kv_manager.get_block_ids)
        compiled_logits = runner.execute(batch).clone()
        runner.compiled_decode = None
        eager_logits = runner.execute(
            runner.prepare(dict.fromkeys(ids, 1), engine.scheduler.requests, engine.kv_manager.get_block_ids)
        )
        runner.compiled_decode = compiled
        ratios, compiled_ms, eager_ms = [], [], []
        for _ in range(repetitions):
            runner.compiled_decode = compiled
            _time_steps(runner, engine, ids, 2)  # back in this mode's caches
            c = _time_steps(runner, engine, ids, steps)
            runner.compiled_decode = None
            _time_steps(runner, engine, ids, 2)
            e = _time_steps(runner, engine, ids, steps)
            ratios.append(c / e)
            compiled_ms.append(c * 1000)
            eager_ms.append(e * 1000)
        runner.compiled_decode = compiled
        out[f"compiled_step_ratio_c{count}"] = round(statistics.median(ratios), 3)
        out[f"compiled_step_ratio_c{count}_spread"] = [round(min(ratios), 3), round(max(ratios), 3)]
        out[f"compiled_step_ms_c{count}"] = round(statistics.median(compiled_ms), 2)
        out[f"eager_step_ms_c{count}"] = round(statistics.median(eager_ms), 2)
        out[f"max_logit_diff_c{count}"] = float((compiled_logits - eager_logits).abs().max())
        out[f"argmax_agreement_c{count}"] = float(
            (compiled_logits.argmax(-1) == eager_logits.argmax(-1)).float().mean()
        )
        engine.abort_all()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--quick", action="store_true", help="3 repetitions of 10 steps (about 2 minutes here)")
    parser.add_argument("--smoke", action="store_true", help="only checks that the bench runs (tiny sizes)")
    parser.add_argument("--dtype", default="auto", help="auto (the engine's serving default), float32, bfloat16")
    args = parser.parse_args()
    if args.smoke:
        batches, steps, repetitions = (1, 4), 2, 1
    elif args.quick:
        batches, steps, repetitions = BATCHES, 10, 3
    else:
        batches, steps, repetitions = BATCHES, 20, 5
    report = report_header("compiled_step", smoke=args.smoke)
    report.update(steps_per_repetition=steps, repetitions=repetitions, prompt_tokens=100)
    report.update(measure(args.dtype, batches, steps, repetitions, prompt_len=100))
    write_report(args.json, report, tuple(k for k in HEADLINE if k in report))


if __name__ == "__main__":
    main()
