"""A new user's first minute, measured: `tandem serve` with no options on the embedded default,
then README's own example, unchanged, through the official `openai` client.

    python -m bench.first_contact [--quick | --smoke | --starts N] --json bench/results/first_contact.json

For each start: seconds from launching `python -m sdk.cli serve` until /health answers 200 (the
local tier is ready) and until its body no longer says `"cloud": "loading"` (the embedded cloud
engine is in). The first start is the first launch in this run (whatever caches the machine has;
`kernel_cache_warm` says whether the attention kernel was already built, as scripts/setup.sh
leaves it); later starts find the OS file cache warm. After the last start, README's example runs
five times; `readme_example_s` is the slowest. Keys and targets:
`readme_example_s` (< 10), `health_ready_first_start_s`, `health_ready_second_start_s` (<= 3),
`cloud_ready_second_start_s` (<= 15). `--starts N` (default 4; --quick 2); --smoke: two starts and
one run of the example (it only checks the bench works). Each start also records how the cloud engine said it runs its
decode steps (`cloud_decode_steps`: compiled, as with a step `tandem cloud precompile` saved, or eager, and why).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.machine import report_header, write_report
from bench.serve_servers import free_port

REPO = Path(__file__).resolve().parents[1]
README_BASE_URL = "http://127.0.0.1:8000/v1"
TARGETS = {"readme_example_s": 10.0, "health_ready_second_start_s": 3.0, "cloud_ready_second_start_s": 15.0}


def readme_example() -> str:
    match = re.search(
        r"```python\n(import openai\n.*?)```", (REPO / "README.md").read_text(encoding="utf-8"), re.DOTALL
    )
    if match is None:
        raise SystemExit("bench.first_contact: README has no openai example")
    return match.group(1)


def start_and_time(log_dir: Path, index: int, timeout_s: float = 300.0) -> tuple[subprocess.Popen, str, dict]:
    """Launch `tandem serve` (defaults, TANDEM_* cleared) and time /health's 200 and the cloud's readiness."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    log = open(log_dir / f"serve-{index}.log", "wb")  # noqa: SIM115  (closed with the process below)
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "sdk.cli", "serve", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=REPO,
    )
    base_url, timings = f"http://127.0.0.1:{port}", {}
    while "cloud_ready_s" not in timings:
        if process.poll() is not None or time.monotonic() - started > timeout_s:
            process.kill()
            raise SystemExit(f"bench.first_contact: tandem serve did not become ready; see {log.name}")
        with contextlib.suppress(httpx.HTTPError):
            reply = httpx.get(f"{base_url}/health", timeout=2.0)
            if reply.status_code == 200:
                timings.setdefault("health_ready_s", time.monotonic() - started)
                if reply.json().get("cloud") != "loading":
                    timings["cloud_ready_s"] = time.monotonic() - started
        time.sleep(0.05)
    log.flush()
    timings["cloud_decode_steps"] = cloud_decode_steps((log_dir / f"serve-{index}.log").read_text(errors="replace"))
    return process, base_url, timings


def cloud_decode_steps(log_text: str) -> str:
    """How the cloud engine said it runs its decode steps (cloud_engine.engine's start line): `compiled: <why>` or
    `eager: <why>`; `unknown` when the line is not in the log."""
    found = re.search(r"decode steps (compiled|eager): (.*?)\), \d+ KV blocks", log_text)
    return f"{found.group(1)}: {found.group(2)}" if found else "unknown"


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_readme_example(base_url: str, times: int = 5) -> list[dict]:
    code = readme_example().replace(README_BASE_URL, f"{base_url}/v1")
    runs = []
    for _ in range(times):
        namespace: dict = {}
        started = time.monotonic()
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, "README.md", "exec"), namespace)
        out = namespace["out"]
        routing = out.model_extra["tandem"]
        runs.append(
            {
                "seconds": time.monotonic() - started,
                "answer": out.choices[0].message.content,
                "contains_4": "4" in out.choices[0].message.content,
                "tier": routing["tier"],
                "escalated": routing["escalated"],
                "degraded": routing["degraded"],
            }
        )
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--quick", action="store_true", help="two starts instead of four")
    parser.add_argument("--smoke", action="store_true", help="two starts, the example once: checks the bench works")
    parser.add_argument(
        "--starts", type=int, help="starts of tandem serve (default 4; --quick and --smoke 2; at least 2)"
    )
    args = parser.parse_args()
    num_starts = args.starts or (2 if args.quick or args.smoke else 4)
    if num_starts < 2:
        parser.error("--starts must be at least 2: the second-start figures need a start after the first")
    kernel_cache = Path(os.environ.get("TANDEM_KERNEL_CACHE", Path.home() / ".cache" / "tandem" / "kernels"))
    kernel_cache_warm = kernel_cache.is_dir() and any(kernel_cache.iterdir())
    starts, example = [], []
    with tempfile.TemporaryDirectory(prefix="first-contact-") as log_dir:
        for index in range(num_starts):
            process, base_url, timings = start_and_time(Path(log_dir), index)
            try:
                if index == num_starts - 1:
                    example = run_readme_example(base_url, times=1 if args.smoke else 5)
            finally:
                stop(process)
            starts.append(timings)
            print(
                f"start {index + 1}: /health 200 after {timings['health_ready_s']:.2f} s, "
                f"cloud ready after {timings['cloud_ready_s']:.2f} s",
                flush=True,
            )
    later = starts[1:]
    report = {
        **report_header("first_contact", smoke=args.smoke),
        "kernel_cache_warm": kernel_cache_warm,
        "starts": starts,
        "readme_example": example,
        "readme_example_s": max(run["seconds"] for run in example),
        "readme_example_all_contain_4": all(run["contains_4"] for run in example),
        "readme_example_degraded": sum(run["degraded"] for run in example),
        "health_ready_first_start_s": starts[0]["health_ready_s"],
        "health_ready_second_start_s": statistics.median(s["health_ready_s"] for s in later),
        "cloud_ready_second_start_s": statistics.median(s["cloud_ready_s"] for s in later),
        "cloud_decode_steps_second_start": later[0]["cloud_decode_steps"],
        "second_start_spread_s": {
            key: [min(s[key] for s in later), max(s[key] for s in later)] for key in ("health_ready_s", "cloud_ready_s")
        },
        "targets": TARGETS,
    }
    report["targets_met"] = {key: report[key] <= target for key, target in TARGETS.items()}
    write_report(
        args.json,
        report,
        ("readme_example_s", "health_ready_first_start_s", "health_ready_second_start_s", "cloud_ready_second_start_s"),
    )


if __name__ == "__main__":
    main()
