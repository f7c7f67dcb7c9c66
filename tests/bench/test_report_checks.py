"""A bench that cannot produce its headline figure exits non-zero instead of writing NaN
(bench.report_checks, bench.machine.write_report), and a server that cannot start is one missing
row of bench.serve's comparison, not a lost run (bench.serve_compare, bench.serve_servers)."""

from __future__ import annotations

import math
import sys

import pytest

from bench.machine import cpu_flags, report_header, write_report
from bench.report_checks import headline_problems
from bench.serve_compare import HEADLINE_KEYS, headline_ratios, summarize, targets_met
from bench.serve_servers import ManagedServer, ServerStartError


def test_headline_problems_name_missing_nan_none_and_failed_requests():
    report = {"a": 1.0, "b": math.nan, "c": None, "d": {"x": [1.0, math.inf]}, "failed_requests": 3}
    problems = headline_problems(report, ("a", "b", "c", "d", "e"))
    assert problems == [
        "headline key 'e' is missing",
        "b is nan",
        "c is None",
        "d.x.1 is inf",
        "3 request(s) failed (failed_requests)",
    ]
    assert headline_problems({"a": 0.5, "b": {"ok": True}, "failed_requests": 0}, ("a", "b")) == []


def test_write_report_exits_non_zero_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "r.json"
    with pytest.raises(SystemExit) as refused:
        write_report(str(path), {"benchmark": "x", "ratio": math.nan}, ("ratio",))
    assert refused.value.code != 0 and "ratio is nan" in str(refused.value.code) and not path.exists()
    write_report(str(path), {**report_header("x", smoke=True), "ratio": 0.9}, ("ratio",))
    assert path.exists() and '"smoke": true' in path.read_text()


def test_machine_info_records_the_kernel_flags():
    flags = cpu_flags()
    assert report_header("x")["machine"]["cpu_flags"] == flags
    with open("/proc/cpuinfo") as f:
        present = set(next(line for line in f if line.startswith(("flags", "Features"))).split(":", 1)[1].split())
    assert ("avx2" in flags) == ("avx2" in present) and ("amx_tile" in flags) == ("amx_tile" in present)


def test_a_server_killed_by_a_signal_says_which():
    server = ManagedServer(
        "sigill",
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"],
        port=1,
        ready_path="/health",
        description="dies at start",
    )
    with pytest.raises(ServerStartError) as failed:
        server.start(timeout_s=30)
    assert failed.value.exit_code == -4 and failed.value.signal_name == "SIGILL"


def _metrics(tps: float, ttft_ms: float) -> dict:
    return {
        "output_throughput": tps,
        "ttft_ms": {"median": ttft_ms, "p99": ttft_ms},
        "itl_ms": {"median": 1.0, "p99": 2.0},
        "failed": 0,
        "completed": 8,
        "request_throughput": 1.0,
        "tpot_ms": {"median": 1.0},
    }


def test_a_server_that_did_not_start_leaves_its_row_out_and_the_rest_compared():
    runs = {
        8: {
            "tandem": [_metrics(90, 100), _metrics(80, 120)],
            "llama_server": [None, None],  # the repacked variant died with SIGILL both times
            "llama_server_no_repack": [_metrics(100, 100), None],
        }
    }  # started only in the first repetition
    ratios = headline_ratios(runs)
    assert ratios["ratio_output_tps_vs_llama_server_c8"] == pytest.approx(0.9)  # the pair where both ran, only
    assert ratios["ratio_output_tps_vs_llama_server_c8_spread"] == pytest.approx([0.9, 0.9])
    assert not any("_default_" in key for key in ratios)
    summary = summarize(runs[8])
    assert summary["llama_server"] == {"started": 0} and summary["llama_server_no_repack"]["started"] == 1
    met = targets_met(ratios)  # the headline stays publishable: no None for the row that is missing
    assert met["ratio_output_tps_vs_llama_server_default_c8"] == "not measured"
    assert headline_problems({**ratios, "targets_met": met}, HEADLINE_KEYS) == []
