"""What sharing the books through PostgreSQL costs `tandem cloud serve` (issue 54).

    python -m bench.state_db --json bench/results/state_db.json [--quick | --smoke]

Two `tandem cloud serve` processes on the embedded default (SmolLM2-135M, the cloud engine), the
same settings but where the books live: `local` (this process: SQLite spend, memory buckets) and
`state_db` (a throwaway PostgreSQL every replica would share: bench/postgres_server.py). Both bill
and limit every request: API keys (so the failed-key backoff is looked up), a rate limit and a
limit on requests in flight that never refuse, a budgets file with a USD limit never reached (so
every request reserves and settles), nonzero prices.

Load: --num-requests (256; --quick 128; --smoke 16) short completions (max_tokens 8, ignore_eos,
greedy) at --concurrency 32 over HTTP, the same prompts for both; the two servers take turns,
--repeats times (3; --quick 2; --smoke 1), the idle one SIGSTOPped (it takes no CPU). Per run:
output tokens a second (completion tokens / wall time) and each request's latency.

Also per run, the CPU seconds the server process (with its children) and the PostgreSQL server (the
postmaster and its backends) used during it, per request (`cpu_ms_per_request`, read from /proc): what
the books cost in CPU on these shared cores, besides the wall time, which moves with the machine.

Reported: `ratio_output_tps_state_db_vs_local` (median over the repetitions, with the spread of the
per-repetition ratios; target >= 0.95 beyond the spread); `added_latency_p50_ms` / `added_latency_p99_ms`:
what a request pays end to end for the shared books, the state_db run's latency p50 (p99) less the
local run's of the same repetition (median, with the spread); and, to say where that goes, what the
books alone cost (`bookkeeping`): in this process, against the same database, the calls a request
waits for (the gate's admission: backoff, bucket and slot; the soft-budget warning; the reservation),
one request at a time (`c1`) and --concurrency released at once (`burst`: all on
one key, so they queue on its rows), p50 and p99, on both books. The settle and the slot's return
are deferred (the answer never waits for them) and not in it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.machine import report_header, write_report
from bench.postgres_server import ThrowawayPostgres
from bench.repetitions import median_and_spread, nearest_rank
from bench.serve_servers import ManagedServer, free_port

KEY = "sk-bench-state-db-0123456789"
MAX_TOKENS = 8
CONCURRENCY = 32
TARGET_RATIO = 0.95
PRICES = ("--price-input-per-million", "1.0", "--price-output-per-million", "2.0")
BUDGETS = "[default]\nusd_per_day = 1000000.0\n\n[per_user]\nusd_per_day = 1000000.0\n"


def cloud_server(folder: Path, mode: str, state_db_url: str | None, threads: int) -> ManagedServer:
    port = free_port()
    command = [sys.executable, "-m", "sdk.cli", "cloud", "serve", "--model-name", "smollm2"]
    command += ["--port", str(port), "--grpc-port", str(free_port()), "--threads", str(threads)]
    command += ["--max-num-seqs", str(CONCURRENCY), "--log-level", "warning", *PRICES]
    command += ["--api-key-file", str(folder / "keys"), "--budgets-file", str(folder / "budgets.toml")]
    command += ["--rate-limit", "1000000", "--max-concurrent-per-key", "100000"]
    command += ["--spend-path", str(folder / f"spend-{mode}.sqlite3")]
    if state_db_url:
        command += ["--state-db", state_db_url]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    return ManagedServer(
        mode,
        command,
        port,
        "/health",
        f"tandem cloud serve, books: {mode}",
        env=env,
        log_path=str(folder / f"{mode}.log"),
    )


def tree_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process `pid` and its live descendants (Linux /proc; 0 without one)."""
    if pid is None or not os.path.isdir("/proc"):
        return 0.0
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))  # fields[1]: the parent's pid
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        total += times.get(current, 0.0)
        stack.extend(children.get(current, []))
    return total


async def load(base_url: str, num_requests: int, concurrency: int) -> dict:
    """`num_requests` completions, `concurrency` at a time: output tokens a second and latencies (ms)."""
    gate = asyncio.Semaphore(concurrency)
    latencies, tokens, failed = [], 0, 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=base_url, timeout=120, limits=limits, headers={"Authorization": f"Bearer {KEY}"}
    ) as http:

        async def one(index: int) -> None:
            nonlocal tokens, failed
            body = {
                "model": "smollm2",
                "prompt": f"Request {index}: name a colour.",
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
                "user": f"user-{index % 8}",
            }
            async with gate:
                started = time.perf_counter()
                reply = await http.post("/v1/completions", json=body)
                latencies.append(1000 * (time.perf_counter() - started))
            if reply.status_code != 200:
                failed += 1
                return
            tokens += reply.json()["usage"]["completion_tokens"]

        began = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(num_requests)))
        wall = time.perf_counter() - began
    return {
        "output_tps": tokens / wall,
        "wall_s": wall,
        "latency_p50_ms": nearest_rank(latencies, 0.5),
        "latency_p99_ms": nearest_rank(latencies, 0.99),
        "failed": failed,
    }


async def bookkeeping(folder: Path, state_db_url: str | None, num_requests: int, concurrency: int) -> dict:
    """What a request waits on for its books, measured in this process: p50/p99 ms per request, one
    at a time and `concurrency` released together."""
    from router.costs import TierPrices
    from sdk.budgets.manager import BudgetManager
    from sdk.serving.access_gate import AccessGate
    from sdk.serving.client_limits import ClientLimits

    db = None
    if state_db_url:
        from sdk.budgets.postgres_ledger import PostgresSpendLedger
        from sdk.serving.shared_limits import shared_client_limits
        from sdk.state.database import StateDatabase

        db = await StateDatabase(state_db_url).open()
        ledger = PostgresSpendLedger(db)
        limits = shared_client_limits(db, 1_000_000, None, 100_000, 10, 300.0)
    else:
        from sdk.budgets.ledger import SpendLedger

        ledger = SpendLedger(folder / "bookkeeping.sqlite3").start()
        limits = ClientLimits.build(1_000_000, None, 100_000)
    budgets = BudgetManager(str(folder / "budgets.toml"), ledger, prices_are_zero=False, cloud_only=True)
    gate = AccessGate({KEY}, limits)
    prices = TierPrices(1.0, 2.0)

    async def one(index: int, waits: list[float]) -> None:
        user = f"user-{index % 8}"
        started = time.perf_counter()
        admission = await gate.admit(KEY, "127.0.0.1", "bench")
        await budgets.soft_warning("bench", user)
        reservation, _ = await budgets.reserve("bench", user, prices.cost(16, MAX_TOKENS))
        waits.append(1000 * (time.perf_counter() - started))
        budgets.settle(reservation, "bench", user, prices.cost(8, MAX_TOKENS), 16, 16)
        gate.release(admission)

    one_at_a_time: list[float] = []
    for index in range(num_requests):
        await one(index, one_at_a_time)
    burst: list[float] = []
    for start in range(0, num_requests, concurrency):
        await asyncio.gather(*(one(i, burst) for i in range(start, min(num_requests, start + concurrency))))
    if db is not None:
        await db.flush()
        await db.close()
    else:
        ledger.close()
    return {
        name: {
            "p50_ms": nearest_rank(waits, 0.5),
            "p99_ms": nearest_rank(waits, 0.99),
            "mean_ms": statistics.mean(waits),
        }
        for name, waits in (("c1", one_at_a_time), ("burst", burst))
    }


def run(args: argparse.Namespace) -> dict:
    num_requests = args.num_requests or (16 if args.smoke else 128 if args.quick else 256)
    repeats = args.repeats or (1 if args.smoke else 2 if args.quick else 3)
    threads = args.threads or os.cpu_count() or 1
    folder = Path(tempfile.mkdtemp(prefix="bench-state-db-"))
    (folder / "keys").write_text(f"{KEY}\n")
    (folder / "budgets.toml").write_text(BUDGETS)
    runs: dict[str, list[dict]] = {"local": [], "state_db": []}
    with ThrowawayPostgres() as postgres:
        servers = {
            "local": cloud_server(folder, "local", None, threads),
            "state_db": cloud_server(folder, "state_db", postgres.url, threads),
        }
        try:
            for server in servers.values():
                server.start()
                asyncio.run(load(server.base_url, 8, 8))  # warm-up, unmeasured
                server.pause()
            for repeat in range(repeats):
                # Alternate which goes first, so a drift of the machine does not favour one.
                order = ["local", "state_db"] if repeat % 2 == 0 else ["state_db", "local"]
                for mode in order:
                    server = servers[mode]
                    server.resume()
                    time.sleep(0.5)
                    cpu_before = tree_cpu_s(server.process.pid), tree_cpu_s(postgres.postmaster_pid())
                    result = asyncio.run(load(server.base_url, num_requests, args.concurrency))
                    cpu_after = tree_cpu_s(server.process.pid), tree_cpu_s(postgres.postmaster_pid())
                    result["server_cpu_ms_per_request"] = 1000 * (cpu_after[0] - cpu_before[0]) / num_requests
                    result["postgres_cpu_ms_per_request"] = 1000 * (cpu_after[1] - cpu_before[1]) / num_requests
                    runs[mode].append(result)
                    server.pause()
        finally:
            for server in servers.values():
                server.resume()
                server.stop()
        books = {
            "local": asyncio.run(bookkeeping(folder, None, num_requests, args.concurrency)),
            "state_db": asyncio.run(bookkeeping(folder, postgres.url, num_requests, args.concurrency)),
        }
    ratios = [s["output_tps"] / local["output_tps"] for s, local in zip(runs["state_db"], runs["local"])]
    ratio, spread = median_and_spread(ratios)
    pairs = list(zip(runs["state_db"], runs["local"]))
    added_p50, added_p50_spread = median_and_spread(
        [s["latency_p50_ms"] - local["latency_p50_ms"] for s, local in pairs]
    )
    added_p99, added_p99_spread = median_and_spread(
        [s["latency_p99_ms"] - local["latency_p99_ms"] for s, local in pairs]
    )
    report = report_header("state_db", smoke=args.smoke)
    report.update(
        {
            "config": {
                "model": "embedded default (SmolLM2-135M-Instruct, cloud engine)",
                "num_requests": num_requests,
                "concurrency": args.concurrency,
                "max_tokens": MAX_TOKENS,
                "repeats": repeats,
                "threads": threads,
                "postgres": "throwaway, localhost, fsync off (bench/postgres_server.py)",
            },
            "baseline": "the same tandem cloud serve with its books in this process (SQLite spend, memory limits)",
            "runs": runs,
            "failed_requests": sum(run["failed"] for mode in runs.values() for run in mode),
            "ratio_output_tps_state_db_vs_local": ratio,
            "ratio_output_tps_state_db_vs_local_spread": spread,
            "latency_p50_ms": {mode: median_and_spread([r["latency_p50_ms"] for r in runs[mode]]) for mode in runs},
            "latency_p99_ms": {mode: median_and_spread([r["latency_p99_ms"] for r in runs[mode]]) for mode in runs},
            "bookkeeping": books,
            "cpu_ms_per_request": {
                mode: {
                    part: median_and_spread([r[f"{part}_cpu_ms_per_request"] for r in runs[mode]])
                    for part in ("server", "postgres")
                }
                for mode in runs
            },
            "added_latency_p50_ms": added_p50,
            "added_latency_p50_ms_spread": added_p50_spread,
            "added_latency_p99_ms": added_p99,
            "added_latency_p99_ms_spread": added_p99_spread,
            "targets": {"ratio_output_tps_state_db_vs_local": f">= {TARGET_RATIO} beyond the spread"},
            "targets_met": {"ratio_output_tps_state_db_vs_local": spread[0] >= TARGET_RATIO},
        }
    )
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="write the report here")
    parser.add_argument("--quick", action="store_true", help="128 requests, 2 repetitions")
    parser.add_argument("--smoke", action="store_true", help="16 requests, 1 repetition: checks the bench works")
    parser.add_argument("--num-requests", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    parser.add_argument("--threads", type=int, default=None, help="torch threads of each server (default: all cores)")
    args = parser.parse_args(argv)
    report = run(args)
    write_report(
        args.json,
        report,
        (
            "ratio_output_tps_state_db_vs_local",
            "ratio_output_tps_state_db_vs_local_spread",
            "added_latency_p50_ms",
            "added_latency_p99_ms",
        ),
    )


if __name__ == "__main__":
    main()
