"""What the prompt cache saves a chat: time to first token of each turn, cache on against off.

    python -m bench.prompt_cache --json bench/results/prompt_cache.json [--quick]

An app on the device runs one conversation at a time and resends it whole every turn. Here
the local engine (tandem serve's defaults, 2 threads, the embedded SmolLM2) plays MT-Bench's
two-turn conversations plus a third turn asking for a one-sentence summary: greedy answers
of up to 64 tokens, each turn's prompt the chat template over everything said so far. Every
conversation runs twice, back to back, with `cache_finished_prompts` on and off (the order
alternating), from an empty cache each time, so only reuse within the conversation counts.

Keys: `ttft_ms_p50` per mode and turn, `ratio_ttft_cached_vs_uncached_turn2` and `_turn3`
(medians of per-conversation ratios, with their interquartile spread), prompt tokens computed
per mode, and `answers_identical` (the fraction of conversations whose greedy answers are the
same token for token in both modes).

    python -m bench.prompt_cache --overhead --json bench/results/prompt_cache_overhead.json [--quick]

What cached prompts cost when nothing reuses them: bench.local_step_profile's workload (8
clients, random prompts) with `max_cached_prompts` 0 (no cache), 2 (the default) and 16 (every
slot's last prompt, as llama-server keeps them), interleaved, 3 repetitions (--quick: 1 of 16
prompts). Cached cells widen the KV view every decode walks in llama.cpp's unified pool. Keys:
`decode_step_ms_p50` per setting (median over repetitions) and `ratio_decode_step_vs_no_cache_k2`,
`_k16` with their spread (min-max of the per-repetition ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from bench.machine import report_header, write_report
from bench.repetitions import median_and_spread
from bench.serve_datasets import DEFAULT_DATA_DIR
from local_runtime.config import LocalEngineConfig
from local_runtime.engine import LocalEngine
from sdk.protocol.engine import GenerationRequest, SamplingParams

CONFIG = dict(
    n_threads=2
)  # everything else: tandem serve's defaults (max_cached_prompts 2); the cache is toggled per run
MAX_TOKENS = 64
SUMMARY_TURN = "Now summarize your answers in one sentence."
HEADLINE_KEYS = ("ratio_ttft_cached_vs_uncached_turn2", "ratio_ttft_cached_vs_uncached_turn3", "answers_identical")


def conversations(data_dir: str, count: int) -> list[list[str]]:
    """The user turns of the first `count` MT-Bench questions, plus the summary request."""
    with open(os.path.join(data_dir, "mt_bench_questions.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [list(row["turns"][:2]) + [SUMMARY_TURN] for row in rows[:count]]


def first_token_then_rest(engine: LocalEngine, request_id: str, prompt: list[int]) -> tuple[float, list[int], str]:
    """Run one request alone: seconds to its first token, its tokens, and its text."""
    start = time.perf_counter()
    engine.add_request(GenerationRequest(request_id, prompt, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)))
    ttft, tokens, text = None, [], []
    while engine.has_unfinished_requests():
        for event in engine.step():
            if ttft is None:
                ttft = time.perf_counter() - start
            tokens.append(event.token_id)
            text.append(event.text)
    return ttft, tokens, "".join(text)


def play(engine: LocalEngine, turns: list[str], cache: bool, tag: str) -> dict:
    """One conversation from an empty cache: per turn TTFT (s), prompt tokens computed, answer tokens."""
    engine.clear_prompt_cache()
    engine.scheduler.cache_finished_prompts = cache
    messages, result = [], {"ttft_s": [], "computed": [], "answers": []}
    for i, user in enumerate(turns):
        messages.append({"role": "user", "content": user})
        prompt = engine.apply_chat_template(messages)
        hits_before = engine.stats().num_prefix_cache_hit_tokens_total
        ttft, tokens, text = first_token_then_rest(engine, f"{tag}-turn{i + 1}", prompt)
        result["ttft_s"].append(ttft)
        result["computed"].append(len(prompt) - (engine.stats().num_prefix_cache_hit_tokens_total - hits_before))
        result["answers"].append(tokens)
        messages.append({"role": "assistant", "content": text})
    return result


def quartiles(values: list[float]) -> list[float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return [q[0], q[2]]


def run(count: int, data_dir: str) -> dict:
    engine = LocalEngine(LocalEngineConfig(**CONFIG))
    try:
        play(engine, ["Hello."], True, "warm-up")
        runs = {True: [], False: []}
        for n, turns in enumerate(conversations(data_dir, count)):
            for cache in (True, False) if n % 2 == 0 else (False, True):  # alternate which mode goes first
                runs[cache].append(play(engine, turns, cache, f"c{n}-{'on' if cache else 'off'}"))
        stats = engine.stats()
    finally:
        engine.close()
    num_turns = len(runs[True][0]["ttft_s"])
    report: dict = {
        "config": CONFIG
        | {
            "conversations": len(runs[True]),
            "turns": num_turns,
            "max_tokens": MAX_TOKENS,
            "kv_cache_tokens": LocalEngineConfig().kv_cache_tokens,
            "max_num_seqs": LocalEngineConfig().max_num_seqs,
        }
    }
    for cache, name in ((True, "cached"), (False, "uncached")):
        report[name] = {
            f"ttft_ms_p50_turn{t + 1}": statistics.median(r["ttft_s"][t] for r in runs[cache]) * 1000
            for t in range(num_turns)
        } | {
            "prompt_tokens_computed": sum(sum(r["computed"]) for r in runs[cache]),
        }
    for t in range(1, num_turns):
        ratios = [on["ttft_s"][t] / off["ttft_s"][t] for on, off in zip(runs[True], runs[False])]
        report[f"ratio_ttft_cached_vs_uncached_turn{t + 1}"] = statistics.median(ratios)
        report[f"ratio_ttft_cached_vs_uncached_turn{t + 1}_spread"] = quartiles(ratios)
    first = [on["ttft_s"][0] / off["ttft_s"][0] for on, off in zip(runs[True], runs[False])]
    report["ratio_ttft_cached_vs_uncached_turn1"] = statistics.median(first)  # nothing to reuse: the noise floor
    report["ratio_ttft_cached_vs_uncached_turn1_spread"] = quartiles(first)
    same = [on["answers"] == off["answers"] for on, off in zip(runs[True], runs[False])]
    report["answers_identical"] = sum(same) / len(same)
    report["prompt_tokens_total"] = stats.num_prompt_tokens_total
    return report


OVERHEAD_SETTINGS = (0, 2, 16)
OVERHEAD_KEYS = ("ratio_decode_step_vs_no_cache_k2", "ratio_decode_step_vs_no_cache_k16")


def overhead(num_prompts: int, repeats: int) -> dict:
    from bench.local_step_profile import CONFIG as base
    from bench.local_step_profile import run as run_step_profile

    steps: dict[int, list[float]] = {k: [] for k in OVERHEAD_SETTINGS}
    for _ in range(repeats):
        for k in OVERHEAD_SETTINGS:
            cache = {"cache_finished_prompts": True, "max_cached_prompts": k}
            steps[k].append(run_step_profile(num_prompts, 8, cache)["decode_step_ms_p50"])
    report: dict = {
        "config": base | {"clients": 8, "num_prompts": num_prompts, "repeats": repeats},
        "decode_step_ms_p50": {f"k{k}": statistics.median(v) for k, v in steps.items()},
        "decode_step_ms_runs": {f"k{k}": v for k, v in steps.items()},
    }
    for k in OVERHEAD_SETTINGS[1:]:
        key = f"ratio_decode_step_vs_no_cache_k{k}"
        report[key], report[f"{key}_spread"] = median_and_spread([a / b for a, b in zip(steps[k], steps[0])])
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--quick", action="store_true", help="8 conversations instead of 40")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="RouteLLM's data (mt_bench_questions.jsonl)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="2 conversations (with --overhead: 16 prompts, once): checks the bench works",
    )
    parser.add_argument(
        "--overhead", action="store_true", help="what cached prompts cost 8 clients with nothing to reuse"
    )
    args = parser.parse_args()
    if args.overhead:
        report = report_header("prompt_cache_overhead", smoke=args.smoke) | overhead(
            16 if args.quick or args.smoke else 64, 1 if args.quick or args.smoke else 3
        )
        write_report(args.json, report, OVERHEAD_KEYS)
        return
    count = 2 if args.smoke else 8 if args.quick else 40
    report = report_header("prompt_cache", smoke=args.smoke) | run(count, args.data_dir)
    write_report(args.json, report, HEADLINE_KEYS)


if __name__ == "__main__":
    main()
