"""Where the local engine's time goes on bench.serve's compare workload, without HTTP.

    python -m bench.local_step_profile --json bench/results/local_step_profile.json [--quick | --smoke] [--clients 8]

The engine configured as `bench.serve --compare-local` configures `tandem serve` (16 slots,
16 x 1024 KV cells, 512-token steps, 2 threads), driven in-process by a closed loop of 8
clients (`--clients`): 64 random chat prompts of 128 words (the same seeded generator),
exactly 64 output tokens each, greedy. Every step is timed whole and inside `LlamaBackend.decode` (llama.cpp's
work plus one copy of the logits), so `python_share` is what tandem's own Python costs per
step: scheduling, batch building, sampling and its signals, stop checks and token events.
Steps are split into decode-only steps with every client decoding (the inter-token latency
a streaming client sees) and steps that carry prefill.

Keys: `python_share`, `decode_step_ms_p50` (whole step) and `llama_decode_ms_p50` over
the full decode steps, `prefill_tokens_computed` and `prefix_shared_tokens`.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.machine import report_header, write_report
from bench.serve_datasets import random_requests
from local_runtime.config import LocalEngineConfig
from local_runtime.engine import LocalEngine
from sdk.protocol.engine import GenerationRequest, SamplingParams

CONFIG = dict(kv_cache_tokens=16 * 1024, max_num_seqs=16, max_num_batched_tokens=512, n_threads=2, max_model_len=1024)
HEADLINE_KEYS = (
    "output_tokens_per_s",
    "python_share",
    "decode_step_ms_p50",
    "llama_decode_ms_p50",
    "prefill_tokens_computed",
    "prefix_shared_tokens",
)


class TimedBackend:
    """Wraps the engine's backend: the time of each decode call, and what each step scheduled."""

    def __init__(self, engine: LocalEngine):
        self.engine = engine
        self.decode_s = 0.0
        self._decode = engine.backend.decode
        self._schedule = engine.scheduler.schedule
        engine.backend.decode = self.decode
        engine.scheduler.schedule = self.schedule
        self.num_tokens = self.num_decodes = 0

    def decode(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self._decode(*args, **kwargs)
        finally:
            self.decode_s = time.perf_counter() - start

    def schedule(self):
        out = self._schedule()
        self.num_tokens = out.total_num_scheduled_tokens
        running = self.engine.scheduler.requests
        self.num_decodes = sum(
            1
            for rid, n in out.num_scheduled_tokens.items()
            if n == 1 and running[rid].num_computed_tokens >= running[rid].num_prompt_tokens
        )
        self.decode_s = 0.0
        return out


def run(num_prompts: int, clients: int = 8, overrides: dict | None = None) -> dict:
    """`overrides`: engine settings on top of CONFIG (bench.prompt_cache --overhead varies the cache)."""
    config = CONFIG | (overrides or {})
    engine = LocalEngine(LocalEngineConfig(**config))
    samples = random_requests(num_prompts + 1, 128, 64, seed=0)
    prompts = [engine.apply_chat_template([{"role": "user", "content": s.prompt}]) for s in samples]
    prompt_tokens = sum(len(p) for p in prompts[:num_prompts])
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True, repetition_stop=False)

    def request(i: int) -> GenerationRequest:
        return GenerationRequest(f"r{i}", prompts[i], params)

    engine.add_request(request(num_prompts))  # warm-up, outside the measured set
    while engine.has_unfinished_requests():
        engine.step()
    timed = TimedBackend(engine)
    stats_before = engine.stats()
    steps = []  # (whole step s, llama_decode s, tokens, decodes)
    next_prompt = in_flight = done = output_tokens = 0
    start = time.perf_counter()
    while done < num_prompts:
        while in_flight < clients and next_prompt < num_prompts:
            engine.add_request(request(next_prompt))
            next_prompt, in_flight = next_prompt + 1, in_flight + 1
        step_start = time.perf_counter()
        events = engine.step()
        steps.append((time.perf_counter() - step_start, timed.decode_s, timed.num_tokens, timed.num_decodes))
        output_tokens += len(events)
        finished = sum(1 for e in events if e.finish_reason is not None)
        done, in_flight = done + finished, in_flight - finished
    elapsed = time.perf_counter() - start
    stats = engine.stats()
    engine.close()
    full_decode = [(whole, inner) for whole, inner, tokens, decodes in steps if tokens == decodes == clients]
    with_prefill = [(whole, inner, tokens) for whole, inner, tokens, decodes in steps if tokens > decodes]
    step_total = sum(s[0] for s in steps)
    decode_total = sum(s[1] for s in steps)
    return {
        "config": config | {"clients": clients, "num_prompts": num_prompts, "prompt_words": 128, "output_tokens": 64},
        "elapsed_s": elapsed,
        "output_tokens_per_s": output_tokens / elapsed,
        "num_steps": len(steps),
        "step_time_s": step_total,
        "llama_decode_time_s": decode_total,
        "python_share": (step_total - decode_total) / step_total,
        "decode_step_ms_p50": statistics.median(w for w, _ in full_decode) * 1000 if full_decode else None,
        "llama_decode_ms_p50": statistics.median(i for _, i in full_decode) * 1000 if full_decode else None,
        "num_full_decode_steps": len(full_decode),
        "prefill_steps": {
            "count": len(with_prefill),
            "time_s": sum(w for w, _, _ in with_prefill),
            "tokens": sum(t for _, _, t in with_prefill),
        },
        "prefill_tokens_computed": (stats.num_prompt_tokens_total - stats_before.num_prompt_tokens_total)
        - (stats.num_prefix_cache_hit_tokens_total - stats_before.num_prefix_cache_hit_tokens_total),
        "prefix_shared_tokens": stats.num_prefix_cache_hit_tokens_total
        - stats_before.num_prefix_cache_hit_tokens_total,
        "prompt_tokens_total": prompt_tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--quick", action="store_true", help="16 prompts instead of 64")
    parser.add_argument("--smoke", action="store_true", help="4 prompts, 2 clients: checks the bench works")
    parser.add_argument(
        "--clients", type=int, default=None, help="requests kept in flight (default 8, as the compare's c8)"
    )
    args = parser.parse_args()
    num_prompts, clients = (4, args.clients or 2) if args.smoke else (16 if args.quick else 64, args.clients or 8)
    report = report_header("local_step_profile", smoke=args.smoke) | run(num_prompts, clients)
    write_report(args.json, report, HEADLINE_KEYS)


if __name__ == "__main__":
    main()
