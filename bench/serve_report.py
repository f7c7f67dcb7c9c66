"""Progress bar and summary tables of bench.serve (rich, on stderr so stdout stays the JSON headline)."""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console(stderr=True)
LATENCY_ROWS = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2E latency"))


@contextmanager
def request_progress(label: str, total: int):
    """Yields a callback to call once per finished request (failures are counted in the label)."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("failed {task.fields[failed]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(label, total=total, failed=0)
        failed = 0

        def on_done(result) -> None:
            nonlocal failed
            failed += 0 if result.ok else 1
            progress.update(task, advance=1, failed=failed)

        yield on_done


def _cell(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


def print_summary(runs: dict[str, dict]) -> None:
    """One table, a column per run (name -> compute_metrics output)."""
    names = list(runs)
    table = Table(title="Serving benchmark", show_lines=False)
    table.add_column("metric")
    for name in names:
        table.add_column(name, justify="right")

    def row(label: str, getter, digits: int = 2) -> None:
        table.add_row(label, *(_cell(getter(runs[n]), digits) for n in names))

    row("completed requests", lambda m: m["completed"])
    row("failed requests", lambda m: m["failed"])
    row("duration (s)", lambda m: m["duration_s"])
    row("input tokens", lambda m: m["total_input_tokens"])
    row("output tokens", lambda m: m["total_output_tokens"])
    row("request throughput (req/s)", lambda m: m["request_throughput"], 3)
    row("output throughput (tok/s)", lambda m: m["output_throughput"])
    row("total token throughput (tok/s)", lambda m: m["total_token_throughput"])
    if all("request_goodput" in runs[n] for n in names):
        row("request goodput (req/s)", lambda m: m["request_goodput"], 3)
    for key, label in LATENCY_ROWS:
        for stat in ("mean", "median", "p90", "p99"):
            row(f"{label} {stat} (ms)", lambda m, key=key, stat=stat: m[key][stat])
    console.print(table)
    for name in names:
        for error in runs[name]["error_samples"]:
            console.print(f"[red]{name} error sample:[/red] {error}")
