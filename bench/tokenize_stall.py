"""Do huge prompts stall the other streams? Stream ITL with and without a client posting the
largest bodies that pass the server's byte pre-check, in a loop.

    python -m bench.tokenize_stall [--quick | --smoke] --json bench/results/tokenize_stall.json

`tandem serve --cloud none` on the embedded SmolLM2; 8 clients stream chat answers (a short
prompt, 128 tokens, greedy, `ignore_eos`), `--rounds` requests each, through the local model's
own name (the shared OpenAI server's path). The load: one client posting, back to back, bodies
that pass sdk.serving.prompt_tokens' pre-check (their text is at most max_model_len x the
longest token's bytes) but take the tokenizer long: alternately one message of that many bytes
of words, and 10,000 two-letter messages (llama.cpp's special-token pass: ~1.3 s here). Both are
then refused as too long for the context. Phases alternate without and with the load, twice
(`--quick`: once, 2 rounds). Reported: per phase ITL p50/p90/p99 and TTFT p50 of the streams,
the bodies posted and their answers; key `itl_p99_ratio_under_max_bodies` (the median with-load
p99 over the median without; target <= 1.2) and its spread (min and max of the per-pair ratios).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.first_contact import stop
from bench.machine import report_header, write_report
from bench.serve_client import ClientConfig, send_request
from bench.serve_datasets import SampleRequest
from bench.serve_metrics import percentile
from bench.served_models import fetch_model_cards, own_chat_model_id
from bench.serve_servers import free_port
from bench.stream_hold import wait_healthy

REPO = Path(__file__).resolve().parents[1]
HEADLINE_KEYS = (
    "itl_p99_ratio_under_max_bodies",
    "itl_p99_ratio_spread",
    "itl_p99_ms_without",
    "itl_p99_ms_with",
    "bodies_posted",
)
TARGET = 1.2
STREAMS = 8
OUTPUT_TOKENS = 128
WORDS = "the of and to in is was for on that with as by at from it an be this are or".split()


def limits_of_server() -> tuple[int, int]:
    """(max_model_len, max_token_bytes) of the embedded model with tandem serve's defaults."""
    from local_runtime.config import LocalEngineConfig
    from local_runtime.engine import LocalEngine

    engine = LocalEngine(LocalEngineConfig())
    try:
        return engine.max_model_len, engine.backend.max_token_bytes()
    finally:
        engine.close()


def max_bodies(model: str, max_model_len: int, max_token_bytes: int) -> list[bytes]:
    """The two shapes of the largest bodies that pass the byte pre-check (module docstring)."""
    budget = max_model_len * max_token_bytes  # text bytes the pre-check lets through
    text, size = [], 0
    while size < budget - 8:
        word = WORDS[len(text) % len(WORDS)]
        text.append(word)
        size += len(word) + 1
    one = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": " ".join(text)[: budget - 8]}]}
    many = {
        "model": model,
        "max_tokens": 1,
        "messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"} for i in range(10_000)],
    }
    return [json.dumps(one).encode(), json.dumps(many).encode()]


async def streams(config: ClientConfig, rounds: int, output_tokens: int = OUTPUT_TOKENS) -> list:
    prompt = "Write a long story about a lighthouse keeper and the sea, in many short paragraphs."
    sample = SampleRequest(prompt, 24, output_tokens)
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=STREAMS + 2)) as client:

        async def worker() -> list:
            return [await send_request(client, config, sample) for _ in range(rounds)]

        return [result for results in await asyncio.gather(*(worker() for _ in range(STREAMS))) for result in results]


async def post_bodies(url: str, bodies: list[bytes], done: asyncio.Event, answers: dict) -> None:
    async with httpx.AsyncClient(timeout=600) as client:
        index = 0
        while not done.is_set():
            reply = await client.post(
                url, content=bodies[index % len(bodies)], headers={"Content-Type": "application/json"}
            )
            code = reply.json().get("error", {}).get("code") if reply.status_code != 200 else "ok"
            answers[f"{reply.status_code} {code}"] = answers.get(f"{reply.status_code} {code}", 0) + 1
            index += 1


async def phase(
    config: ClientConfig, rounds: int, bodies: list[bytes] | None, output_tokens: int = OUTPUT_TOKENS
) -> dict:
    done, answers = asyncio.Event(), {}
    loader = asyncio.create_task(post_bodies(config.url, bodies, done, answers)) if bodies else None
    started = time.monotonic()
    results = await streams(config, rounds, output_tokens)
    done.set()
    if loader is not None:
        await loader
    ok = [r for r in results if r.ok]
    itl = [gap for r in ok for gap in r.itl_s]
    return {
        "load": bodies is not None,
        "seconds": time.monotonic() - started,
        "requests": len(results),
        "failed": len(results) - len(ok),
        "itl_ms": {f"p{q}": 1000 * percentile(itl, q) for q in (50, 90, 99)},
        "ttft_ms_p50": 1000 * percentile([r.ttft_s for r in ok], 50),
        "bodies_answered": answers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--smoke", action="store_true", help="one round of 16-token streams, one pair of phases: checks the bench works"
    )
    parser.add_argument("--rounds", type=int, help="requests per stream client per phase (default 4; --quick 2)")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.smoke else 2 if args.quick else 4)
    pairs = 1 if args.quick or args.smoke else 2
    output_tokens = 16 if args.smoke else OUTPUT_TOKENS
    max_model_len, max_token_bytes = limits_of_server()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="tokenize-stall-") as tmp, open(Path(tmp) / "serve.log", "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "sdk.cli", "serve", "--cloud", "none", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_healthy(server, f"{base}/health")
            model = own_chat_model_id(fetch_model_cards(base))
            config = ClientConfig(base_url=base, model=model)
            bodies = max_bodies(model, max_model_len, max_token_bytes)
            asyncio.run(streams(config, 1, output_tokens))  # warm-up, not measured
            phases = []
            for _ in range(pairs):
                for load in (None, bodies):
                    phases.append(asyncio.run(phase(config, rounds, load, output_tokens)))
                    print(json.dumps(phases[-1]), flush=True)
        finally:
            stop(server)
    without = [p["itl_ms"]["p99"] for p in phases if not p["load"]]
    with_load = [p["itl_ms"]["p99"] for p in phases if p["load"]]
    ratios = [w / wo for w, wo in zip(with_load, without)]
    report = report_header("tokenize_stall", smoke=args.smoke) | {
        "quick": args.quick,
        "streams": STREAMS,
        "output_tokens": output_tokens,
        "rounds": rounds,
        "failed_requests": sum(p["failed"] for p in phases),
        "max_model_len": max_model_len,
        "max_token_bytes": max_token_bytes,
        "body_bytes": [len(b) for b in bodies],
        "phases": phases,
        "itl_p99_ms_without": statistics.median(without),
        "itl_p99_ms_with": statistics.median(with_load),
        "itl_p99_ratio_under_max_bodies": statistics.median(with_load) / statistics.median(without),
        "itl_p99_ratio_spread": [min(ratios), max(ratios)],
        "bodies_posted": sum(sum(p["bodies_answered"].values()) for p in phases if p["load"]),
        "target": {"itl_p99_ratio_under_max_bodies": TARGET},
        "target_met": statistics.median(with_load) / statistics.median(without) <= TARGET,
    }
    write_report(args.json, report, HEADLINE_KEYS)


if __name__ == "__main__":
    main()
