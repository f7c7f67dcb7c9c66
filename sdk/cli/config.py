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
        None,
        "--config",
        help="TOML file to read; default: $TANDEM_CONFIG, else $XDG_CONFIG_HOME/tandem/config.toml if present.",
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
    from sdk.engine_common.model_files import ModelNotFoundError

    try:
        sampling = {tier: settings.effective_sampling(tier) for tier in ("local", "cloud")}
    except (ModelNotFoundError, OSError, ValueError) as exc:
        typer.echo(f"tandem config: cannot read the model's sampling defaults: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    if as_json:
        data = settings.as_dict()
        data["effective_sampling"] = {tier: d.as_dict() if d else None for tier, d in sampling.items()}
        typer.echo(json.dumps(data, indent=2))
        return
    typer.echo(settings.as_toml(), nl=False)
    typer.echo("\n# Effective sampling defaults (what a request that leaves a field out gets), with sources:")
    for tier, defaults in sampling.items():
        if defaults is None:
            typer.echo(f"#   {tier}: decided by the remote cloud server ({settings.get('cloud.url')})")
            continue
        for name, entry in defaults.as_dict().items():
            typer.echo(f"#   {tier}.{name} = {entry['value']!r}  ({entry['source']})")
