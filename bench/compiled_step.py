"""Compiled vs eager decode steps of the cloud engine ([cloud] compile), timed in-process.

    python -m bench.compiled_step [--quick|--smoke] [--dtype auto|float32|bfloat16] \
        --json bench/results/compiled_step.json

One engine with compile = on serves both modes: each repetition times `steps` decode steps of the
same running batch through the compiled graph, then as many eager (the runner's compiled path
switched off), interleaved so drift on the machine hits both alike. A step here is the runner's
prepare + execute for every running sequence (one new token each, KV slots already allocated):
what the engine's decode-only step costs minus scheduling and sampling, which compile leaves alone.
HTTP benches see no step time (bench.serve's /metrics has none), hence in-process.

Verification steps the same way: each running sequence carries a draft of `verify_draft_tokens`
tokens and the step computes its last token and the draft (1 + k rows a sequence, every row
sampled), as when the engine verifies its own n-gram proposals or a device's drafts.

Keys: compiled_step_ratio_c{N} (compiled / eager, median of repetitions, with min and max),
compiled_step_ms_c{N}, eager_step_ms_c{N}, engine_start_s (this run's start, compile included:
cold or warm, as `compile_cache` says), and max_logit_diff_c{N} / argmax_agreement_c{N} between the
two modes on the same step (bf16 rounds differently when elementwise work is fused); for
verification steps the same keys named verify_step_ratio_c{N}, verify_compiled_ms_c{N},
verify_eager_ms_c{N}, verify_max_logit_diff_c{N}, verify_argmax_agreement_c{N}.

The roofline (issue 70): decode_bytes_c{N} is what a decode step of N sequences must read at least, from the
engine's own sizes: every linear weight once (the tied embedding as the LM head; norms left out: a few KB) and
the KV rows of every sequence's context in the pool's element type, scales included. read_bandwidth_gb_s is this
machine's streaming read measured in the same run (a sum over a 1 GiB buffer with the step's thread count, best
of 5), and roofline_fraction_c{N} = decode_bytes / (compiled step time x bandwidth) (roofline_fraction_eager_c{N}
for eager steps): 1.0 would be a step bound only by memory. --kv-cache-dtype int8 runs the engine on an 8-bit cache,
--weight-dtype int8 on 8-bit linear weights (cloud_engine.model.int8_linear).

Why a step sits below that roofline (issue 70 asks for the profile): matmul_gflops is this machine's arithmetic
rate measured in the same run (a square matmul of MATMUL_SIZE in the engine's dtype with the step's threads, best
of 5); step_flops_c{N} is a decode step's floating-point work (2 per linear weight element per sequence, plus the
attention's scores and weighted values over every context); arithmetic_fraction_c{N} = step_flops / (compiled step
time x matmul_gflops), near 1.0 for a step bound by arithmetic rather than memory; roofline_fraction_ceiling_c{N} =
(decode_bytes / bandwidth) / (step_flops / matmul_gflops), at most 1: the highest roofline fraction a step could
reach on this machine, where its arithmetic takes longer than reading its bytes. step_profile_c{N}, at the
largest batch, is torch.profiler's own time per compiled step of the ops the graph calls: linear_ms (matmuls,
int8 and packed linears), attention_ms (write-and-attend), other_ms (the rest of the wall time: inductor's fused
loops and the step's Python), the top ops, and the linears' own rate (linear_gflops) and weight read rate
(linear_read_gb_s).
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.machine import report_header, write_report

BATCHES = (1, 4, 8, 16, 32)
VERIFY_BATCHES = (1, 8, 32)
VERIFY_DRAFT_TOKENS = 4  # the device drafter's first draft (sdk.cascade.device_drafts.DEFAULT_DRAFT_TOKENS)
HEADLINE = (
    "compiled_step_ratio_c32",
    "compiled_step_ratio_c1",
    "verify_step_ratio_c32",
    "engine_start_s",
    "roofline_fraction_c32",
    "arithmetic_fraction_c32",
    "roofline_fraction_ceiling_c32",
)
BANDWIDTH_BUFFER_BYTES = 1 << 30  # well past any last-level cache
MATMUL_SIZE = 1024  # the compute roof's square matmul: 2 GFLOP, large enough for a CPU's best rate
TOP_OPS = 10  # ops listed by own time in a step's profile


def read_bandwidth_gb_s(repetitions: int = 5) -> float:
    """Streaming read rate of this machine: a float32 sum over BANDWIDTH_BUFFER_BYTES with torch's threads, best
    of `repetitions` (the first pass also faults the pages in, and is not counted)."""
    import torch

    buffer = torch.ones(BANDWIDTH_BUFFER_BYTES // 4, dtype=torch.float32)
    buffer.sum()
    best = float("inf")
    for _ in range(repetitions):
        started = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - started)
    return BANDWIDTH_BUFFER_BYTES / best / 1e9


def matmul_gflops(dtype, size: int = MATMUL_SIZE, repetitions: int = 5) -> float:
    """This machine's arithmetic rate: a square matmul of `size` in the engine's dtype with torch's threads, best of
    `repetitions` (the compute roof beside the bandwidth's)."""
    import torch

    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(repetitions):
        started = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best / 1e9


def step_linears(engine) -> list[tuple[int, int]]:
    """(elements, bytes) of every linear weight a decode step reads once: in the engine's dtype (packed or plain),
    int8 layers' values and scales, and the LM head (the tied embedding where no layer replaced it)."""
    from torch import nn

    from cloud_engine.model.int8_linear import Int8Linear
    from cloud_engine.model.packed_linear import PackedLinear

    model = engine.runner.model
    out = []
    for module in model.modules():
        if isinstance(module, Int8Linear):
            out.append((module.in_features * module.out_features, module.weight_bytes()))
        elif isinstance(module, PackedLinear):
            elements = module.in_features * module.out_features
            out.append((elements, elements * engine.dtype.itemsize))
        elif isinstance(module, nn.Linear):
            out.append((module.weight.numel(), module.weight.numel() * module.weight.element_size()))
    if getattr(model, "lm_head", None) is None and getattr(model, "head_linear", None) is None:
        elements = model.model.embed_tokens.weight.numel()
        out.append((elements, elements * engine.dtype.itemsize))
    return out


def weight_elements(engine) -> int:
    """Multiply-adds a decode step does per row in its linears and LM head (their weights' element count)."""
    return sum(elements for elements, _ in step_linears(engine))


def step_flops(engine, ids: list[str]) -> int:
    """Floating-point operations of a decode step: 2 per weight element per sequence, and the attention's two
    products (scores and the weighted sum of values) over each sequence's context in every layer."""
    config = engine.model_config
    per_token = 4 * config.num_attention_heads * config.head_dim * config.num_hidden_layers
    contexts = sum(engine.scheduler.requests[rid].num_computed_tokens + 1 for rid in ids)
    return 2 * len(ids) * weight_elements(engine) + per_token * contexts


def _is_linear_op(name: str) -> bool:
    return "linear" in name or name in ("aten::mm", "aten::addmm", "aten::_weight_int8pack_mm")


def _is_attention_op(name: str) -> bool:
    return "attend" in name or "attention" in name


def profile_step(runner, engine, ids: list[str], steps: int) -> dict:
    """Where the compiled step's time goes: torch.profiler over `steps` steps, each op's own time per step (ops the
    graph calls: matmuls and tandem's kernels; inductor's fused elementwise loops are not ops, so they fall in
    other_ms with the step's Python), summed into linear_ms (every matmul and int8/packed linear), attention_ms
    (write-and-attend) and other_ms (the rest of the step's wall time). Compiled steps only: an eager step calls the
    decode kernel outside torch's dispatcher, where the profiler does not see it."""
    from torch.profiler import ProfilerActivity, profile

    _time_steps(runner, engine, ids, 2, 0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step_s = _time_steps(runner, engine, ids, steps, 0)
    ops = {event.key: event.self_cpu_time_total / 1e3 / steps for event in prof.key_averages()}
    linear = sum(ms for name, ms in ops.items() if _is_linear_op(name))
    attention = sum(ms for name, ms in ops.items() if _is_attention_op(name))
    step_ms = step_s * 1e3
    top = sorted(ops.items(), key=lambda item: -item[1])[:TOP_OPS]
    return {
        "step_ms": round(step_ms, 2),
        "linear_ms": round(linear, 2),
        "attention_ms": round(attention, 2),
        "other_ms": round(step_ms - linear - attention, 2),
        "top_ops_ms": {name: round(ms, 3) for name, ms in top},
    }


def weight_bytes(engine) -> int:
    """Bytes of every linear weight a decode step reads once (step_linears)."""
    return sum(size for _, size in step_linears(engine))


def kv_bytes(engine, ids: list[str]) -> int:
    """Bytes of the KV rows the step's sequences attend over, in the pool's element type (scales included)."""
    per_token = engine.kv_block_bytes // engine.config.block_size
    return sum((engine.scheduler.requests[rid].num_computed_tokens + 1) * per_token for rid in ids)


def _start_decoding(engine, count: int, prompt_len: int, draft_tokens: int = 0) -> list[str]:
    from sdk.protocol.engine import GenerationRequest, SamplingParams

    ids = [f"c{count}-{i}" for i in range(count)]
    for i, rid in enumerate(ids):
        prompt = [(7 * i + 13 * j) % 2000 + 100 for j in range(prompt_len + 3 * i)]
        # ignore_eos: made-up ids may be answered with an end of text (Gemma-3-270M did), ending the request.
        # As many tokens as the context allows, at most 1000: the steps timed only need the request not to finish.
        params = SamplingParams(
            max_tokens=min(1000, engine.max_model_len - len(prompt)), temperature=0.0, ignore_eos=True
        )
        engine.add_request(GenerationRequest(rid, prompt, params))
    while any(engine.scheduler.requests[rid].num_output_tokens == 0 for rid in ids):
        engine.step()
    for rid in ids:
        if engine.kv_manager.allocate_slots(engine.scheduler.requests[rid], 1 + draft_tokens) is None:
            raise RuntimeError("no KV room for the decode batch")
    return ids


def _step(runner, engine, ids: list[str], draft_tokens: int):
    """One step's prepare: every sequence's next token, and a draft of `draft_tokens` after it (its ids made up:
    what a step costs does not depend on them)."""
    drafts = {rid: [(5 * i + 11 * j) % 2000 + 100 for j in range(draft_tokens)] for i, rid in enumerate(ids)}
    return runner.prepare(
        {rid: 1 + draft_tokens for rid in ids},
        engine.scheduler.requests,
        engine.kv_manager.get_block_ids,
        drafts if draft_tokens else None,
    )


def _time_steps(runner, engine, ids: list[str], steps: int, draft_tokens: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        runner.execute(_step(runner, engine, ids, draft_tokens))
    return (time.perf_counter() - started) / steps


def _compare(runner, engine, ids: list[str], steps: int, repetitions: int, draft_tokens: int) -> dict:
    """Compiled against eager on the same staged step: ratios of their times, and how far their logits differ."""
    compiled = runner.compiled_decode
    batch = _step(runner, engine, ids, draft_tokens)
    if not batch.compiled_bucket:
        raise RuntimeError(f"the step of {len(ids)} sequences with {draft_tokens}-token drafts did not compile")
    compiled_logits = runner.execute(batch).clone()
    runner.compiled_decode = None
    eager_logits = runner.execute(_step(runner, engine, ids, draft_tokens))
    ratios, compiled_ms, eager_ms = [], [], []
    for _ in range(repetitions):
        runner.compiled_decode = compiled
        _time_steps(runner, engine, ids, 2, draft_tokens)  # back in this mode's caches
        c = _time_steps(runner, engine, ids, steps, draft_tokens)
        runner.compiled_decode = None
        _time_steps(runner, engine, ids, 2, draft_tokens)
        e = _time_steps(runner, engine, ids, steps, draft_tokens)
        ratios.append(c / e)
        compiled_ms.append(c * 1000)
        eager_ms.append(e * 1000)
    runner.compiled_decode = compiled
    return {
        "ratio": round(statistics.median(ratios), 3),
        "ratio_spread": [round(min(ratios), 3), round(max(ratios), 3)],
        "compiled_ms": round(statistics.median(compiled_ms), 2),
        "eager_ms": round(statistics.median(eager_ms), 2),
        "max_logit_diff": float((compiled_logits - eager_logits).abs().max()),
        "argmax_agreement": float((compiled_logits.argmax(-1) == eager_logits.argmax(-1)).float().mean()),
    }


# The keys each comparison's figures are reported under: decode steps keep the names they had before
# verification steps were measured.
DECODE_KEYS = {
    "ratio": "compiled_step_ratio_c{n}",
    "ratio_spread": "compiled_step_ratio_c{n}_spread",
    "compiled_ms": "compiled_step_ms_c{n}",
    "eager_ms": "eager_step_ms_c{n}",
    "max_logit_diff": "max_logit_diff_c{n}",
    "argmax_agreement": "argmax_agreement_c{n}",
}
VERIFY_KEYS = {
    "ratio": "verify_step_ratio_c{n}",
    "ratio_spread": "verify_step_ratio_c{n}_spread",
    "compiled_ms": "verify_compiled_ms_c{n}",
    "eager_ms": "verify_eager_ms_c{n}",
    "max_logit_diff": "verify_max_logit_diff_c{n}",
    "argmax_agreement": "verify_argmax_agreement_c{n}",
}


def measure(
    dtype: str,
    batches: tuple[int, ...],
    steps: int,
    repetitions: int,
    prompt_len: int,
    model: str | None = None,
    verify_batches: tuple[int, ...] = (),
    draft_tokens: int = VERIFY_DRAFT_TOKENS,
    kv_cache_dtype: str = "auto",
    weight_dtype: str = "auto",
) -> dict:
    """`model`: a GGUF or HF directory (None: the embedded default)."""
    import torch

    from cloud_engine.compiled_decode import compile_cache_dir
    from cloud_engine.llm import LLM

    cache_was_there = compile_cache_dir().exists()
    started = time.perf_counter()
    max_seqs = max((*batches, *verify_batches))
    llm = LLM(
        model,
        dtype=dtype,
        compile="on",
        max_num_seqs=max_seqs,
        max_num_batched_tokens=512,
        kv_cache_gb=0.5,
        kv_cache_dtype=kv_cache_dtype,
        weight_dtype=weight_dtype,
    )
    out: dict = {
        "engine_start_s": round(time.perf_counter() - started, 2),
        "compile_cache": "warm" if cache_was_there else "cold",
        "dtype": str(llm.engine.dtype).removeprefix("torch."),
        "kv_cache_dtype": str(llm.engine.kv_dtype).removeprefix("torch."),
        "weight_dtype": "int8" if llm.engine.int8_weights else "auto",
        "attention_backend": llm.engine.attention_backend,
        "threads": torch.get_num_threads(),
        "read_bandwidth_gb_s": round(read_bandwidth_gb_s(), 2),
        "matmul_gflops": round(matmul_gflops(llm.engine.dtype), 1),
        "weight_bytes": weight_bytes(llm.engine),
    }
    if verify_batches:
        out["verify_draft_tokens"] = draft_tokens
    engine, runner = llm.engine, llm.engine.runner
    for kind, kind_batches, kind_draft, keys in (
        ("decode", batches, 0, DECODE_KEYS),
        ("verify", verify_batches, draft_tokens, VERIFY_KEYS),
    ):
        for count in kind_batches:
            ids = _start_decoding(engine, count, prompt_len, kind_draft)
            figures = _compare(runner, engine, ids, steps, repetitions, kind_draft)
            out.update({keys[name].format(n=count): value for name, value in figures.items()})
            if kind == "decode":
                step_bytes = out["weight_bytes"] + kv_bytes(engine, ids)
                bandwidth = out["read_bandwidth_gb_s"] * 1e9
                out[f"decode_bytes_c{count}"] = step_bytes
                out[f"roofline_fraction_c{count}"] = round(step_bytes / (figures["compiled_ms"] / 1e3 * bandwidth), 3)
                out[f"roofline_fraction_eager_c{count}"] = round(
                    step_bytes / (figures["eager_ms"] / 1e3 * bandwidth), 3
                )
                flops = step_flops(engine, ids)
                out[f"step_flops_c{count}"] = flops
                out[f"arithmetic_fraction_c{count}"] = round(
                    flops / (figures["compiled_ms"] / 1e3 * out["matmul_gflops"] * 1e9), 3
                )
                # The most roofline_fraction any kernel could reach here: a step cannot finish before its arithmetic
                # at the machine's matmul rate, so it reads its bytes in that time at best.
                memory_s, arithmetic_s = step_bytes / bandwidth, flops / (out["matmul_gflops"] * 1e9)
                out[f"roofline_fraction_ceiling_c{count}"] = round(min(1.0, memory_s / arithmetic_s), 3)
                if count == max(batches):
                    out[f"step_profile_c{count}"] = profile = profile_step(runner, engine, ids, steps)
                    linear_s = profile["linear_ms"] / 1e3
                    profile["linear_gflops"] = round(2 * count * weight_elements(engine) / linear_s / 1e9, 1)
                    profile["linear_read_gb_s"] = round(out["weight_bytes"] / linear_s / 1e9, 2)
            engine.abort_all()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--quick", action="store_true", help="3 repetitions of 10 steps (about 2 minutes here)")
    parser.add_argument("--smoke", action="store_true", help="only checks that the bench runs (tiny sizes)")
    parser.add_argument("--dtype", default="auto", help="auto (the engine's serving default), float32, bfloat16")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "int8"), help="the KV pool's element type")
    parser.add_argument("--weight-dtype", default="auto", choices=("auto", "int8"), help="the linear weights' type")
    args = parser.parse_args()
    if args.smoke:
        batches, verify_batches, steps, repetitions = (1, 4), (2,), 2, 1
    elif args.quick:
        batches, verify_batches, steps, repetitions = BATCHES, VERIFY_BATCHES, 10, 3
    else:
        batches, verify_batches, steps, repetitions = BATCHES, VERIFY_BATCHES, 20, 5
    report = report_header("compiled_step", smoke=args.smoke)
    report.update(steps_per_repetition=steps, repetitions=repetitions, prompt_tokens=100)
    report.update(
        measure(
            args.dtype,
            batches,
            steps,
            repetitions,
            prompt_len=100,
            verify_batches=verify_batches,
            kv_cache_dtype=args.kv_cache_dtype,
            weight_dtype=args.weight_dtype,
        )
    )
    write_report(args.json, report, tuple(k for k in HEADLINE if k in report))


if __name__ == "__main__":
    main()
