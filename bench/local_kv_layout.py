"""The local engine over one unified KV pool against one llama.cpp KV stream per slot, step by step.

    python -m bench.local_kv_layout --json bench/results/local_kv_layout.json [--quick | --smoke]

bench.local_step_profile's workload and engine configuration (bench.serve --compare-local's: 16
slots, 16 x 1024 KV cells, 512-token steps, 2 threads; random chat prompts of 128 words, exactly
64 output tokens, greedy), in-process (no HTTP), on two engines loaded side by side: one with
`kv_layout = "unified"` (every slot draws cells from one pool, as tandem did before issue 38) and
one with `"streams"` (each slot 1024 cells of its own, llama-server's -np layout; what `auto`
picks for this configuration). Each drives its own closed loop of C clients, and the two step in
turn, one step each, so a slow second on this shared machine (the same engine's speed moved by
a tenth from one minute to the next here) falls on both alike. A repetition is one such run.

Keys, per client count C: `ratio_output_tps_streams_vs_unified_cC` (output tokens over the time
spent in that engine's steps) and `ratio_decode_step_streams_vs_unified_cC` (the median step
with every client decoding), each the median of per-repetition ratios with its min-max spread,
and each layout's figures per repetition.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.local_step_profile import CONFIG
from bench.machine import report_header, write_report
from bench.repetitions import median_and_spread
from bench.serve_datasets import random_requests
from local_runtime.config import LocalEngineConfig
from local_runtime.engine import LocalEngine
from sdk.protocol.engine import GenerationRequest, SamplingParams

LAYOUTS = ("unified", "streams")
CLIENTS = (1, 8)
HEADLINE_KEYS = (
    "ratio_output_tps_streams_vs_unified_c8",
    "ratio_output_tps_streams_vs_unified_c8_spread",
    "ratio_decode_step_streams_vs_unified_c8",
    "ratio_output_tps_streams_vs_unified_c1",
)


class ClosedLoop:
    """One engine, `clients` requests kept in flight until `num_prompts` finished; one step at a time."""

    def __init__(self, engine: LocalEngine, prompts: list[list[int]], clients: int):
        self.engine, self.prompts, self.clients = engine, prompts, clients
        self.params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True, repetition_stop=False)
        self.next = self.in_flight = self.done = self.output_tokens = 0
        self.step_s = 0.0
        self.full_decode_steps: list[float] = []

    @property
    def finished(self) -> bool:
        return self.done >= len(self.prompts)

    def step(self) -> None:
        while self.in_flight < self.clients and self.next < len(self.prompts):
            self.engine.add_request(GenerationRequest(f"r{self.next}", self.prompts[self.next], self.params))
            self.next, self.in_flight = self.next + 1, self.in_flight + 1
        decoding = sum(1 for r in self.engine.scheduler.running if r.num_computed_tokens >= r.num_prompt_tokens)
        started = time.perf_counter()
        events = self.engine.step()
        elapsed = time.perf_counter() - started
        self.step_s += elapsed
        if decoding == len(events) == self.clients and not self.engine.scheduler.waiting:
            self.full_decode_steps.append(elapsed)
        finished = sum(1 for e in events if e.finish_reason is not None)
        self.output_tokens += len(events)
        self.done, self.in_flight = self.done + finished, self.in_flight - finished

    def figures(self) -> dict:
        return {
            "output_tokens_per_s": self.output_tokens / self.step_s,
            "decode_step_ms_p50": statistics.median(self.full_decode_steps) * 1000 if self.full_decode_steps else None,
            "num_full_decode_steps": len(self.full_decode_steps),
            "prefix_shared_tokens": self.engine.stats().num_prefix_cache_hit_tokens_total,
        }


def run_side_by_side(engines: dict[str, LocalEngine], prompts: list[list[int]], clients: int) -> dict[str, dict]:
    for engine in engines.values():  # a warm-up request each, outside the measured set
        engine.add_request(GenerationRequest("warm-up", prompts[-1], SamplingParams(max_tokens=8, temperature=0.0)))
        while engine.has_unfinished_requests():
            engine.step()
        engine.clear_prompt_cache()
    loops = {name: ClosedLoop(engine, prompts[:-1], clients) for name, engine in engines.items()}
    while not all(loop.finished for loop in loops.values()):
        for loop in loops.values():
            if not loop.finished:
                loop.step()
    for engine in engines.values():
        engine.clear_prompt_cache()
    return {name: loop.figures() for name, loop in loops.items()}


def measure(repeats: int, prompts_at: dict[int, int], clients: tuple[int, ...]) -> dict:
    engines = {layout: LocalEngine(LocalEngineConfig(**CONFIG, kv_layout=layout)) for layout in LAYOUTS}
    assert engines["streams"].config.kv_streams and not engines["unified"].config.kv_streams
    samples = random_requests(max(prompts_at.values()) + 1, 128, 64, seed=0)
    prompts = [engines["unified"].apply_chat_template([{"role": "user", "content": s.prompt}]) for s in samples]
    runs: dict[int, list[dict]] = {c: [] for c in clients}
    try:
        for rep in range(repeats):
            for c in clients:
                result = run_side_by_side(engines, prompts[: prompts_at[c]] + prompts[-1:], c)
                runs[c].append(result)
                print(
                    f"repetition {rep + 1}/{repeats} c={c}: "
                    + ", ".join(
                        f"{name} {r['output_tokens_per_s']:.1f} tok/s, "
                        f"decode step {r['decode_step_ms_p50'] or 0:.1f} ms"
                        for name, r in result.items()
                    ),
                    flush=True,
                )
    finally:
        for engine in engines.values():
            engine.close()
    report: dict = {"config": CONFIG, "runs": {f"c{c}": rs for c, rs in runs.items()}}
    for c, rs in runs.items():
        for key, figure in (("output_tps", "output_tokens_per_s"), ("decode_step", "decode_step_ms_p50")):
            ratios = [
                r["streams"][figure] / r["unified"][figure] for r in rs if r["streams"][figure] and r["unified"][figure]
            ]
            if ratios:
                name = f"ratio_{key}_streams_vs_unified_c{c}"
                report[name], report[f"{name}_spread"] = median_and_spread(ratios)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--quick", action="store_true", help="2 repetitions of 24 (c8) and 8 (c1) prompts")
    parser.add_argument("--smoke", action="store_true", help="once, 4 prompts, 2 clients: checks the bench works")
    args = parser.parse_args()
    if args.smoke:
        repeats, prompts, clients = 1, {2: 4}, (2,)
    elif args.quick:
        repeats, prompts, clients = 2, {1: 8, 8: 24}, CLIENTS
    else:
        repeats, prompts, clients = 3, {1: 16, 8: 48}, CLIENTS
    report = report_header("local_kv_layout", smoke=args.smoke) | {"repeats": repeats, "prompts": prompts}
    report |= measure(repeats, prompts, clients)
    keys = HEADLINE_KEYS if not args.smoke else ("ratio_output_tps_streams_vs_unified_c2",)
    write_report(args.json, report, keys)


if __name__ == "__main__":
    main()
