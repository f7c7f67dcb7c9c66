"""Soak test of `tandem serve`: thousands of mixed requests, then the server must be as it started.

    python -m bench.soak --json bench/results/soak.json [--quick]
    python -m bench.soak --base-url http://127.0.0.1:8000 [--pid PID] --json soak.json
    python -m bench.soak --budget-usd-per-day 2 --json bench/results/soak_budgets.json [--quick]

Starts `tandem serve` on the embedded default (the local SmolLM2 plus the PyTorch cloud
engine in the same process behind loopback gRPC) with one llama.cpp thread, unless
--base-url names a running server (its RSS then comes from --pid, else is unavailable).

Workload (seeded, bench/soak_workload.py): --num-requests (2000; --quick 60) streamed chat
requests, --concurrency (16) at a time in a closed loop, in index order. Prompts short
(a question), medium (a paragraph) or long (several paragraphs to summarise), weighted by
--prompt-shares; max_tokens uniform in --max-tokens (8..96; --quick 8..48); half greedy,
half sampled with a seed; models mostly `auto` (the cascade decides), some `auto:1` and
`cloud` (escalations forced onto the cloud engine), `local`, the local model's own name
(no routing), and `private: true` (must stay local); --cancel-fraction (10%) closed by
the client after a random number of content chunks; --invalid-fraction (2%) invalid on
purpose (counted as rejected_as_expected when the server answers 400/404). A warm-up request
per tier runs first, unmeasured.

Measured (bench/soak_client.py, bench/soak_probe.py): each request's outcome (completed,
cancelled_by_client, rejected_as_expected, failed by cause; a --timeout per request turns
a hang into `client_timeout`), tier and escalation from the last chunk's `tandem` field,
TTFT and E2E; /metrics (KV blocks, running and waiting requests, the cascade's counters)
and the server's RSS (VmRSS, RssAnon, RssFile) every 5% of requests, at the 10% mark, and at the end once
the server is idle (no request running or waiting and no KV block held, polled up to
--idle-timeout seconds). Reported (bench/soak_report.py): counts, failures by cause,
escalations by tier, KV blocks used at the end (target 0), RSS growth from the 10% mark to
the end (target <= 5%), p50/p99 E2E and TTFT of the first and last quarter of request
indices (less the opening burst and closing drain of `concurrency` requests each, when
the quarters are long enough) and their p99 drift ratio (last / first), throughput, and
`lost_requests` (no outcome recorded: must be 0). Exit code 0 unless the harness itself
broke: the JSON says which targets were met. The gauges are the local engine's and, where
/metrics exports them (tandem:cloud_engine_*), the embedded cloud engine's; the idle wait and
the KV target cover both. RSS samples split VmRSS into its anonymous and file-backed parts.

--budget-usd-per-day X (a server started here): budgets on, one hard USD limit per day for the
key, cloud prices set; the report's `budget` section checks the persisted spend against each
request's cost (bench/soak_budget.py); a 429 insufficient_quota is `refused_by_budget`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

import httpx
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.machine import machine_info, write_report
from bench.serve_report import console
from bench.served_models import fetch_model_cards, own_chat_model_id
from bench.serve_servers import ManagedServer, ServerStartError, free_port
from bench.soak_budget import bill_per_request, budget_report, write_budget_config
from bench.soak_client import run_soak
from bench.soak_probe import ServerProbe
from bench.soak_report import analyze, print_soak_summary
from bench.soak_workload import (
    DEFAULT_DATA_DIR,
    INVALID_BODIES,
    MODEL_MIX,
    PROMPT_KINDS,
    PromptPool,
    build_workload,
    describe_mix,
)

HEADLINE_KEYS = (
    "lost_requests",
    "kv_blocks_used_at_end",
    "rss_growth_pct_from_10pct",
    "p99_latency_drift_ratio",
    "targets",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--base-url", help="a running tandem serve; default: start one here")
    p.add_argument("--pid", type=int, help="with --base-url: the server's process id, for its RSS")
    p.add_argument("--num-requests", type=int, help="requests to send (default 2000; --quick 60)")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight (closed loop)")
    p.add_argument(
        "--max-tokens", type=int, nargs=2, metavar=("MIN", "MAX"), help="max_tokens range (8 96; --quick 8 48)"
    )
    p.add_argument(
        "--prompt-shares",
        type=float,
        nargs=3,
        default=tuple(PROMPT_KINDS.values()),
        metavar=("SHORT", "MEDIUM", "LONG"),
        help="weights of the prompt lengths (default 0.4 0.35 0.25)",
    )
    p.add_argument("--cancel-fraction", type=float, default=0.10, help="share the client closes mid-stream")
    p.add_argument("--invalid-fraction", type=float, default=0.02, help="share sent invalid on purpose")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request before client_timeout")
    p.add_argument("--idle-timeout", type=float, default=30.0, help="seconds to wait for the idle server at the end")
    p.add_argument("--threads", type=int, default=1, help="llama.cpp threads of the started server")
    p.add_argument("--max-model-len", type=int, default=1024, help="local context of the started server")
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra argument to tandem serve, repeatable; write --server-arg=--flag for flags",
    )
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="RouteLLM's data (prompts)")
    p.add_argument(
        "--budget-usd-per-day",
        type=float,
        help="budgets on: a hard USD limit per day for the key (bench/soak_budget.py)",
    )
    p.add_argument("--per-request", action="store_true", help="also write every request's record to the JSON")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--quick", action="store_true", help="60 requests of 8..48 tokens: a check in a few minutes")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="12 requests of 4..12 tokens, 4 at a time: checks the bench "
        "works (any failed or lost request then exits non-zero)",
    )
    args = p.parse_args(argv)
    args.command_line = "python -m bench.soak " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.num_requests is None:
        args.num_requests = 12 if args.smoke else 60 if args.quick else 2000
    if args.max_tokens is None:
        args.max_tokens = (4, 12) if args.smoke else (8, 48) if args.quick else (8, 96)
    if args.smoke:
        args.concurrency = min(args.concurrency, 4)
    if args.num_requests < 4 or args.concurrency < 1:
        p.error("need --num-requests >= 4 and --concurrency >= 1")
    if not 1 <= args.max_tokens[0] <= args.max_tokens[1]:
        p.error("--max-tokens MIN MAX needs 1 <= MIN <= MAX")
    if not (0 <= args.cancel_fraction <= 1 and 0 <= args.invalid_fraction <= 1):
        p.error("fractions must be in [0, 1]")
    if min(args.prompt_shares) < 0 or sum(args.prompt_shares) <= 0:
        p.error("--prompt-shares must be >= 0 and not all 0")
    args.prompt_shares = dict(zip(PROMPT_KINDS, args.prompt_shares))
    if args.pid is not None and not args.base_url:
        p.error("--pid goes with --base-url")
    if args.budget_usd_per_day is not None and (args.base_url or args.budget_usd_per_day <= 0):
        p.error("--budget-usd-per-day needs a positive value and a server started here (no --base-url)")
    return args


def embedded_server(args: argparse.Namespace, extra: tuple[str, ...] = ()) -> ManagedServer:
    """`tandem serve` with the default (embedded) cloud tier on a free port, TANDEM_* settings dropped."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "sdk.cli",
        "serve",
        "--port",
        str(port),
        "--threads",
        str(args.threads),
        "--max-model-len",
        str(args.max_model_len),
        "--log-level",
        "warning",
        *extra,
        *args.server_arg,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    return ManagedServer("tandem", command, port, "/health", "tandem serve, embedded cloud engine (default)", env=env)


def local_model_name(base_url: str) -> str:
    """The local model's own id: the chat model tandem serve runs itself (bench.served_models)."""
    return own_chat_model_id(fetch_model_cards(base_url))


def warm_up(base_url: str) -> dict:
    """One short request to each tier, unmeasured (the cloud engine's first request is slow)."""
    times = {}
    with httpx.Client(timeout=300.0, trust_env=False) as client:
        for model in ("local", "cloud"):
            # A `user` of its own: with budgets on, its cost gets a ledger row like every soak request's.
            response = client.post(
                base_url + "/v1/chat/completions",
                json={
                    "model": model,
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": "Say hello."}],
                    "user": f"soak-warm-up-{model}",
                },
            )
            if response.status_code != 200:
                raise RuntimeError(
                    f"warm-up request to {model!r} got HTTP {response.status_code}: {response.text[:300]}"
                )
            times[model] = response.elapsed.total_seconds()
    return times


async def soak(args: argparse.Namespace, base_url: str, pid: int | None, requests) -> tuple:
    probe = ServerProbe(base_url, pid, len(requests))
    await probe.sample("start", 0)
    columns = (
        TextColumn("[bold]soak"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("cancelled {task.fields[cancelled]} failed {task.fields[failed]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("soak", total=len(requests), cancelled=0, failed=0)
        counts = {"cancelled_by_client": 0, "failed": 0}

        def on_done(result, num_done: int) -> None:
            probe.on_done(result, num_done)
            if result.outcome in counts:
                counts[result.outcome] += 1
            progress.update(task, completed=num_done, cancelled=counts["cancelled_by_client"], failed=counts["failed"])

        probe.start_clock()
        results, duration = await run_soak(base_url, requests, args.concurrency, args.timeout, on_done)
    await probe.drain()
    end = await probe.wait_idle(args.idle_timeout)
    return results, duration, probe, end


def run(args: argparse.Namespace, base_url: str, pid: int | None, server_info: dict) -> tuple[dict, tuple]:
    """The report, and (requests, results) for the budget report (it reads the ledger once the server has stopped)."""
    warm = warm_up(base_url)
    pool = PromptPool(args.data_dir)
    requests = build_workload(
        args.num_requests,
        args.seed,
        tuple(args.max_tokens),
        args.cancel_fraction,
        args.invalid_fraction,
        local_model_name(base_url),
        pool,
        args.prompt_shares,
    )
    if args.budget_usd_per_day is not None:
        bill_per_request(requests)
    results, duration, probe, end = asyncio.run(soak(args, base_url, pid, requests))
    report = {
        "benchmark": "soak",
        "command": args.command_line,
        "machine": machine_info(),
        "server": {**server_info, "base_url": base_url, "pid": pid, "warm_up_s": warm},
        "config": {
            "num_requests": args.num_requests,
            "concurrency": args.concurrency,
            "seed": args.seed,
            "max_tokens": list(args.max_tokens),
            "cancel_fraction": args.cancel_fraction,
            "invalid_fraction": args.invalid_fraction,
            "timeout_s": args.timeout,
            "idle_timeout_s": args.idle_timeout,
            "prompts": pool.source,
            "model_shares": MODEL_MIX,
            "prompt_shares": args.prompt_shares,
            "invalid_kinds": {k: v[1] for k, v in INVALID_BODIES.items()},
            "mix": describe_mix(requests),
        },
    }
    report.update(analyze(requests, results, duration, probe.mark_sample(), end, trim=args.concurrency))
    report["server_end_counters"] = end.get("counters", {})
    report["samples"] = [{k: v for k, v in s.items() if k != "counters"} for s in probe.samples]
    report["probe_errors"] = probe.errors
    if args.per_request:
        report["per_request"] = [
            {**req.summary(), **(vars(res) if res else {"outcome": None})} for req, res in zip(requests, results)
        ]
    return report, (requests, results)


def _log_findings(path: str) -> dict:
    """Tracebacks and error/warning lines the server logged (at --log-level warning)."""
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return {"log_path": path, "readable": False}
    flagged = [line for line in lines if "Traceback" in line or "ERROR" in line or "WARNING" in line]
    return {
        "log_path": path,
        "lines": len(lines),
        "tracebacks": sum("Traceback" in line for line in lines),
        "flagged_lines": len(flagged),
        "flagged_samples": flagged[:10],
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        if args.base_url:
            base_url = args.base_url.rstrip("/").removesuffix("/v1")
            report, _ = run(args, base_url, args.pid, {"started_here": False})
        else:
            budget = None
            if args.budget_usd_per_day is not None:
                budget = write_budget_config(
                    Path(tempfile.mkdtemp(prefix="tandem-soak-budget-")), args.budget_usd_per_day
                )
            server = embedded_server(args, ("--config", budget["config"]) if budget else ())
            with server:
                console.print(f"tandem serve ready on {server.base_url} after {server.startup_s:.1f}s")
                report, outcome = run(
                    args,
                    server.base_url,
                    server.process.pid,
                    {"started_here": True, "command": " ".join(server.command[1:]), "startup_s": server.startup_s},
                )
            report["server"]["exit_code"] = server.process.returncode
            report["server"]["log"] = _log_findings(server.log_path)
            if budget is not None:  # read back what the stopped server persisted
                report["budget"] = budget_report(budget["spend_path"], args.budget_usd_per_day, *outcome)
                report["targets"].update({f"budget_{k}": v for k, v in report["budget"]["targets"].items()})
    except (ServerStartError, RuntimeError, httpx.HTTPError) as exc:
        raise SystemExit(f"bench.soak: {exc}") from None
    print_soak_summary(report)
    report["smoke"] = args.smoke
    if args.smoke:  # a full soak records failures as findings (its targets); a smoke run that has any is broken
        report["failed_requests"] = report["requests"]["failed"] + report["lost_requests"]
    if args.json:
        write_report(args.json, report, HEADLINE_KEYS)
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
