"""The soak's numbers from its per-request results and server samples, and its summary table."""

from __future__ import annotations

from collections import Counter

from rich.table import Table

from bench.serve_metrics import summarize_ms
from bench.serve_report import console
from bench.soak_client import OUTCOMES, SoakResult
from bench.soak_workload import SoakRequest

TARGET_RSS_GROWTH_PCT = 5.0


def _counts(values) -> dict:
    return dict(sorted(Counter("none" if v is None else str(v) for v in values).items()))


def quarter_ranges(n: int, trim: int) -> dict[str, range]:
    """The first and last quarter of request indices, without the first and last `trim` requests
    (the closed loop's opening burst and closing drain) when each quarter keeps at least `trim`."""
    q = n // 4
    cut = trim if q - trim >= max(trim, 1) else 0
    return {"first": range(cut, q), "last": range(n - q, n - cut)}


def quarter_latencies(requests: list[SoakRequest], results: list[SoakResult | None], trim: int = 0) -> dict:
    """E2E and TTFT of completed requests in the first and last quarter of request indices."""
    out = {}
    for name, indices in quarter_ranges(len(requests), trim).items():
        done = [results[i] for i in indices if results[i] is not None and results[i].outcome == "completed"]
        out[name] = {
            "indices": [indices.start, indices.stop - 1] if len(indices) else None,
            "e2e_ms": summarize_ms([r.e2e_s for r in done]),
            "ttft_ms": summarize_ms([r.ttft_s for r in done if r.ttft_s is not None]),
        }
    return out


def _ratio(last, first):
    return None if last is None or not first else last / first


def analyze(
    requests: list[SoakRequest],
    results: list[SoakResult | None],
    duration_s: float,
    mark: dict | None,
    end: dict,
    trim: int = 0,
) -> dict:
    """Every figure of the report (but command, machine and config)."""
    recorded = [r for r in results if r is not None and r.outcome]
    lost = len(results) - len(recorded)
    outcomes = {o: sum(r.outcome == o for r in recorded) for o in OUTCOMES}
    failed = [r for r in recorded if r.outcome == "failed"]
    completed = [r for r in recorded if r.outcome == "completed"]
    kinds = {req.index: req.model_kind for req in requests}
    routed = [r for r in completed if r.tier is not None]
    tiers_by_kind: dict = {}
    for r in completed:
        tiers_by_kind.setdefault(kinds[r.index], Counter())[r.tier or "unrouted"] += 1
    violations = {
        "private_answered_by_cloud": sum(kinds[r.index] == "private" and r.tier == "cloud" for r in completed),
        "local_answered_by_cloud": sum(kinds[r.index] == "local" and r.tier == "cloud" for r in completed),
        "cloud_answered_by_local_not_degraded": sum(
            kinds[r.index] == "cloud" and r.tier == "local" and not r.degraded_reason for r in completed
        ),
    }
    quarters = quarter_latencies(requests, results, trim)
    rss_mark, rss_end = (mark or {}).get("rss_mb"), end.get("rss_mb")
    growth = None if rss_mark is None or rss_end is None else (rss_end - rss_mark) / rss_mark * 100.0
    output_tokens = sum(r.completion_tokens or r.content_chunks for r in completed)
    kv_used, cloud_kv_used = end.get("kv_blocks_used"), end.get("cloud_engine_kv_blocks_used")
    return {
        "duration_s": duration_s,
        "requests": {
            "total": len(requests),
            **outcomes,
            "lost": lost,
            "planned_cancels_not_reached": sum(r.cancel_not_reached for r in recorded),
            "failures_by_cause": _counts(r.cause for r in failed),
            "failure_samples": [
                {
                    "index": r.index,
                    "cause": r.cause,
                    "http_status": r.http_status,
                    "model_kind": kinds[r.index],
                    "detail": r.detail,
                }
                for r in failed[:10]
            ],
            "rejected_by_status": _counts(r.http_status for r in recorded if r.outcome == "rejected_as_expected"),
        },
        "lost_requests": lost,
        "escalations": {
            "completed_by_tier": _counts(r.tier or "unrouted" for r in completed),
            "escalated_by_tier": _counts(r.tier for r in routed if r.escalated),
            "route_reasons": _counts(r.route_reason for r in routed),
            "degraded_to_local_by_reason": _counts(r.degraded_reason for r in routed if r.degraded_reason),
            "tiers_by_model_kind": {k: dict(sorted(v.items())) for k, v in sorted(tiers_by_kind.items())},
            "routing_violations": violations,
        },
        "kv_blocks_used_at_end": kv_used,
        "kv_blocks_total": end.get("kv_blocks_total"),
        "cloud_kv_blocks_used_at_end": cloud_kv_used,
        "cloud_kv_blocks_total": end.get("cloud_engine_kv_blocks_total"),
        "kv_note": "local engine's pool and the embedded cloud engine's (/metrics: tandem:kv_blocks_used, "
        "tandem:cloud_engine_kv_blocks_used; None: not exported); idle, neither prefix cache holds a "
        "block (the local one shares only blocks live requests hold; the cloud one's cached blocks are "
        "free and evictable), so anything above 0 is leaked",
        "rss_mb_at_10pct": rss_mark,
        "rss_mb_at_end": rss_end,
        "rss_growth_pct_from_10pct": growth,
        "target_rss_growth_pct": TARGET_RSS_GROWTH_PCT,
        "latency_quarters_by": (
            "request index: the first and last N/4 requests, completed ones only, less the "
            "first and last `concurrency` requests (opening burst, closing drain) when each "
            "quarter keeps at least that many; `indices` gives the ranges used"
        ),
        "latency_quarters": quarters,
        "p99_latency_drift_ratio": _ratio(quarters["last"]["e2e_ms"]["p99"], quarters["first"]["e2e_ms"]["p99"]),
        "p99_ttft_drift_ratio": _ratio(quarters["last"]["ttft_ms"]["p99"], quarters["first"]["ttft_ms"]["p99"]),
        "latency_all_completed": {
            "e2e_ms": summarize_ms([r.e2e_s for r in completed]),
            "ttft_ms": summarize_ms([r.ttft_s for r in completed if r.ttft_s is not None]),
        },
        "throughput": {
            "completed_requests_per_s": len(completed) / duration_s,
            "finished_requests_per_s": len(recorded) / duration_s,
            "output_tokens_per_s": output_tokens / duration_s,
            "output_tokens": output_tokens,
        },
        "targets": {
            "lost_requests_zero": lost == 0,
            "failures_zero": outcomes["failed"] == 0,
            "kv_blocks_zero_at_end": kv_used == 0 and not cloud_kv_used,
            "rss_growth_met": None if growth is None else growth <= TARGET_RSS_GROWTH_PCT,
            "routing_violations_zero": not any(violations.values()),
        },
    }


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}"


def print_soak_summary(report: dict) -> None:
    req, esc, q = report["requests"], report["escalations"], report["latency_quarters"]
    table = Table(title=f"Soak: {req['total']} requests at concurrency {report['config']['concurrency']}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [
        ("duration (s)", _fmt(report["duration_s"])),
        ("completed / cancelled by client", f"{req['completed']} / {req['cancelled_by_client']}"),
        (
            "rejected as expected / refused by budget / failed",
            f"{req['rejected_as_expected']} / {req['refused_by_budget']} / {req['failed']}",
        ),
        ("lost requests", _fmt(report["lost_requests"])),
        ("completed by tier", ", ".join(f"{k} {v}" for k, v in esc["completed_by_tier"].items()) or "-"),
        (
            "degraded to local (cloud failed)",
            ", ".join(f"{k} {v}" for k, v in esc["degraded_to_local_by_reason"].items()) or "-",
        ),
        ("escalated (by answering tier)", ", ".join(f"{k} {v}" for k, v in esc["escalated_by_tier"].items()) or "-"),
        (
            "KV blocks used at end / total",
            f"{_fmt(report['kv_blocks_used_at_end'], 0)} / {_fmt(report['kv_blocks_total'], 0)}",
        ),
        (
            "cloud engine KV blocks used at end / total",
            f"{_fmt(report.get('cloud_kv_blocks_used_at_end'), 0)} / {_fmt(report.get('cloud_kv_blocks_total'), 0)}",
        ),
        ("RSS MiB at 10% / end", f"{_fmt(report['rss_mb_at_10pct'])} / {_fmt(report['rss_mb_at_end'])}"),
        ("RSS growth % (target <= 5)", _fmt(report["rss_growth_pct_from_10pct"], 2)),
        (
            "E2E p50 ms first / last quarter",
            f"{_fmt(q['first']['e2e_ms']['median'], 0)} / {_fmt(q['last']['e2e_ms']['median'], 0)}",
        ),
        (
            "E2E p99 ms first / last quarter",
            f"{_fmt(q['first']['e2e_ms']['p99'], 0)} / {_fmt(q['last']['e2e_ms']['p99'], 0)}",
        ),
        (
            "TTFT p99 ms first / last quarter",
            f"{_fmt(q['first']['ttft_ms']['p99'], 0)} / {_fmt(q['last']['ttft_ms']['p99'], 0)}",
        ),
        ("p99 E2E drift (last / first)", _fmt(report["p99_latency_drift_ratio"], 2)),
        (
            "throughput (completed req/s, out tok/s)",
            f"{_fmt(report['throughput']['completed_requests_per_s'], 2)}, "
            f"{_fmt(report['throughput']['output_tokens_per_s'])}",
        ),
    ]
    budget = report.get("budget")
    if budget:
        rows += [
            (
                "budget: persisted total / per-request sum (USD)",
                f"{budget['persisted_key_total_usd']:.6f} / {budget['persisted_per_request_sum_usd']:.6f}",
            ),
            (
                "budget: drift (USD) / mismatched requests",
                f"{budget['drift_usd']:.2e} / {budget['mismatched_requests']}",
            ),
            (
                "budget: limit (USD) / refused / kept local",
                f"{budget['usd_per_day']:g} / {budget['refused_by_budget']} / {budget['kept_local_budget_exhausted']}",
            ),
        ]
    for label, value in rows:
        table.add_row(label, value)
    console.print(table)
    for cause, count in req["failures_by_cause"].items():
        console.print(f"[red]failed ({cause}):[/red] {count}")
    for name, met in report["targets"].items():
        console.print(f"{name}: {'[green]met' if met else '[red]NOT met' if met is False else '[yellow]n/a'}")
