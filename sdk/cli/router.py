"""`tandem router train|score`: the prompt router (router.prompt_router).

Imports stay inside the commands: `sdk.cli.app` imports this module for every `tandem` command.
"""

from __future__ import annotations

import typer

router_app = typer.Typer(
    help="The prompt router: score prompts' need for the cloud tier before generating.", no_args_is_help=True
)
CHUNK = 256  # prompts scored between progress updates (and held in memory at once)


def _progress(total: int, description: str):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        transient=True,
        disable=total < CHUNK,
    )


def _load_tables(names: list[str], data_dir: str) -> tuple[list, list, list | None]:
    """(every --data table's rows in order, the rows of tables other than `routellm`: an app's
    labelled tables, which also teach the topic correction, RouteLLM's locked test subjects when
    `routellm` was loaded). `routellm` is RouteLLM's design tables (its locked test subjects and
    defective tables left out, router.prompt_router.locked_split); `none` is no table; a table
    named twice is an error."""
    from router.eval_tables import TableError, load_routellm, load_table
    from router.prompt_router.locked_split import split_rows

    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise TableError(f"--data {twice[0]} is given more than once")
    if "none" in names and len(names) > 1:
        raise TableError("--data none means no table; it cannot be combined with other tables")
    examples, own, locked = [], [], None
    for name in names:
        if name == "routellm":
            routellm = load_routellm(data_dir)
            design_rows, locked_rows = split_rows(routellm)
            examples += [routellm[i] for i in design_rows]
            locked = [routellm[i] for i in locked_rows]
        elif name != "none":
            rows = load_table(name)
            examples += rows
            own += rows
    return examples, own, locked


def _topic_rows(examples: list):
    """An app's labelled table rows with their MiniLM embeddings (the int8 export the router runs)."""
    from router.prompt_router.embeddings import embed_prompts
    from router.prompt_router.training import table_rows

    rows = table_rows(examples)
    rows.embedding = embed_prompts([e.prompt for e in examples])
    return rows


def _locked(data_dir: str) -> list | None:
    """RouteLLM's locked test subjects, to score the new router on, when --data did not load them;
    None without the data."""
    from router.eval_tables import TableError, load_routellm
    from router.prompt_router.locked_split import locked_examples

    try:
        return locked_examples(load_routellm(data_dir))
    except (TableError, OSError):
        return None


@router_app.command("train")
def train(
    out: str = typer.Option(..., "--out", help="Where to write the router (one ONNX file)."),
    data: list[str] | None = typer.Option(
        None,
        "--data",
        help="`routellm` (RouteLLM's GSM8K + MMLU tables, less the locked test subjects), a labelled table file "
        "(.csv/.jsonl) in RouteLLM's or tandem's format, or `none`; repeat to train on several. A table file's rows "
        "also teach the topic correction (the router then carries MiniLM). Default: routellm, or with --from-traffic "
        "the tables --base-router was trained on (their statistics travel in the file).",
    ),
    from_traffic: list[str] | None = typer.Option(
        None,
        "--from-traffic",
        help="A traffic record written by `tandem serve` ([traffic] record = true): its SQLite file, or the "
        "postgresql:// URL of the state database its replicas share; repeat for several. "
        "Its labels refit the head and give the topic correction (the router then carries MiniLM).",
    ),
    base_router: str | None = typer.Option(
        None,
        "--base-router",
        help="With --from-traffic and no --data: the router whose table statistics to start from; "
        "default: the shipped one.",
    ),
    data_dir: str | None = typer.Option(
        None, "--data-dir", help="RouteLLM data directory; default: ../shared/data/routellm."
    ),
    holdout_fraction: float = typer.Option(
        0.25, min=0.0, max=0.9, help="Share of the tables' subjects held out to report APGR (0: no report)."
    ),
    seed: int = typer.Option(0, help="Seed of the subject split."),
    alpha: float | None = typer.Option(
        None,
        min=0.0,
        help="Ridge penalty of the head (standardized prompt-shape features); default: the shipped recipe's.",
    ),
) -> None:
    """Train a router; print its APGR on held-out subjects and write a JSON report next to --out."""
    import dataclasses
    import json
    from pathlib import Path

    from router.eval_tables import DEFAULT_DATA_DIR, TableError
    from router.prompt_router.cold_recipe import DEFAULT
    from router.prompt_router.embedder_export import EmbedderUnavailableError
    from router.prompt_router.scorer import RouterError
    from router.prompt_router.training import train_router

    try:
        examples, own, locked = _load_tables(
            data or (["none"] if from_traffic else ["routellm"]), data_dir or DEFAULT_DATA_DIR
        )
        base, base_recipe, base_scale = (
            _base_statistics(base_router) if from_traffic and not data else (None, None, None)
        )
        traffic = _load_traffic(from_traffic) if from_traffic else None
    except (ValueError, TableError, RouterError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    recipe = base_recipe or DEFAULT  # a retrain keeps its base router's features and penalty
    recipe = recipe if alpha is None else dataclasses.replace(recipe, alpha=alpha)
    try:
        topic_rows = _topic_rows(own) if own else None
        report = train_router(
            examples,
            out,
            traffic=traffic,
            holdout_fraction=holdout_fraction if examples else 0.0,
            seed=seed,
            recipe=recipe,
            base=base,
            topic_rows=topic_rows,
            locked=locked if locked is not None else _locked(data_dir or DEFAULT_DATA_DIR),
            base_scale=base_scale,
        )
    except (ValueError, EmbedderUnavailableError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    report_path = Path(out).with_suffix(".report.json")
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    for name in ("heldout", "heldout_mmlu"):
        if name in report and (name == "heldout" or report[name]["num_examples"] != report["heldout"]["num_examples"]):
            figures = report[name]
            typer.echo(
                f"{name}: APGR {figures['apgr']:.3f} (random {figures['random_apgr']:.2f}, oracle "
                f"{figures['oracle_apgr']:.3f}), CPT(50%) {figures['cpt50']:.3f}, {figures['num_examples']} prompts"
            )
    locked = report["locked_test"]
    typer.echo(
        f"locked test subjects: APGR {locked['apgr']:.3f} +- {locked['apgr_se']:.3f}, prompt length "
        f"{locked['apgr'] - locked['minus_length']:.3f} ({locked['num_subjects']} subjects, SE over subjects)"
        if "apgr" in locked
        else f"locked test subjects: not measured ({locked['not_measured']})"
    )
    if own:
        correction = report["recipe"]["topic_correction"]
        typer.echo(
            f"labelled tables: {len(own)} rows"
            + (
                f", topic correction from {correction['num_rows']} embedded prompts"
                if correction
                else ", too few rows for a topic correction"
            )
        )
    if traffic is not None:
        correction = report["recipe"]["topic_correction"]
        typer.echo(
            f"traffic: {report['num_traffic_rows']} rows, {report['num_traffic_judged']} with both tiers judged"
            + (
                f", topic correction from {correction['num_rows']} embedded prompts"
                if correction
                else ", too few embedded prompts for a topic correction"
            )
        )
    typer.echo(
        f"wrote {out} (trained on {len(examples)} table rows"
        f"{' and ' + str(report['num_base_rows']) + ' of the base router' if base else ''}) and {report_path}"
    )


def _base_statistics(path: str | None):
    """(the public-table statistics a router file carries, its head recipe, its score scale); the
    shipped router by default."""
    from router.prompt_router.cold_recipe import ColdRecipe
    from router.prompt_router.linear_head import HeadStatistics
    from router.prompt_router.score_scale import ScoreScale
    from router.prompt_router.scorer import RouterFormatError, load_scorer

    scorer = load_scorer(path)
    document = scorer.metadata.get("prior_statistics")
    if document is None:
        raise RouterFormatError(f"{scorer.path} carries no table statistics to start from; give --data")
    recipe = ColdRecipe.from_json(scorer.metadata.get("head_recipe"))
    return HeadStatistics.from_json(document), recipe, ScoreScale.from_json(scorer.metadata["score_scale"])


def _load_traffic(paths: list[str]):
    """Every --from-traffic record's rows, with vectors made by the default (int8) MiniLM export."""
    import numpy as np

    from router.prompt_router.embedder_export import DEFAULT_PRECISION, model_fingerprint
    from router.prompt_router.training import LabelledRows
    from sdk.traffic.rows import load_traffic_rows

    parts = [load_traffic_rows(path, embedder=f"{model_fingerprint()}|{DEFAULT_PRECISION}").rows for path in paths]
    return LabelledRows(
        np.vstack([p.shape for p in parts]),
        np.vstack([p.labels for p in parts]),
        np.vstack([p.embedding for p in parts]),
    )


@router_app.command("score")
def score(
    data: str = typer.Option(..., "--data", help="CSV with a `prompt` column."),
    out: str = typer.Option(..., "--out", help="CSV to write: prompt,score (higher = more need for the strong tier)."),
    router: str | None = typer.Option(
        None, "--router", help="A router from `tandem router train`; default: the shipped router."
    ),
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
