"""bench.soak: the workload, the client's outcomes on canned streams, the report's arithmetic,
and a small soak against a real `tandem serve` (embedded cloud engine) it starts itself."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import pytest

from bench.serve_servers import REPO_ROOT
from bench.soak_client import SoakResult, send_soak_request
from bench.soak_probe import ServerProbe, parse_metrics
from bench.soak_report import analyze, quarter_ranges
from bench.soak_workload import PromptPool, SoakRequest, build_workload, describe_mix


def _workload(num=400, seed=3, data_dir=None):
    pool = PromptPool(data_dir) if data_dir else PromptPool()
    return build_workload(num, seed, (8, 96), 0.1, 0.02, "tiny-model", pool)


def test_workload_is_seeded_and_mixed(tmp_path):
    first = _workload()
    assert [r.body for r in first] == [r.body for r in _workload()]
    assert [r.body for r in first] != [r.body for r in _workload(seed=4)]
    mix = describe_mix(first)
    assert set(mix["model_kinds"]) == {"auto", "auto:1", "cloud", "local", "private", "direct", "invalid"}
    assert 20 <= mix["planned_cancels"] <= 60 and 1 <= mix["invalid"] <= 20
    valid = [r for r in first if r.expect_status == 200]
    assert all(8 <= r.body["max_tokens"] <= 96 and r.body["stream"] for r in valid)
    assert all(r.body.get("private") is True for r in valid if r.model_kind == "private")
    assert all(r.body["model"] == "tiny-model" for r in valid if r.model_kind == "direct")
    assert all(0 < r.cancel_after_chunks <= max(1, r.body["max_tokens"] // 2) for r in first if r.cancel_after_chunks)
    lengths = {
        kind: [len(r.body["messages"][0]["content"]) for r in valid if r.prompt_kind == kind]
        for kind in ("short", "medium", "long")
    }
    assert max(lengths["short"]) < min(lengths["long"]) and max(lengths["long"]) < 2200
    # Without RouteLLM's data the prompts are built, still seeded.
    built = _workload(data_dir=str(tmp_path))
    assert [r.body for r in built] == [r.body for r in _workload(data_dir=str(tmp_path))]
    assert PromptPool(str(tmp_path)).source.startswith("built")


def test_parse_metrics_keeps_gauges_and_labelled_counters():
    text = (
        "# HELP x\ntandem:kv_blocks_used 3.0\ntandem:num_requests_running 0.0\n"
        'tandem:cascade_requests_total{escalated="true",tier="cloud"} 7.0\n'
        'tandem:e2e_request_latency_seconds_bucket{le="1.0"} 2.0\n'
    )
    values = parse_metrics(text)
    assert values == {
        "kv_blocks_used": 3.0,
        "num_requests_running": 0.0,
        'cascade_requests_total{escalated="true",tier="cloud"}': 7.0,
    }
    probe = ServerProbe("http://x/v1", None, 2000)
    assert probe.metrics_url == "http://x/metrics" and probe.mark_done == 200
    assert len(probe.marks) == 20 and 2000 in probe.marks


# -- the client on canned responses ---------------------------------------------------------------


def _sse(*chunks, done=True) -> bytes:
    lines = [f"data: {json.dumps(c)}" for c in chunks] + (["data: [DONE]"] if done else [])
    return ("\n\n".join(lines) + "\n\n").encode()


def _delta(content=None, finish=None, tandem=None) -> dict:
    chunk = {"choices": [{"index": 0, "delta": {"content": content} if content else {}, "finish_reason": finish}]}
    if tandem:
        chunk["tandem"] = tandem
    return chunk


ROUTED = {"tier": "cloud", "escalated": True, "reason": "low_confidence", "degraded": False}


def _send(handler, cancel_after=0, expect_status=200, timeout_s=5.0) -> SoakResult:
    request = SoakRequest(0, {"model": "auto", "stream": True}, "auto", "short", cancel_after, expect_status)

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await send_soak_request(client, "http://test/v1/chat/completions", request, 0.0, timeout_s)

    return asyncio.run(go())


def _body(status: int, content: bytes):
    return lambda request: httpx.Response(status, content=content)


def test_client_outcomes():
    usage = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}
    ok = _send(_body(200, _sse(_delta("a"), _delta("b"), _delta("c", "stop", ROUTED), usage)))
    assert (ok.outcome, ok.tier, ok.escalated, ok.route_reason, ok.completion_tokens) == (
        "completed",
        "cloud",
        True,
        "low_confidence",
        3,
    )
    assert ok.content_chunks == 3 and 0 < ok.ttft_s <= ok.e2e_s
    cancelled = _send(_body(200, _sse(_delta("a"), _delta("b"), _delta("c", "stop"))), cancel_after=2)
    assert cancelled.outcome == "cancelled_by_client" and cancelled.content_chunks == 2 and not cancelled.cause
    short = _send(_body(200, _sse(_delta("a", "stop"))), cancel_after=5)
    assert short.outcome == "completed" and short.cancel_not_reached
    cases = {
        "stream_ended_without_done": _body(200, _sse(_delta("a", "stop"), done=False)),
        "no_finish_reason": _body(200, _sse(_delta("a"))),
        "stream_error:engine_dead": _body(200, _sse(_delta("a"), {"error": {"code": "engine_dead"}})),
        "http_503:overloaded": _body(503, b'{"error": {"code": "overloaded", "type": "x"}}'),
        "http_500:unparsable_body": _body(500, b"oops"),
    }
    for cause, handler in cases.items():
        result = _send(handler)
        assert (result.outcome, result.cause) == ("failed", cause)
    assert (
        _send(_body(400, b'{"error": {"type": "invalid_request_error"}}'), expect_status=400).outcome
        == "rejected_as_expected"
    )
    wrong = _send(_body(200, _sse(_delta("a", "stop"))), expect_status=400)
    assert (wrong.outcome, wrong.cause) == ("failed", "unexpected_status_200_wanted_400")

    async def hang(request):
        await asyncio.sleep(10)

    timed_out = _send(hang, timeout_s=0.2)
    assert (timed_out.outcome, timed_out.cause) == ("failed", "client_timeout") and timed_out.e2e_s < 5

    def refuse(request):
        raise httpx.ConnectError("refused")

    assert _send(refuse).cause == "exception:ConnectError"


def test_analyze_counts_quarters_and_targets():
    requests = [
        SoakRequest(i, {"model": "auto", "max_tokens": 8}, "cloud" if i % 2 else "auto", "short") for i in range(8)
    ]
    results = [
        SoakResult(
            i,
            outcome="completed",
            tier="cloud" if i % 2 else "local",
            escalated=False,
            route_reason="forced",
            e2e_s=1.0 + i,
            ttft_s=0.5,
            completion_tokens=4,
        )
        for i in range(8)
    ]
    results[2] = SoakResult(2, outcome="failed", cause="client_timeout")
    results[3] = SoakResult(
        3,
        outcome="completed",
        tier="local",
        degraded_reason="cloud_timeout",
        e2e_s=4.0,
        ttft_s=0.5,
        completion_tokens=4,
    )
    results[5] = None  # lost
    report = analyze(requests, results, 10.0, {"rss_mb": 100.0}, {"rss_mb": 104.0, "kv_blocks_used": 0.0})
    req = report["requests"]
    assert (req["completed"], req["failed"], req["lost"], report["lost_requests"]) == (6, 1, 1, 1)
    assert req["failures_by_cause"] == {"client_timeout": 1}
    assert report["escalations"]["degraded_to_local_by_reason"] == {"cloud_timeout": 1}
    assert report["escalations"]["routing_violations"]["cloud_answered_by_local_not_degraded"] == 0
    assert report["rss_growth_pct_from_10pct"] == pytest.approx(4.0)
    assert report["targets"] == {
        "lost_requests_zero": False,
        "failures_zero": False,
        "kv_blocks_zero_at_end": True,
        "rss_growth_met": True,
        "routing_violations_zero": True,
    }
    quarters = report["latency_quarters"]  # indices 0-1 and 6-7
    assert quarters["first"]["e2e_ms"]["median"] == pytest.approx(1500.0)
    assert quarters["last"]["e2e_ms"]["median"] == pytest.approx(7500.0)
    assert report["p99_latency_drift_ratio"] == pytest.approx(7990.0 / 1990.0)
    assert report["throughput"]["output_tokens"] == 24
    json.dumps(report, allow_nan=False)
    assert quarter_ranges(2000, 16) == {"first": range(16, 500), "last": range(1500, 1984)}
    leaked = analyze(requests, results, 10.0, None, {"kv_blocks_used": 0.0, "cloud_engine_kv_blocks_used": 3.0})
    assert leaked["cloud_kv_blocks_used_at_end"] == 3.0 and not leaked["targets"]["kv_blocks_zero_at_end"]
    assert quarter_ranges(60, 16) == {"first": range(0, 15), "last": range(45, 60)}  # too short to trim


# -- a real server ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_small_soak_against_tandem_serve(tmp_path):
    out = tmp_path / "soak.json"
    # Small enough for about a minute on 2 shared cores (the embedded cloud engine shares them).
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.soak",
            "--num-requests",
            "28",
            "--concurrency",
            "8",
            "--max-tokens",
            "8",
            "16",
            "--prompt-shares",
            "0.65",
            "0.3",
            "0.05",
            "--cancel-fraction",
            "0.15",
            "--invalid-fraction",
            "0.1",
            "--budget-usd-per-day",
            "0.5",
            "--per-request",
            "--json",
            str(out),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    req = report["requests"]
    assert report["command"].startswith("python -m bench.soak") and report["machine"]["cores"] >= 1
    assert report["lost_requests"] == 0 and req["lost"] == 0
    assert req["failed"] == 0, req["failure_samples"]
    assert (
        req["completed"] + req["cancelled_by_client"] + req["rejected_as_expected"] + req["refused_by_budget"]
        == req["total"]
        == 28
    )
    assert len(report["per_request"]) == 28 and all(r["outcome"] for r in report["per_request"])
    assert req["cancelled_by_client"] >= 1 and req["rejected_as_expected"] >= 1
    assert report["escalations"]["completed_by_tier"].get("cloud", 0) >= 1
    assert report["kv_blocks_used_at_end"] == 0 and report["kv_blocks_total"] > 0
    assert report["cloud_kv_blocks_used_at_end"] == 0 and report["cloud_kv_blocks_total"] > 0
    assert report["rss_mb_at_10pct"] > 0 and report["rss_mb_at_end"] > 0
    assert report["rss_growth_pct_from_10pct"] is not None and report["targets"]["lost_requests_zero"]
    assert report["latency_quarters"]["first"]["e2e_ms"]["count"] > 0
    assert report["server"]["exit_code"] == 0 and report["samples"][-1]["label"] == "end"
    # Budgets on: the spend the stopped server persisted is each request's cost, summed, within the limit.
    budget = report["budget"]
    assert budget["targets"] == {"no_drift": True, "responses_match_ledger": True, "within_limit": True}, budget
    assert 0 < budget["persisted_key_total_usd"] <= 0.5 and budget["requests_with_a_row"] >= 20


def test_budget_report_finds_drift_and_mismatches(tmp_path):
    """bench/soak_budget.py's arithmetic on a ledger written by hand: a row the key has but no request
    explains is drift; a request whose persisted cost differs from its response's is a mismatch."""
    import sqlite3

    from bench.soak_budget import budget_report

    path = tmp_path / "spend.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE spend (scope TEXT, period TEXT, usd REAL, cloud_tokens INTEGER, total_tokens INTEGER, "
            "requests INTEGER, PRIMARY KEY (scope, period))"
        )
        conn.executemany(
            "INSERT INTO spend VALUES (?, ?, ?, 0, 0, 1)",
            [
                ("key:-", "day:2026-11-25", 0.30),
                ("key:-", "month:2026-11", 0.30),
                ("user:-:soak-0", "day:2026-11-25", 0.10),
                ("user:-:soak-1", "day:2026-11-25", 0.15),
            ],
        )
    requests = [SoakRequest(i, {"model": "auto"}, "auto", "short") for i in range(2)]
    results = [SoakResult(0, outcome="completed", cost_usd=0.10), SoakResult(1, outcome="completed", cost_usd=0.12)]
    report = budget_report(str(path), 0.25, requests, results)
    assert report["drift_usd"] == pytest.approx(0.05) and report["mismatched_requests"] == 1
    assert report["targets"] == {"no_drift": False, "responses_match_ledger": False, "within_limit": False}
