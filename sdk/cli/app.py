"""The `tandem` command line: one typer app; heavy imports stay inside the commands."""

from __future__ import annotations

import typer

from sdk.cli.cloud import cloud_app
from sdk.cli.config import config_app
from sdk.cli.eval import register_eval_commands
from sdk.cli.export_hf import export_hf
from sdk.cli.router import router_app
from sdk.cli.serve import serve
from sdk.cli.traffic import traffic_app

app = typer.Typer(help="tandem: a hybrid on-device-to-cloud LLM runtime.", no_args_is_help=True)
app.command()(serve)
app.add_typer(cloud_app, name="cloud")
app.add_typer(config_app, name="config")
register_eval_commands(app)
app.command("export-hf")(export_hf)
app.add_typer(router_app, name="router")
app.add_typer(traffic_app, name="traffic")


@app.command()
def version() -> None:
    """Print the installed tandem version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        typer.echo(package_version("tandem-llm"))
    except PackageNotFoundError:
        typer.echo("tandem-llm (not installed; running from a source tree)")
