"""Serving metrics from per-request timings, defined as vLLM's `bench serve` defines them.

* TTFT: request sent -> first streamed chunk that carries content.
* ITL: the gaps between consecutive content chunks (every gap of every request).
* TPOT: per request, (E2E - TTFT) / (output tokens - 1); requests with one token have none.
* E2E: request sent -> stream finished.
* goodput: completed requests meeting every SLO given, per second of benchmark time.

All inputs are seconds; every latency summary is reported in milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

PERCENTILES = (50, 90, 99)
SLO_METRICS = ("ttft", "tpot", "e2el")  # vLLM's names for --goodput keys


@dataclass
class RequestResult:
    """What one streamed request measured."""

    ok: bool  # finished with content and without an error
    prompt_len: int = 0  # prompt tokens (from usage when the server sends it)
    output_len: int = 0  # output tokens (usage, or max_tokens when cut by length, or content chunks)
    output_len_source: str = "usage"  # usage | length | chunks
    ttft_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)  # gaps between content chunks
    e2e_s: float = 0.0
    start_s: float = 0.0  # when it was sent, from the benchmark's start
    finish_reason: str | None = None
    error: str = ""  # why it failed


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile with linear interpolation between ranks (numpy's default); nan if empty."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize_ms(values_s: list[float]) -> dict:
    """mean, median, p90, p99 (and count) of latencies given in seconds, in milliseconds; None when empty."""
    values_ms = [v * 1000.0 for v in values_s]
    if not values_ms:  # None rather than nan: the report stays strict JSON
        return {"mean": None, "median": None, **{f"p{q}": None for q in PERCENTILES if q != 50}, "count": 0}
    summary = {"mean": sum(values_ms) / len(values_ms), "median": percentile(values_ms, 50)}
    for q in PERCENTILES:
        if q != 50:
            summary[f"p{q}"] = percentile(values_ms, q)
    summary["count"] = len(values_ms)
    return summary


def tpot_s(e2e_s: float, ttft_s: float, output_len: int) -> float | None:
    """Time per output token after the first; None for a single-token (or empty) output."""
    if output_len < 2:
        return None
    return (e2e_s - ttft_s) / (output_len - 1)


def gaps(times_s: list[float]) -> list[float]:
    """Differences between consecutive timestamps: the ITLs of one request's content chunks."""
    return [b - a for a, b in zip(times_s, times_s[1:])]


def parse_goodput(specs: list[str] | None) -> dict[str, float]:
    """`["ttft:200", "tpot:50"]` -> {"ttft": 200.0, "tpot": 50.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for spec in specs or []:
        name, sep, value = spec.partition(":")
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"--goodput takes NAME:MS with NAME one of {', '.join(SLO_METRICS)}; got {spec!r}")
        try:
            slos[name] = float(value)
        except ValueError:
            raise ValueError(f"--goodput {spec!r}: {value!r} is not a number of milliseconds") from None
        if slos[name] <= 0:
            raise ValueError(f"--goodput {spec!r}: the SLO must be > 0 ms")
    return slos


def meets_slos(result: RequestResult, slos_ms: dict[str, float]) -> bool:
    """Whether a completed request meets every SLO given (a missing TPOT counts as 0, as in vLLM)."""
    if not result.ok:
        return False
    measured_ms = {
        "ttft": result.ttft_s * 1000.0,
        "tpot": (tpot_s(result.e2e_s, result.ttft_s, result.output_len) or 0.0) * 1000.0,
        "e2el": result.e2e_s * 1000.0,
    }
    return all(measured_ms[name] <= limit for name, limit in slos_ms.items())


def compute_metrics(
    results: list[RequestResult], duration_s: float, slos_ms: dict[str, float] | None = None, max_error_samples: int = 5
) -> dict:
    """Every serving metric of one benchmark run; throughputs are over `duration_s` of wall time."""
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    done = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    num_output = sum(r.output_len for r in done)
    num_prompt = sum(r.prompt_len for r in done)
    tpots = [t for r in done if (t := tpot_s(r.e2e_s, r.ttft_s, r.output_len)) is not None]
    metrics = {
        "duration_s": duration_s,
        "completed": len(done),
        "failed": len(failed),
        "error_samples": sorted({r.error for r in failed})[:max_error_samples],
        "total_input_tokens": num_prompt,
        "total_output_tokens": num_output,
        "output_len_sources": {
            s: sum(r.output_len_source == s for r in done) for s in sorted({r.output_len_source for r in done})
        },
        "request_throughput": len(done) / duration_s,
        "output_throughput": num_output / duration_s,
        "total_token_throughput": (num_prompt + num_output) / duration_s,
        "ttft_ms": summarize_ms([r.ttft_s for r in done]),
        "tpot_ms": summarize_ms(tpots),
        "itl_ms": summarize_ms([gap for r in done for gap in r.itl_s]),
        "e2el_ms": summarize_ms([r.e2e_s for r in done]),
    }
    if slos_ms:
        num_good = sum(meets_slos(r, slos_ms) for r in done)
        metrics["goodput_slos_ms"] = dict(slos_ms)
        metrics["good_requests"] = num_good
        metrics["request_goodput"] = num_good / duration_s
    return metrics
