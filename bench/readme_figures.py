"""README's headline figures, rendered from the JSON in bench/results/ (never typed by hand).

    python -m bench.readme_figures            # print the table
    python -m bench.readme_figures --write    # replace README's block between the markers

Each row names a benchmark's JSON and a key in it; the table gives the value, the target
when there is one, the commit it was measured at and the machine. tests/bench/test_readme_figures.py
fails when README's block differs from what the JSON renders (a re-run bench without a README
update, or a hand edit), and when a figure README quotes in its prose (`QUOTES`) differs
from its JSON.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
README = REPO / "README.md"
START = "<!-- readme_figures: start (python -m bench.readme_figures --write) -->"
END = "<!-- readme_figures: end -->"


@dataclass(frozen=True)
class Figure:
    label: str
    bench: str  # bench/results/<bench>.json
    key: str  # dotted path into the JSON
    digits: int = 2
    target: str = ""  # as the issue states it, e.g. "<= 1.2"
    spread: str = ""  # key of the [min, max] over repeated runs: a bound inside it is not "met"

    def value(self) -> float:
        return lookup(load(self.bench), self.key)

    def met(self) -> str:
        if not self.target:
            return ""
        op, bound = self.target.split()
        value, bound = self.value(), float(bound)
        if not (value <= bound if op == "<=" else value >= bound):
            return "**not met**"
        if self.spread:
            low, high = load(self.bench)[self.spread]
            if low <= bound <= high:
                return f"**within the spread** ({low:.{self.digits}f}–{high:.{self.digits}f})"
        return "met"


FIGURES = (
    Figure("cloud engine vs HF static batches (tok/s ratio, median of 3)", "engine_throughput", "ratio_vs_hf_static", 2, ">= 3.0",
           "ratio_vs_hf_static_spread"),
    Figure("cloud engine vs HF one at a time", "engine_throughput", "ratio_vs_hf_sequential", 2, ">= 8.0"),
    Figure("cloud penalties on/off at B=32", "engine_throughput", "penalty_throughput_ratio_cloud_b32", 3, ">= 0.95"),
    Figure("chunked prefill ITL p90, step-time target / unchunked", "chunked_prefill", "itl_p90_ratio", 2, "<= 2.0"),
    Figure("chunked prefill ITL p99, step-time target / unchunked", "chunked_prefill", "itl_p99_ratio", 3, "<= 0.5"),
    Figure("chunked prefill long-prompt TTFT, step-time target / unchunked", "chunked_prefill", "long_prompt_ttft_ratio", 2, "<= 1.5"),
    Figure("prefix cache TTFT, cached / uncached", "prefix_cache", "ttft_ratio", 3, "<= 0.3"),
    Figure("stream ITL p99 under max-size bodies / without", "tokenize_stall", "itl_p99_ratio_under_max_bodies", 2, "<= 1.2",
           "itl_p99_ratio_spread"),
    Figure("streamed auto TTFT p50, hold window / held until decided", "stream_hold", "ttft_ratio_window_vs_until_decided", 2),
    Figure("structured output throughput, constrained / free (local, 8 clients)", "structured", "throughput_ratio_constrained_c8_local", 3),
    Figure("README example, slowest of 5 (s)", "first_contact", "readme_example_s", 2, "<= 10"),
)

# Figures README quotes in its prose: (a regex whose group 1 is the number as written, the
# figure it must equal at that figure's digits).
QUOTES = (
    (r"`ratio_vs_hf_static` \*\*([\d.]+)\*\*", Figure("", "engine_throughput", "ratio_vs_hf_static", 2)),
    (r"`ratio_vs_hf_sequential` \*\*([\d.]+)\*\*", Figure("", "engine_throughput", "ratio_vs_hf_sequential", 2)),
    (r"`penalty_throughput_ratio_cloud_b32` \*\*([\d.]+)\*\*", Figure("", "engine_throughput", "penalty_throughput_ratio_cloud_b32", 3)),
    (r"p50 / p90 / p99 \*\*[\d.]+ / ([\d.]+) / [\d.]+\*\*x", Figure("", "chunked_prefill", "itl_p90_ratio", 2)),
    (r"p50 / p90 / p99 \*\*[\d.]+ / [\d.]+ / ([\d.]+)\*\*x", Figure("", "chunked_prefill", "itl_p99_ratio", 3)),
    (r"TTFT \*\*([\d.]+)x\*\* \(", Figure("", "chunked_prefill", "long_prompt_ttft_ratio", 1)),
    (r"`ttft_ratio` \*\*([\d.]+)\*\*", Figure("", "prefix_cache", "ttft_ratio", 3)),
    (r"against 68 ms without them, ratio ([\d.]+) ", Figure("", "tokenize_stall", "itl_p99_ratio_under_max_bodies", 2)),
    (r"held until decided 2466 ms \(([\d.]+)x", Figure("", "stream_hold", "ttft_ratio_window_vs_until_decided", 2)),
)


def load(bench: str) -> dict:
    return json.loads((RESULTS / f"{bench}.json").read_text())


def lookup(data: dict, key: str) -> float:
    for part in key.split("."):
        data = data[part]
    return float(data)


def machine(bench: str) -> str:
    m = load(bench).get("machine", {})
    return f"{m.get('cores', '?')} cores, {m.get('cpu_model', '?')}"


def render() -> str:
    rows = ["| figure | value | target | | measured at | machine | bench |", "|---|---|---|---|---|---|---|"]
    for fig in FIGURES:
        commit = load(fig.bench).get("machine", {}).get("git_commit") or "?"
        rows.append(f"| {fig.label} | **{fig.value():.{fig.digits}f}** | {fig.target} | {fig.met()} | {commit} | "
                    f"{machine(fig.bench)} | `{fig.bench}`: `{fig.key}` |")  # fmt: skip
    return "\n".join([START, *rows, END])


def readme_block(text: str) -> str:
    start, end = text.find(START), text.find(END)
    if start < 0 or end < 0:
        raise SystemExit(f"README has no block between {START!r} and {END!r}")
    return text[start : end + len(END)]


def quote_mismatches(text: str) -> list[str]:
    """Every QUOTES figure README states that differs from its JSON (or that README no longer states)."""
    wrong = []
    for pattern, fig in QUOTES:
        found = re.findall(pattern, text)
        if not found:
            wrong.append(f"{pattern!r}: not found in README")
        expected = f"{fig.value():.{fig.digits}f}"
        wrong += [f"{fig.bench}.{fig.key}: README says {got}, the JSON {expected}" for got in found if got != expected]
    return wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="replace README's block")
    args = parser.parse_args()
    table = render()
    if not args.write:
        print(table)
        return
    text = README.read_text()
    README.write_text(text.replace(readme_block(text), table))
    print(f"README: {len(FIGURES)} figures written; quotes that disagree: {quote_mismatches(README.read_text()) or 'none'}")


if __name__ == "__main__":
    main()
