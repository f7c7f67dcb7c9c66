"""What the streamed cascade's hold window costs and keeps.

    python -m bench.stream_hold [--quick] --json bench/results/stream_hold.json

Restart hand-off holds a streamed local answer's first `hold_tokens` back while the router
judges them (sdk.cascade.config). Two measurements, side by side in one run:

1. Where the default streaming policy (mean_prob, K 8, every token) first escalates, on
   SmolLM2's own answers to MT-bench first turns and GSM8K questions (RouteLLM's data in
   shared/data), 256 tokens, the model's sampling defaults, at thresholds 0.3 / 0.5 / 0.7:
   `low_confidence_escalations_by_token` counts them by position, so the share a window of
   N tokens keeps is `by_token[N] / total`. Loop escalations are counted apart.
2. TTFT of `tandem serve --cloud none` with `bench.serve` (GSM8K prompts, 4 clients,
   streamed): model `local`, `auto` with the default window, and `auto` with
   `hold_tokens = 0` (held until decided: what every streamed `auto` answer got before the
   window). Keys `ttft_p50_ms_local`, `ttft_p50_ms_auto_window`, `ttft_p50_ms_auto_until_decided`
   and `ttft_ratio_window_vs_until_decided`.

--quick: 40 prompts for (1) and 8 for (2); --smoke: 4 short ones for each (checks the bench works).

--compare-prefill runs (1) only, twice: prompts prefilled on the model's own weights (prefill_weights
= off) and through the 16-bit copy `auto` takes on this machine (or --prefill-weights names), each
answer seeded by its prompt's index so the two runs differ only by the prefill. The streaming
policy's thresholds were fitted on the first kind of answers; `escalated_by_window_copy_minus_off`
(at threshold 0.5, low-confidence escalations within the default hold window) and its SE, from the
answers whose verdict differs between the runs (McNemar's), say whether the copy moves them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from bench.first_contact import stop
from bench.machine import report_header, write_report
from bench.serve_datasets import DEFAULT_DATA_DIR
from bench.serve_servers import free_port

REPO = Path(__file__).resolve().parents[1]
DATA = Path(DEFAULT_DATA_DIR)  # RouteLLM's data, as bench.serve finds it
THRESHOLDS = (0.3, 0.5, 0.7)
POSITIONS = (8, 16, 32, 64, 128, 256)
HEADLINE_KEYS = (
    "low_confidence_escalations_by_token",
    "ttft_p50_ms_local",
    "ttft_p50_ms_auto_window",
    "ttft_p50_ms_auto_until_decided",
    "ttft_ratio_window_vs_until_decided",
)


def prompts(num: int) -> list[str]:
    chat = [json.loads(line)["turns"][0] for line in open(DATA / "mt_bench_questions.jsonl")]
    maths = [json.loads(line)["question"] for line in open(DATA / "gsm8k_test.jsonl")]
    half = num // 2
    return chat[: num - half] + maths[:half]


async def escalation_positions(
    texts: list[str], max_tokens: int = 256, prefill_weights: str = "auto", seeded: bool = False
) -> dict:
    """First escalation per answer and threshold, by StreamingPolicy as the cascade builds it (with
    `seeded`, answer i samples with seed i; "first" in the result holds each answer's escalation)."""
    from local_runtime.async_engine import AsyncLocalEngine
    from local_runtime.config import LocalEngineConfig
    from router.streaming_policy import StreamingPolicy
    from sdk.cascade.config import CascadeConfig
    from sdk.protocol.engine import GenerationRequest, SamplingParams
    from sdk.engine_common.repetition import ESCALATE_LOOP

    config = CascadeConfig()
    engine = AsyncLocalEngine(LocalEngineConfig(max_num_seqs=8, prefill_weights=prefill_weights)).start()
    engine.wait_ready(300)
    prefill_kind = engine.engine.prefill_choice.kind or "own"
    first: dict[float, list] = {t: [] for t in THRESHOLDS}
    slots = asyncio.Semaphore(8)

    async def one(index: int, text: str) -> None:
        async with slots:
            ids = engine.apply_chat_template([{"role": "user", "content": text}])
            policies = {
                t: StreamingPolicy(
                    t, config.min_tokens_k, config.score_kind, decide_at=config.decide_at, loop_rule=ESCALATE_LOOP
                )
                for t in THRESHOLDS
            }
            found: dict[float, tuple | None] = {}
            params = SamplingParams(max_tokens=max_tokens, seed=index if seeded else None)
            async for event in engine.generate(GenerationRequest(f"hold-{index}", ids, params)):
                for t, policy in policies.items():
                    if t not in found and (decision := policy.observe(event)) is not None:
                        found[t] = (decision.decided_at_token, str(decision.reason))
            for t, policy in policies.items():
                if t not in found:
                    decision = policy.finish()
                    found[t] = (decision.decided_at_token, str(decision.reason)) if decision.escalated else None
                first[t].append((index, found[t]))

    try:
        await asyncio.gather(*(one(i, text) for i, text in enumerate(texts)))
    finally:
        engine.shutdown()
    out = {"prefill_weights": prefill_kind}
    for t in THRESHOLDS:
        by_prompt = [found for _, found in sorted(first[t], key=lambda item: item[0])]
        escalated = [e for e in by_prompt if e is not None]
        low = sorted(pos for pos, reason in escalated if reason == "low_confidence")
        out[str(t)] = {
            "prompts": len(texts),
            "escalated": len(escalated),
            "by_reason": dict(Counter(r for _, r in escalated)),
            "low_confidence_by_token": {str(n): sum(1 for p in low if p <= n) for n in POSITIONS},
            "first": by_prompt,
        }
    return out


def compare_prefill(texts: list[str], max_tokens: int, copy_setting: str) -> dict:
    """escalation_positions on the own weights and through the copy, paired by prompt (seeded)."""
    from sdk.cascade.config import CascadeConfig

    window = CascadeConfig().stream_hold_window()
    off = asyncio.run(escalation_positions(texts, max_tokens, "off", seeded=True))
    copy = asyncio.run(escalation_positions(texts, max_tokens, copy_setting, seeded=True))
    if copy["prefill_weights"] == "own":
        raise SystemExit(
            "bench.stream_hold --compare-prefill: auto chose the model's own weights on this machine; "
            "name a copy with --prefill-weights bf16 or f16"
        )

    def held(found) -> bool:  # a low-confidence escalation within the hold window
        return found is not None and found[1] == "low_confidence" and found[0] <= window

    def looped(found) -> bool:
        return found is not None and found[1] == "repetition"

    verdicts = {"escalated_by_window": held, "escalated_for_a_loop": looped}
    paired = {name: _paired(off["0.5"]["first"], copy["0.5"]["first"], verdict) for name, verdict in verdicts.items()}
    for side in (off, copy):
        for t in THRESHOLDS:
            side[str(t)].pop("first")
    return {
        "copy": copy["prefill_weights"],
        "hold_tokens": window,
        "off": off,
        "with_copy": copy,
        **{f"{name}_{key}": value for name, counts in paired.items() for key, value in counts.items()},
    }


def _paired(off: list, copy: list, verdict) -> dict:
    """How many answers get `verdict` in each run, the paired difference and its SE (McNemar: from the
    answers whose verdict differs between the runs)."""
    only_copy = sum(verdict(c) and not verdict(o) for o, c in zip(off, copy))
    only_off = sum(verdict(o) and not verdict(c) for o, c in zip(off, copy))
    return {
        "off": sum(map(verdict, off)),
        "copy": sum(map(verdict, copy)),
        "copy_minus_off": only_copy - only_off,
        "copy_minus_off_se": (only_copy + only_off) ** 0.5,
        "verdicts_differ": only_copy + only_off,
    }


def wait_healthy(server: subprocess.Popen, url: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"bench.stream_hold: tandem serve exited ({server.returncode})")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)
    raise SystemExit("bench.stream_hold: tandem serve did not become healthy")


def ttft_run(
    log_dir: Path, label: str, env_extra: dict, model: str, num_prompts: int, max_output_len: int = 160
) -> dict:
    """bench.serve against a fresh `tandem serve --cloud none`; returns its report."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")} | env_extra
    with open(log_dir / f"serve-{label}.log", "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "sdk.cli", "serve", "--cloud", "none", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )
        try:
            wait_healthy(server, f"http://127.0.0.1:{port}/health")
            out = log_dir / f"{label}.json"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.serve",
                    "--base-url",
                    f"http://127.0.0.1:{port}",
                    "--model",
                    model,
                    "--dataset",
                    "gsm8k",
                    "--num-prompts",
                    str(num_prompts),
                    "--max-concurrency",
                    "4",
                    "--max-output-len",
                    str(max_output_len),
                    "--json",
                    str(out),
                ],
                check=True,
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                timeout=900,
            )
            return json.loads(out.read_text())
        finally:
            stop(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--smoke", action="store_true", help="4 prompts of 64 tokens for (1), 4 of 32 for (2): checks the bench works"
    )
    parser.add_argument(
        "--prefill-weights",
        default="auto",
        choices=("auto", "bf16", "f16", "off"),
        help="the local engine's prefill_weights in (1) (with --compare-prefill: the copy compared with off)",
    )
    parser.add_argument(
        "--compare-prefill", action="store_true", help="(1) only, on the own weights and through the copy"
    )
    args = parser.parse_args()
    from sdk.cascade.config import CascadeConfig

    window = CascadeConfig().stream_hold_window()
    num_positions = 4 if args.smoke else 40 if args.quick else 140
    max_tokens = 64 if args.smoke else 256
    if args.compare_prefill:
        copy_setting = "auto" if args.prefill_weights == "off" else args.prefill_weights
        result = compare_prefill(prompts(num_positions), max_tokens, copy_setting)
        report = report_header("stream_hold_prefill", smoke=args.smoke) | {"quick": args.quick, **result}
        write_report(
            args.json,
            report,
            (
                "copy",
                "escalated_by_window_off",
                "escalated_by_window_copy",
                "escalated_by_window_copy_minus_off",
                "escalated_by_window_copy_minus_off_se",
            ),
        )
        return
    positions = asyncio.run(escalation_positions(prompts(num_positions), max_tokens, args.prefill_weights))
    for t in THRESHOLDS:
        positions[str(t)].pop("first")
    num_prompts = 4 if args.smoke else 8 if args.quick else 16
    runs = {}
    with tempfile.TemporaryDirectory(prefix="stream-hold-") as tmp:
        for label, env, model in [
            ("local", {}, "local"),
            ("auto_window", {}, "auto"),
            ("auto_until_decided", {"TANDEM_CASCADE_HOLD_TOKENS": "0"}, "auto"),
        ]:
            report = ttft_run(Path(tmp), label, env, model, num_prompts, 32 if args.smoke else 160)
            metrics = report["metrics"]
            runs[label] = {
                "completed": report["completed"],
                "failed": report["failed"],
                "ttft_ms_median": report["ttft_ms_median"],
                "output_throughput": report["output_throughput"],
                **{f"{name}_ms": metrics[f"{name}_ms"] for name in ("ttft", "tpot", "e2el")},
            }
            print(label, runs[label], flush=True)
    report = report_header("stream_hold", smoke=args.smoke) | {
        "quick": args.quick,
        "failed_requests": sum(run["failed"] for run in runs.values()),
        "hold_tokens_default": window,
        "escalation_positions": positions,
        "low_confidence_escalations_by_token": positions["0.5"]["low_confidence_by_token"],
        "ttft": runs,
        "ttft_p50_ms_local": runs["local"]["ttft_ms_median"],
        "ttft_p50_ms_auto_window": runs["auto_window"]["ttft_ms_median"],
        "ttft_p50_ms_auto_until_decided": runs["auto_until_decided"]["ttft_ms_median"],
        "ttft_ratio_window_vs_until_decided": runs["auto_window"]["ttft_ms_median"]
        / runs["auto_until_decided"]["ttft_ms_median"],
    }
    write_report(args.json, report, HEADLINE_KEYS)


if __name__ == "__main__":
    main()
