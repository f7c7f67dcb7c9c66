"""`tandem eval` and `tandem calibrate`: routing quality against cloud share, and the threshold from data.

Mounted by sdk.cli.app through `register_eval_commands(app)`; imports stay inside the commands.
"""

from __future__ import annotations

import enum
from pathlib import Path

import typer

_DATA_HELP = "Routing table (.csv/.jsonl: prompt, weak_correct, strong_correct, or RouteLLM's columns), or `routellm`."
_ROUTER_HELP = (
    "random, oracle, column:NAME (a score column of the table, e.g. column:confidence) or "
    "scores:FILE.csv (prompt,score as `tandem router score` writes)."
)


class ThresholdSetting(str, enum.Enum):
    """Which [cascade] threshold `tandem calibrate` writes."""

    threshold = "threshold"  # the request's default threshold: the confidence policy's during generation
    prompt_router_threshold = "prompt_router_threshold"  # the prompt router's, before generation


class HigherMeans(str, enum.Enum):
    """Which tier a higher score favours."""

    local = "local"  # a confidence in the local answer
    cloud = "cloud"  # a need for the cloud (the prompt router's score)


def _fail(exc: Exception) -> typer.Exit:
    typer.echo(f"tandem: {exc}", err=True)
    return typer.Exit(code=2)


def _load(
    data: str | None,
    data_dir: str | None,
    datasets: str,
    router: str,
    higher_means: HigherMeans | None,
    from_traffic: str | None = None,
):
    from rich.console import Console

    from router.evaluation.inputs import load_examples, router_scores
    from sdk.traffic.stores import described

    if (data is None) == (from_traffic is None):
        raise ValueError("give one of --data (a table) and --from-traffic (a traffic record)")
    with Console(stderr=True).status(
        f"reading {data or described(from_traffic)}"
    ):  # RouteLLM's tables hold whole responses: seconds
        if from_traffic is not None:
            from sdk.traffic.table import traffic_table

            table = traffic_table(from_traffic)
        else:
            table = load_examples(data, data_dir, [name.strip() for name in datasets.split(",") if name.strip()])
    return table, router_scores(router, table.examples, higher_means.value if higher_means else None)


def _run_live(
    base_url: str,
    prompts: str,
    data_dir: str | None,
    limit: int | None,
    max_tokens: int,
    concurrency: int,
    table_out: Path,
) -> None:
    import asyncio

    from rich.progress import Progress

    from sdk.evaluation.live import build_live_table, load_prompts, write_jsonl

    items = load_prompts(prompts, data_dir, limit)
    with Progress(transient=False) as progress:
        task = progress.add_task(f"asking both tiers ({len(items)} prompts)", total=len(items))
        rows = asyncio.run(
            build_live_table(
                base_url, items, max_tokens=max_tokens, concurrency=concurrency, on_done=lambda: progress.advance(task)
            )
        )
    write_jsonl(rows, table_out)
    typer.echo(f"wrote the live table ({len(rows)} prompts) to {table_out}")


def eval_command(
    data: str | None = typer.Option(None, "--data", help=_DATA_HELP),
    data_dir: str | None = typer.Option(
        None,
        "--data-dir",
        envvar="TANDEM_ROUTELLM_DIR",
        help="RouteLLM's data (default: ../shared/data/routellm); its contamination lists apply to every table.",
    ),
    datasets: str = typer.Option("gsm8k,mmlu", "--datasets", help="With --data routellm: comma-separated gsm8k, mmlu."),
    router: str | None = typer.Option(
        None, "--router", help=_ROUTER_HELP + " Default: column:confidence with --live, else random."
    ),
    higher_means: HigherMeans | None = typer.Option(
        None,
        "--higher-means",
        help="Which tier a higher score favours; default: local for a column, cloud for a scores file.",
    ),
    seeds: int = typer.Option(100, "--seeds", min=1, help="Seeds the random router's curve is averaged over."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the report as JSON here."),
    plot_out: Path | None = typer.Option(None, "--plot", help="Write the quality-vs-cloud-share plot here (PNG)."),
    live: bool = typer.Option(
        False, "--live", help="Build the table by asking both tiers of a running `tandem serve`."
    ),
    base_url: str | None = typer.Option(
        None, "--base-url", envvar="TANDEM_BASE_URL", help="With --live: the endpoint, e.g. http://127.0.0.1:8000."
    ),
    prompts: str | None = typer.Option(
        None,
        "--prompts",
        help="With --live: gsm8k, mmlu (labels = agreement with the cloud) or a .jsonl/.csv of prompt[,answer].",
    ),
    limit: int | None = typer.Option(None, "--limit", min=1, help="With --live: only the first N prompts."),
    max_tokens: int = typer.Option(256, "--max-tokens", min=1, help="With --live: completion limit per answer."),
    concurrency: int = typer.Option(4, "--concurrency", min=1, help="With --live: prompts in flight."),
    table_out: Path | None = typer.Option(
        None, "--table-out", help="With --live: keep the table (JSONL) here; reuse it with --data."
    ),
) -> None:
    """Quality vs cloud share of a router, with AUC, APGR and CPT, against the random router and the oracle."""
    import tempfile

    from router.eval_tables import TableError
    from sdk.evaluation.live import LiveError
    from router.evaluation.plot import plot_report
    from router.evaluation.report import build_report, print_report, report_json

    if live == (data is not None):
        raise _fail(ValueError("give either --data or --live (with --base-url and --prompts)"))
    if live and not (base_url and prompts):
        raise _fail(ValueError("--live needs --base-url and --prompts"))
    with tempfile.TemporaryDirectory() as scratch:
        try:
            if live:
                data = str(table_out or Path(scratch) / "live.jsonl")
                _run_live(base_url, prompts, data_dir, limit, max_tokens, concurrency, Path(data))
            table, scores = _load(
                data, data_dir, datasets, router or ("column:confidence" if live else "random"), higher_means
            )
            report = build_report(table, scores, num_seeds=seeds)
        except (TableError, LiveError, ValueError, OSError) as exc:
            raise _fail(exc) from exc
    print_report(report)
    if json_out is not None:
        json_out.write_text(report_json(report) + "\n", encoding="utf-8")
        typer.echo(f"wrote {json_out}")
    if plot_out is not None:
        plot_report(report, plot_out)
        typer.echo(f"wrote {plot_out}")


def calibrate_command(
    data: str | None = typer.Option(None, "--data", help=_DATA_HELP),
    from_traffic: str | None = typer.Option(
        None,
        "--from-traffic",
        help="Calibrate on a traffic record of `tandem serve` ([traffic] record; a SQLite file or a state database's "
        "postgresql:// URL): its requests with both tiers "
        "judged; routers column:router_score (with --higher-means cloud) or column:confidence.",
    ),
    router: str = typer.Option(
        ..., "--router", help="column:NAME or scores:FILE.csv (random and oracle have no deployable threshold)."
    ),
    quality: float | None = typer.Option(
        None, "--quality", min=0.0, help="Target: this fraction of the strong tier's accuracy, e.g. 0.95."
    ),
    cloud_share: float | None = typer.Option(
        None, "--cloud-share", min=0.0, max=1.0, help="Target: this share of requests to the cloud, e.g. 0.3."
    ),
    budget: float | None = typer.Option(
        None, "--budget", min=0.0, help="Target: at most this many USD per 1,000 requests (best quality within it)."
    ),
    higher_means: HigherMeans | None = typer.Option(
        None,
        "--higher-means",
        help="Which tier a higher score favours; default: local for a column, cloud for a scores file.",
    ),
    data_dir: str | None = typer.Option(
        None, "--data-dir", envvar="TANDEM_ROUTELLM_DIR", help="RouteLLM's data (default: ../shared/data/routellm)."
    ),
    datasets: str = typer.Option("gsm8k,mmlu", "--datasets", help="With --data routellm: comma-separated gsm8k, mmlu."),
    config: str | None = typer.Option(
        None,
        "--config",
        help="Config file to update (created if missing); default: $TANDEM_CONFIG, else ~/.config/tandem/config.toml.",
    ),
    setting: ThresholdSetting | None = typer.Option(
        None,
        "--setting",
        help="The [cascade] key to write; default: prompt_router_threshold for scores that favour the cloud "
        "(the prompt router's: a scores file, or --higher-means cloud), else threshold.",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the threshold and what it gives; write nothing."),
    prompt_tokens: float | None = typer.Option(
        None, "--prompt-tokens", min=0.0, help="Mean prompt tokens per request (default: the table's, else 256)."
    ),
    completion_tokens: float | None = typer.Option(
        None,
        "--completion-tokens",
        min=0.0,
        help="Mean completion tokens per request (default: the table's, else 256).",
    ),
    cloud_input_price: float | None = typer.Option(
        None,
        "--cloud-input-price",
        min=0.0,
        help="Cloud USD per 1M prompt tokens (default: the config's cascade.prices).",
    ),
    cloud_output_price: float | None = typer.Option(
        None,
        "--cloud-output-price",
        min=0.0,
        help="Cloud USD per 1M completion tokens (default: the config's cascade.prices).",
    ),
) -> None:
    """Pick the routing threshold for a target and write it to the config file: cascade.threshold for a
    confidence, cascade.prompt_router_threshold for the prompt router's scores."""
    from router.costs import CostTable
    from router.eval_tables import TableError
    from router.evaluation.calibrate import Target, choose_threshold, cost_model
    from sdk.settings import SettingsError
    from sdk.settings.config_file import config_path, read_config, write_threshold

    targets = [
        Target(kind, value)
        for kind, value in (("quality", quality), ("cloud_share", cloud_share), ("budget", budget))
        if value is not None
    ]
    if len(targets) != 1:
        raise _fail(ValueError("give exactly one target: --quality, --cloud-share or --budget"))
    if router.partition(":")[0] in ("random", "oracle"):
        raise _fail(ValueError(f"--router {router} has no threshold to deploy; use column:NAME or scores:FILE.csv"))
    try:
        path = config_path(config)
        prices = dict(read_config(path).get("cascade", {}).get("prices") or {})
        cloud = {"input_per_million": cloud_input_price, "output_per_million": cloud_output_price}
        prices["cloud"] = {**prices.get("cloud", {}), **{k: v for k, v in cloud.items() if v is not None}}
        table, scores = _load(data, data_dir, datasets, router, higher_means, from_traffic)
        costs = cost_model(table.examples, CostTable.from_config(prices), prompt_tokens, completion_tokens)
        point = choose_threshold(scores.confidence, table.examples, targets[0], costs)
        if setting is None:  # a prompt router's score is not the confidence the streaming policy compares
            setting = (
                ThresholdSetting.prompt_router_threshold
                if scores.higher_means == "cloud"
                else ThresholdSetting.threshold
            )
        if not dry_run:
            write_threshold(path, point.threshold, setting.value)
    except (TableError, ValueError, OSError, SettingsError) as exc:
        raise _fail(exc) from exc
    strong = point.quality / point.quality_of_strong if point.quality_of_strong else float("nan")
    typer.echo(
        f"threshold {point.threshold:.6g} on {len(table.examples)} prompts "
        f"({table.num_dropped_contaminated} contaminated dropped):"
    )
    typer.echo(f"  cloud share {point.cloud_share:.1%}")
    typer.echo(f"  quality     {point.quality:.4f} ({point.quality_of_strong:.1%} of strong's {strong:.4f})")
    typer.echo(f"  cost        {point.cost_per_1k:.4f} USD per 1k requests")
    if costs.assumed:
        typer.echo(f"  (assumed token counts for {', '.join(costs.assumed)}: give --prompt-tokens/--completion-tokens)")
    if dry_run:
        typer.echo(f"dry run: nothing written (it would set [cascade] {setting.value})")
    else:
        typer.echo(
            f"wrote [cascade] {setting.value} = {point.threshold!r} to {path} (comments in that file are not kept)"
        )


def register_eval_commands(app: typer.Typer) -> None:
    """Add `eval` and `calibrate` to the `tandem` app."""
    app.command("eval")(eval_command)
    app.command("calibrate")(calibrate_command)
