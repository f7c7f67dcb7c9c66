"""Speculative decoding in tandem's cloud engine: n-gram lookup and a layer-skip draft model
against speculation off, at batch 1 and at 32 concurrent requests.

    python -m bench.spec_decode --json bench/results/spec_decode.json [--quick | --smoke]

Two workloads, chat-templated, greedy (temperature 0), EOS honoured:

* grounded: "repeat / fix the typos in / extract from / rewrite the numbers of this passage"
  where each passage is a GSM8K test problem with its worked solution (calculator
  annotations removed), 150-260 tokens, so the answer copies long runs of its prompt: the
  case prompt lookup (n-gram) is for;
* open-ended: MT-Bench first-turn questions (writing, reasoning, coding, ...): little to copy.

Proposers: off; ngram (prompt lookup); draft (the embedded SmolLM2 GGUF truncated to its
first 8 of 30 layers: no smaller model shares SmolLM2's tokenizer). Both at the engine's
defaults: k = 8 and the adaptive policy (no drafting above 4 decoding requests; a request
whose drafts keep under 0.5 accepted tokens, smoothed, drafts one probe token every 8 steps).
Every proposer has its own engine, all loaded
at once, and each prompt runs through them in turn so that load on the machine hits them
alike.

Batch 1: each prompt alone. Decode tokens/s = (output tokens - 1) / (time from the first
output token to the last): the first token comes from the prefill step, which speculation
does not change. End-to-end tokens/s (prompt submitted to last token) is reported beside
it. Acceptance rate = accepted / drafted tokens; mean acceptance length = 1 + accepted /
drafts (tokens per verification step that carried a draft), as vLLM defines them.
`outputs_identical_to_off`: the greedy token ids equal speculation off's for every prompt.

Batch 32: 32 requests (half grounded, half open-ended) submitted at once, max_num_seqs 32;
output tokens/s over the wall time of the whole batch, adaptive speculation against off
(`throughput_ratio_b32_adaptive` is n-gram's). With --full runs also n-gram with the
adaptive policy off, to show what the policy protects against.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import torch

from bench.machine import machine_info, write_report
from cloud_engine.llm import LLM
from cloud_engine.spec_decode import SpeculativeConfig
from cloud_engine.spec_decode.stats import SpecDecodeStats
from sdk.engine_common.model_files import default_model_path
from sdk.protocol.engine import GenerationRequest, SamplingParams

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data", "routellm")
GSM8K = os.path.join(DATA_DIR, "gsm8k_test.jsonl")
MT_BENCH = os.path.join(DATA_DIR, "mt_bench_questions.jsonl")
DRAFT_LAYERS = 8
BATCH = 32
GROUNDED_TEMPLATES = {
    "repeat": "Repeat the following passage exactly, word for word.\n\n{passage}",
    "fix_typos": "Copy this text, fixing any typos:\n\n{passage}",
    "extract": "Here is a math problem and its solution.\n\n{passage}\n\nCopy out the solution part, word for word.",
    "edit_numbers": "Rewrite the following passage with every number written in words instead of digits.\n\n{passage}",
}
PASSAGE_TOKENS = (150, 260)


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def grounded_conversations(count: int, tokenize) -> list[list[dict]]:
    """GSM8K problem + solution passages of PASSAGE_TOKENS tokens, in file order, templates in turn."""
    conversations, names = [], list(GROUNDED_TEMPLATES)
    for row in read_jsonl(GSM8K):
        solution = re.sub(r"<<[^>]*>>", "", row["answer"]).replace("#### ", "The answer is ")
        passage = row["question"].strip() + "\n" + solution.strip()
        if PASSAGE_TOKENS[0] <= len(tokenize(passage)) <= PASSAGE_TOKENS[1]:
            template = GROUNDED_TEMPLATES[names[len(conversations) % len(names)]]
            conversations.append([{"role": "user", "content": template.format(passage=passage)}])
            if len(conversations) == count:
                return conversations
    raise ValueError(f"only {len(conversations)} GSM8K passages of {PASSAGE_TOKENS} tokens, {count} wanted")


def open_conversations(count: int) -> list[list[dict]]:
    """MT-Bench first turns, spread over the categories (every 80/count-th question)."""
    rows = read_jsonl(MT_BENCH)
    stride = max(1, len(rows) // count)
    return [[{"role": "user", "content": row["turns"][0]}] for row in rows[::stride][:count]]


def run_requests(llm: LLM, prompts: list[list[int]], max_tokens: int, tag: str) -> list[dict]:
    """Submit all prompts at once and step the engine to the end; per request its tokens and times."""
    engine = llm.engine
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    start = time.perf_counter()
    for rid, prompt in zip(ids, prompts):
        engine.add_request(GenerationRequest(rid, prompt, params))
    tokens = {rid: [] for rid in ids}
    times = {rid: [] for rid in ids}
    while engine.has_unfinished_requests():
        events = engine.step()
        now = time.perf_counter()
        for event in events:
            tokens[event.request_id].append(event.token_id)
            times[event.request_id].append(now)
    return [{"token_ids": tokens[rid], "start": start, "first": times[rid][0], "last": times[rid][-1]} for rid in ids]


def batch1(
    engines: dict[str, LLM], prompts: list[list[int]], max_tokens: int, tag: str, off: dict | None = None
) -> dict:
    """Each prompt alone through every engine in turn; per engine decode speed, spec stats, outputs
    (token ids under "_token_ids"). `off`: speculation off's result on the same prompts, when
    the engines do not include it."""
    stats = {name: SpecDecodeStats() for name in engines}
    runs = {name: [] for name in engines}
    for index, prompt in enumerate(prompts):
        for name, llm in engines.items():
            llm.engine.speculator.stats = stats[name]  # the engine records into it (a fresh counter per workload)
            runs[name].append(run_requests(llm, [prompt], max_tokens, f"{tag}-{name}-{index}")[0])
    results = {}
    for name, rs in runs.items():
        decode_tokens = sum(len(r["token_ids"]) - 1 for r in rs)
        decode_s = sum(r["last"] - r["first"] for r in rs)
        total_tokens = sum(len(r["token_ids"]) for r in rs)
        total_s = sum(r["last"] - r["start"] for r in rs)
        s = stats[name]
        results[name] = {
            "num_prompts": len(rs),
            "output_tokens": total_tokens,
            "mean_output_tokens": total_tokens / len(rs),
            "decode_seconds": decode_s,
            "decode_tokens_per_s": decode_tokens / decode_s if decode_s > 0 else 0.0,
            "end_to_end_tokens_per_s": total_tokens / total_s,
            "num_drafts": s.num_drafts,
            "num_draft_tokens": s.num_draft_tokens,
            "num_accepted_tokens": s.num_accepted_tokens,
            "accepted_per_position": list(s.accepted_per_position),
            "acceptance_rate": s.acceptance_rate,
            "mean_acceptance_length": s.mean_acceptance_length,
            "_token_ids": [r["token_ids"] for r in rs],
        }
    off = results.get("off", off)
    for name, r in results.items():
        if off is not None:
            same = [a == b for a, b in zip(r["_token_ids"], off["_token_ids"])]
            r["speedup_vs_off"] = r["decode_tokens_per_s"] / off["decode_tokens_per_s"]
            r["num_outputs_identical_to_off"] = sum(same)
            r["outputs_identical_to_off"] = all(same)
            r["first_divergence_from_off"] = [
                _first_difference(a, b) for a, b, ok in zip(r["_token_ids"], off["_token_ids"], same) if not ok
            ]
    return results


def _public(results: dict) -> dict:
    return {name: {k: v for k, v in r.items() if not k.startswith("_")} for name, r in results.items()}


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def batch32(engines: dict[str, LLM], prompts: list[list[int]], max_tokens: int, repeats: int) -> dict:
    """All prompts at once, engines in turn, `repeats` rounds; output tokens/s over the batch's wall time."""
    totals = {name: {"output_tokens": 0, "seconds": 0.0, "rounds_tokens_per_s": []} for name in engines}
    stats = {name: SpecDecodeStats() for name in engines}
    for round_ in range(repeats):
        order = list(engines.items())
        if round_ % 2:  # alternate who goes first: the machine's drift hits every engine alike
            order.reverse()
        for name, llm in order:
            llm.engine.speculator.stats = stats[name]
            rs = run_requests(llm, prompts, max_tokens, f"b{len(prompts)}-{name}-{round_}")
            tokens = sum(len(r["token_ids"]) for r in rs)
            seconds = max(r["last"] for r in rs) - rs[0]["start"]
            totals[name]["output_tokens"] += tokens
            totals[name]["seconds"] += seconds
            totals[name]["rounds_tokens_per_s"].append(tokens / seconds)
    for name, t in totals.items():
        t["num_requests"] = len(prompts)
        t["rounds"] = repeats
        t["output_tokens_per_s"] = t["output_tokens"] / t["seconds"]
        t["num_drafts"] = stats[name].num_drafts
        t["acceptance_rate"] = stats[name].acceptance_rate
        t["mean_acceptance_length"] = stats[name].mean_acceptance_length
    for t in totals.values():
        t["ratio_vs_off"] = t["output_tokens_per_s"] / totals["off"]["output_tokens_per_s"]
    return totals


def step_costs(llm: LLM, prompt: list[int], widths=(1, 2, 3, 5, 9), repeats: int = 20) -> dict:
    """Seconds of one target forward at batch 1 over `width` tokens (the last token and width-1
    draft tokens, as a verification step; width 1 is a plain decode step), after a prefill."""
    engine, rid = llm.engine, "step-cost"
    engine.add_request(GenerationRequest(rid, prompt, SamplingParams(max_tokens=4, temperature=0.0)))
    while engine.scheduler.requests[rid].num_output_tokens == 0:
        engine.step()  # the prefill
    request = engine.scheduler.requests[rid]
    request.spec_token_ids = []
    if engine.kv_manager.allocate_slots(request, max(widths)) is None:
        raise RuntimeError("no KV room for the step-cost probe")
    out = {}
    for width in widths:
        spec = {rid: [prompt[-1]] * (width - 1)} if width > 1 else {}
        batch = engine.runner.prepare({rid: width}, engine.scheduler.requests, engine.kv_manager.get_block_ids, spec)
        for _ in range(3):
            engine.runner.execute(batch)
        start = time.perf_counter()
        for _ in range(repeats):
            engine.runner.execute(batch)
        out[str(width)] = (time.perf_counter() - start) / repeats
    engine.abort_request(rid)
    return out


def build_engines(specs: dict[str, SpeculativeConfig], dtype: str, device: str) -> dict[str, LLM]:
    return {
        name: LLM(
            None,
            speculative=spec,
            dtype=dtype,
            device=device,
            max_num_seqs=BATCH,
            max_num_batched_tokens=512,
            kv_cache_gb=0.5,
        )
        for name, spec in specs.items()
    }


def run_bench(
    num_prompts: int,
    max_tokens: int,
    batch_size: int = BATCH,
    b32_repeats: int = 1,
    k_sweep: tuple[int, ...] = (),
    with_draft: bool = True,
    nonadaptive_b32: bool = False,
    dtype: str = "auto",
    device: str = "auto",
    measure_step_costs: bool = True,
    step_cost_repeats: int = 20,
) -> dict:
    """The whole measurement; `num_prompts` per workload at batch 1. Returns the report (no command/machine)."""
    started = time.perf_counter()
    model_path = default_model_path()
    draft_spec = f"draft:{model_path}@{DRAFT_LAYERS}"
    specs = {"off": SpeculativeConfig(method="off"), "ngram": SpeculativeConfig(method="ngram")}
    if with_draft:
        specs["draft"] = SpeculativeConfig(method="draft", draft_model=model_path, draft_num_layers=DRAFT_LAYERS)
    engines = build_engines(specs, dtype, device)
    engine = engines["off"].engine
    tokenize = engine.tokenize
    grounded = [
        engine.apply_chat_template(c) for c in grounded_conversations(max(num_prompts, batch_size // 2), tokenize)
    ]
    open_ended = [
        engine.apply_chat_template(c) for c in open_conversations(max(num_prompts, batch_size - batch_size // 2))
    ]
    for name, llm in engines.items():  # warm-up: one short generation each
        run_requests(llm, [grounded[0]], 8, f"warm-{name}")

    b1 = {
        "grounded": batch1(engines, grounded[:num_prompts], max_tokens, "grounded"),
        "open_ended": batch1(engines, open_ended[:num_prompts], max_tokens, "open"),
    }
    print(
        "batch 1:",
        json.dumps({w: {n: round(r["speedup_vs_off"], 3) for n, r in res.items()} for w, res in b1.items()}),
        flush=True,
    )

    sweep = {}
    if k_sweep:
        sweep_engines = build_engines(
            {f"ngram_k{k}": SpeculativeConfig(method="ngram", num_speculative_tokens=k) for k in k_sweep}, dtype, device
        )
        for name, llm in sweep_engines.items():
            run_requests(llm, [grounded[0]], 8, f"warm-{name}")
        sweep_res = batch1(sweep_engines, grounded[:num_prompts], max_tokens, "sweep", off=b1["grounded"]["off"])
        sweep = {
            name: {
                key: r[key]
                for key in (
                    "decode_tokens_per_s",
                    "speedup_vs_off",
                    "acceptance_rate",
                    "mean_acceptance_length",
                    "outputs_identical_to_off",
                )
            }
            for name, r in sweep_res.items()
        }
        sweep[f"ngram_k{SpeculativeConfig().num_speculative_tokens}"] = {
            key: b1["grounded"]["ngram"][key] for key in sweep[next(iter(sweep))]
        }
        del sweep_engines
        print("k sweep:", json.dumps({n: round(r["speedup_vs_off"], 3) for n, r in sweep.items()}), flush=True)

    mixed = [p for pair in zip(grounded[: batch_size // 2], open_ended[: batch_size - batch_size // 2]) for p in pair]
    b32_engines = dict(engines)
    if nonadaptive_b32:
        b32_engines.update(
            build_engines({"ngram_nonadaptive": SpeculativeConfig(method="ngram", adaptive=False)}, dtype, device)
        )
        run_requests(b32_engines["ngram_nonadaptive"], [grounded[0]], 8, "warm-nonadaptive")
    b32 = batch32(b32_engines, mixed, max_tokens, b32_repeats)
    print(f"batch {batch_size}:", json.dumps({n: round(r["ratio_vs_off"], 3) for n, r in b32.items()}), flush=True)

    costs = step_costs(engines["off"], grounded[0], repeats=step_cost_repeats) if measure_step_costs else {}

    report = {
        "model": os.path.basename(model_path) + " (dequantized)",
        "config": {
            "device": str(engine.device),
            "dtype": str(engine.dtype),
            "attention_backend": engine.attention_backend,
            "torch_threads": torch.get_num_threads(),
            "max_num_seqs": BATCH,
            "max_num_batched_tokens": 512,
            "proposers": {name: vars(spec) for name, spec in specs.items()},
            "draft_cli": draft_spec,
        },
        "workload": {
            "grounded": f"{num_prompts} GSM8K test problem+solution passages of "
            f"{PASSAGE_TOKENS[0]}-{PASSAGE_TOKENS[1]} tokens, "
            f"templates in turn: {', '.join(GROUNDED_TEMPLATES)}",
            "open_ended": f"{num_prompts} MT-Bench first-turn questions, every {max(1, 80 // num_prompts)}th",
            "max_tokens": max_tokens,
            "sampling": "greedy (temperature 0), EOS honoured",
            "batch": f"{batch_size} requests submitted at once "
            f"({batch_size // 2} grounded + {batch_size - batch_size // 2} open-ended, interleaved), "
            f"{b32_repeats} round(s) per engine, engines in turn (order reversed every other round)",
        },
        "metric": {
            "decode_tokens_per_s": "(output tokens - 1) / (last token time - first token time), "
            "summed over prompts run one at a time",
            "end_to_end_tokens_per_s": "output tokens / (last token time - submit time)",
            "b32_output_tokens_per_s": "all output tokens / wall time from submitting the batch to its last token",
        },
        "baselines": {"off": "the same engine with speculative decoding off"},
        "batch1": {workload: _public(results) for workload, results in b1.items()},
        "batch32": b32,
        "ngram_k_sweep_grounded": sweep,
        "step_seconds_batch1_by_tokens": costs,
    }
    for workload, short in (("grounded", "grounded"), ("open_ended", "open")):
        for name in specs:
            if name == "off":
                continue
            r = b1[workload][name]
            report[f"speedup_b1_{name}_{short}"] = r["speedup_vs_off"]
            report[f"acceptance_rate_{name}_{short}"] = r["acceptance_rate"]
            report[f"mean_acceptance_length_{name}_{short}"] = r["mean_acceptance_length"]
            report[f"outputs_identical_to_off_{name}_{short}"] = r["outputs_identical_to_off"]
    report["outputs_identical_to_off"] = all(
        r.get("outputs_identical_to_off", True) for w in b1.values() for r in w.values()
    )
    report["throughput_ratio_b32_adaptive"] = b32["ngram"]["ratio_vs_off"]
    if "draft" in b32:
        report["throughput_ratio_b32_adaptive_draft"] = b32["draft"]["ratio_vs_off"]
    if "ngram_nonadaptive" in b32:
        report["throughput_ratio_b32_ngram_nonadaptive"] = b32["ngram_nonadaptive"]["ratio_vs_off"]
    report["notes"] = (
        "draft is a layer-skip of the target itself (no smaller model shares SmolLM2's tokenizer); in development "
        "its greedy acceptance on these workloads was ~0.02 with 8 layers, 0.07-0.09 with 16, 0.18-0.19 with 22 "
        "and 0.28-0.32 with 26 of 30, so it cannot pay for its own forwards at any depth here"
    )
    report["targets"] = {"speedup_b1_ngram_grounded": 1.8, "throughput_ratio_b32_adaptive": 0.95}
    report["seconds"] = time.perf_counter() - started
    return report


HEADLINE = (
    "speedup_b1_ngram_grounded",
    "acceptance_rate_ngram_grounded",
    "mean_acceptance_length_ngram_grounded",
    "speedup_b1_ngram_open",
    "speedup_b1_draft_grounded",
    "speedup_b1_draft_open",
    "throughput_ratio_b32_adaptive",
    "outputs_identical_to_off",
    "seconds",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--quick", action="store_true", help="fewer prompts and tokens (under 3 minutes here)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="only checks that the bench works (1 prompt per workload, 16 tokens, a batch of 4): figures meaningless",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help="auto (the engine's serving default), float32, bfloat16")
    args = parser.parse_args()
    if args.smoke:
        report = run_bench(
            num_prompts=1,
            max_tokens=16,
            batch_size=4,
            b32_repeats=1,
            dtype=args.dtype,
            device=args.device,
            step_cost_repeats=2,
        )
    elif args.quick:
        report = run_bench(num_prompts=4, max_tokens=64, b32_repeats=1, dtype=args.dtype, device=args.device)
    else:
        report = run_bench(
            num_prompts=16,
            max_tokens=128,
            b32_repeats=2,
            k_sweep=(2, 4),
            nonadaptive_b32=True,
            dtype=args.dtype,
            device=args.device,
        )
    report = {
        "benchmark": "spec_decode",
        "smoke": args.smoke,
        "command": "python -m bench.spec_decode " + " ".join(sys.argv[1:]),
        "machine": machine_info(),
        **report,
    }
    write_report(args.json, report, tuple(k for k in HEADLINE if k in report))


if __name__ == "__main__":
    main()
