"""`tandem config show`: the effective configuration, and where each value came from.

Imports stay inside the command: `sdk.cli.app` imports this module for every `tandem` command.
"""

from __future__ import annotations

import typer

config_app = typer.Typer(
    help="tandem's configuration: defaults < TOML file < TANDEM_* env vars < command-line options.",
    no_args_is_help=True,
)


@config_app.callback()
def _group() -> None:
    # Without a callback typer collapses a one-command app, and `show` would stop being a subcommand.
    pass


@config_app.command("show")
def show(
    config: str | None = typer.Option(
        None, "--config", help="TOML file to read; default: $TANDEM_CONFIG, else $XDG_CONFIG_HOME/tandem/config.toml if present."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (values, sources, file) instead of TOML."),
) -> None:
    """Print the effective configuration with each value's source (secrets shown as ***)."""
    import json

    from sdk.settings import SettingsError, load_settings

    try:
        settings = load_settings(config)
    except SettingsError as exc:
        typer.echo(f"tandem config: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    if as_json:
        typer.echo(json.dumps(settings.as_dict(), indent=2))
    else:
        typer.echo(settings.as_toml(), nl=False)
