"""The soak's view of the server: /metrics samples and the server process's RSS, along the
way (every few percent of requests done) and once the server has gone idle at the end."""

from __future__ import annotations

import asyncio
import math
import re
import time

import httpx

GAUGES = ("kv_blocks_used", "kv_blocks_total", "num_requests_running", "num_requests_waiting")
# The embedded cloud engine's (tandem serve exports them as tandem:cloud_engine_*); None with
# a remote cloud tier or an older server.
CLOUD_GAUGES = tuple("cloud_engine_" + name for name in GAUGES)
# Server-side counters worth keeping beside the client's view (labelled samples kept whole).
COUNTERS = (
    "cascade_requests_total",
    "cascade_decisions_total",
    "cascade_degraded_total",
    "cascade_handoffs_total",
    "request_success_total",
    "http_rejections_total",
    "num_preemptions_total",
    "privacy_kept_local_total",
    "prompt_tokens_total",
    "generation_tokens_total",
)
_SAMPLE = re.compile(r"^tandem:([a-z_]+)(\{[^}]*\})? (\S+)$", re.M)


def parse_metrics(text: str) -> dict[str, float]:
    """`tandem:` samples (histograms left out) as {"name{labels}": value}."""
    out = {}
    for name, labels, value in _SAMPLE.findall(text):
        if name.endswith(("_bucket", "_sum", "_count", "_created")):
            continue
        try:
            out[name + (labels or "")] = float(value)
        except ValueError:
            continue
    return out


_STATUS_FIELDS = {"VmRSS": "rss_mb", "RssAnon": "rss_anon_mb", "RssFile": "rss_file_mb", "VmHWM": "rss_peak_mb"}


def memory_mb(pid: int | None) -> dict[str, float | None]:
    """Resident memory of `pid` in MiB from /proc/PID/status: the whole RSS, its anonymous part
    (heap: where a leak or retained malloc memory shows) and its file-backed part (the mmap'd
    model and libraries paging in), and the peak RSS; None for what is unreadable."""
    out: dict[str, float | None] = dict.fromkeys(_STATUS_FIELDS.values())
    if pid is None:
        return out
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in _STATUS_FIELDS:
                    out[_STATUS_FIELDS[key]] = int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return out


def _all_zero(sample: dict, *gauges: str) -> bool:
    """Each gauge is 0 in the local engine (which must export it) and 0 or not exported
    (a remote cloud tier) in the embedded cloud engine."""
    return all(sample[name] == 0 and not sample["cloud_engine_" + name] for name in gauges)


class ServerProbe:
    """Samples the server at fixed fractions of the requests done; then waits for it to go idle."""

    def __init__(
        self,
        base_url: str,
        pid: int | None,
        num_requests: int,
        every_fraction: float = 0.05,
        mark_fraction: float = 0.10,
    ):
        self.metrics_url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
        self.pid = pid
        self.mark_done = max(1, math.ceil(mark_fraction * num_requests))  # the RSS baseline
        steps = max(1, round(1 / every_fraction))
        self.marks = {max(1, math.ceil(k * num_requests / steps)) for k in range(1, steps + 1)} | {self.mark_done}
        self.samples: list[dict] = []
        self.errors: list[str] = []
        self._tasks: list[asyncio.Task] = []
        self._t0 = time.perf_counter()

    def start_clock(self) -> None:
        self._t0 = time.perf_counter()

    async def sample(self, label: str, num_done: int | None = None) -> dict:
        """One sample: time, requests done, RSS and the gauges (None where unreadable)."""
        sample: dict = {
            "label": label,
            "done": num_done,
            "t_s": round(time.perf_counter() - self._t0, 3),
            **memory_mb(self.pid),
        }
        try:
            async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
                values = parse_metrics((await client.get(self.metrics_url)).text)
        except httpx.HTTPError as exc:
            self.errors.append(f"{label}: {type(exc).__name__}: {exc}"[:200])
            values = {}
        for name in GAUGES + CLOUD_GAUGES:
            sample[name] = values.get(name)
        sample["counters"] = {k: v for k, v in values.items() if k.split("{")[0] in COUNTERS}
        self.samples.append(sample)
        return sample

    def on_done(self, result, num_done: int) -> None:
        """The soak client's per-request callback: schedule a sample at each mark."""
        if num_done in self.marks:
            label = "mark_10pct" if num_done == self.mark_done else f"done_{num_done}"
            self._tasks.append(asyncio.get_running_loop().create_task(self.sample(label, num_done)))

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks)

    async def wait_idle(self, timeout_s: float = 30.0, poll_s: float = 0.25) -> dict:
        """Poll until no request runs or waits and no KV block is held (at most `timeout_s`);
        the last sample, labelled "end", with how long each condition took."""
        started = time.perf_counter()
        idle_after = None
        while True:
            sample = await self.sample("end_poll")
            self.samples.pop()  # only the final poll is kept
            quiet = _all_zero(sample, "num_requests_running", "num_requests_waiting")
            if quiet and idle_after is None:
                idle_after = time.perf_counter() - started
            if quiet and _all_zero(sample, "kv_blocks_used"):
                break
            if time.perf_counter() - started > timeout_s:
                break
            await asyncio.sleep(poll_s)
        sample.update(
            label="end",
            idle_reached=idle_after is not None,
            idle_wait_s=None if idle_after is None else round(idle_after, 3),
            kv_zero_reached=_all_zero(sample, "kv_blocks_used"),
            wait_s=round(time.perf_counter() - started, 3),
        )
        self.samples.append(sample)
        return sample

    def mark_sample(self) -> dict | None:
        return next((s for s in self.samples if s["label"] == "mark_10pct"), None)
