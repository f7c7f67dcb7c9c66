"""What machine a benchmark ran on, recorded beside every result."""

from __future__ import annotations

import json
import os
import platform
import subprocess


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# The flags that pick llama.cpp's and torch's CPU kernels (repacked/AMX paths, bf16): what makes a
# figure from one CPU kind a guess on another.
KERNEL_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
)


def cpu_flags() -> list[str]:
    """The kernel-relevant CPU flags /proc/cpuinfo reports (KERNEL_FLAGS), in that order."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    present = set(line.split(":", 1)[1].split())
                    return [flag for flag in KERNEL_FLAGS if flag in present]
    except OSError:
        pass
    return []


def _git_commit() -> str | None:
    """HEAD's short hash, with "+dirty" when the measured code differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def _version(module: str) -> str | None:
    try:
        return getattr(__import__(module), "__version__", "unknown")
    except ImportError:
        return None


def machine_info() -> dict:
    info = {
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "cpu_flags": cpu_flags(),
        "python": platform.python_version(),
        "llama_cpp_python": _version("llama_cpp"),
        "torch": _version("torch"),
        "git_commit": _git_commit(),
    }
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def report_header(benchmark: str, smoke: bool = False) -> dict:
    """What every report starts with: the bench's name, the command that ran it, the machine, and when.
    `smoke`: the run only checks that the bench works (tiny sizes); its figures mean nothing."""
    import datetime
    import sys

    return {
        "benchmark": benchmark,
        "smoke": smoke,
        "command": f"python -m bench.{benchmark} " + " ".join(sys.argv[1:]),
        "machine": machine_info(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def write_report(path: str, report: dict, headline_keys: tuple[str, ...]) -> None:
    """Write a benchmark's JSON and print its headline figures; exit non-zero, writing nothing, when a
    headline figure is missing or not a number or a request failed (bench.report_checks)."""
    from bench.report_checks import headline_problems

    problems = headline_problems(report, headline_keys)
    if problems:
        raise SystemExit(f"{report.get('benchmark', 'bench')}: not writing {path}: " + "; ".join(problems))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps({k: report[k] for k in headline_keys}, indent=2))
