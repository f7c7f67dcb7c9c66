"""`tandem router train|score`: the prompt router (router.prompt_router).

Imports stay inside the commands: `sdk.cli.app` imports this module for every `tandem` command.
"""

from __future__ import annotations

import typer

router_app = typer.Typer(help="The prompt router: score prompts' need for the cloud tier before generating.", no_args_is_help=True)
CHUNK = 256  # prompts scored between progress updates (and held in memory at once)


def _progress(total: int, description: str):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn(description), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), transient=True, disable=total < CHUNK)


def _load_tables(names: list[str], data_dir: str) -> list:
    """Every --data table, in order (`routellm` for RouteLLM's own, `none` for no table); a table named twice is an error."""
    from router.eval_tables import TableError, load_routellm, load_table

    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise TableError(f"--data {twice[0]} is given more than once")
    if "none" in names and len(names) > 1:
        raise TableError("--data none means no table; it cannot be combined with other tables")
    examples = []
    for name in names:
        if name != "none":
            examples += load_routellm(data_dir) if name == "routellm" else load_table(name)
    return examples


@router_app.command("train")
def train(
    out: str = typer.Option(..., "--out", help="Where to write the router (one ONNX file)."),
    data: list[str] = typer.Option(["routellm"], "--data", help="`routellm` (the GSM8K + MMLU tables), a table file (.csv/.jsonl) in RouteLLM's or tandem's format, or `none`; repeat to train on several."),
    data_dir: str | None = typer.Option(None, "--data-dir", help="RouteLLM data directory; default: ../shared/data/routellm."),
    holdout_fraction: float = typer.Option(0.25, min=0.0, max=0.9, help="Share of the tables' subjects held out to report APGR (0: no report)."),
    seed: int = typer.Option(0, help="Seed of the subject split."),
    alpha: float = typer.Option(1.0, min=0.0, help="Ridge penalty of the head (standardized prompt-shape features)."),
) -> None:
    """Train a router; print its APGR on held-out subjects and write a JSON report next to --out."""
    import json
    from pathlib import Path

    from router.eval_tables import DEFAULT_DATA_DIR, TableError
    from router.prompt_router.training import train_router

    try:
        examples = _load_tables(data, data_dir or DEFAULT_DATA_DIR)
    except (ValueError, TableError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    try:
        report = train_router(examples, out, holdout_fraction=holdout_fraction, seed=seed, alpha=alpha)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    report_path = Path(out).with_suffix(".report.json")
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    for name in ("heldout", "heldout_mmlu"):
        if name in report and (name == "heldout" or report[name]["num_examples"] != report["heldout"]["num_examples"]):
            figures = report[name]
            typer.echo(f"{name}: APGR {figures['apgr']:.3f} (random {figures['random_apgr']:.2f}, oracle "
                       f"{figures['oracle_apgr']:.3f}), CPT(50%) {figures['cpt50']:.3f}, {figures['num_examples']} prompts")  # fmt: skip
    typer.echo(f"wrote {out} (trained on {len(examples)} table rows) and {report_path}")


@router_app.command("score")
def score(
    data: str = typer.Option(..., "--data", help="CSV with a `prompt` column."),
    out: str = typer.Option(..., "--out", help="CSV to write: prompt,score (higher = more need for the strong tier)."),
    router: str | None = typer.Option(None, "--router", help="A router from `tandem router train`; default: the shipped router."),
) -> None:
    """Score every prompt of a CSV with the prompt router."""
    import csv
    import sys

    from router.prompt_router.embedder_export import EmbedderUnavailableError
    from router.prompt_router.scorer import RouterError, load_scorer

    csv.field_size_limit(sys.maxsize)
    try:
        with open(data, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            if "prompt" not in (reader.fieldnames or []):
                raise typer.BadParameter(f"{data} has no `prompt` column (columns: {reader.fieldnames})")
            prompts = [row["prompt"] for row in reader]
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {data}: {exc}") from exc
    try:
        scorer = load_scorer(router, threads=None)  # a batch job: use every core
    except (RouterError, FileNotFoundError, EmbedderUnavailableError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    with open(out, "w", newline="", encoding="utf-8") as handle, _progress(len(prompts), "scoring") as bar:
        writer = csv.writer(handle)
        writer.writerow(["prompt", "score"])
        task = bar.add_task("score", total=len(prompts))
        for start in range(0, len(prompts), CHUNK):
            chunk = prompts[start : start + CHUNK]
            writer.writerows([prompt, f"{value:.6f}"] for prompt, value in zip(chunk, scorer.score(chunk)))
            bar.advance(task, len(chunk))
    typer.echo(f"scored {len(prompts)} prompts into {out}", err=True)
