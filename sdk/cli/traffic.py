"""`tandem traffic stats|purge`: the traffic record `tandem serve` keeps with [traffic] record = true."""

from __future__ import annotations

from typing import Optional

import typer

traffic_app = typer.Typer(
    help="The traffic record: what `tandem serve` keeps of routed requests to learn from.", no_args_is_help=True
)

_PATH_HELP = (
    "The record (default: [traffic] path from the config, else $TANDEM_DATA_DIR/traffic.sqlite3 or "
    "~/.local/share/tandem/traffic.sqlite3)."
)


def _path(path: str | None, config: str | None) -> str:
    if path:
        return path
    from sdk.settings import load_settings

    return load_settings(config).traffic_settings().record_path


@traffic_app.command("stats")
def stats(
    path: Optional[str] = typer.Option(None, "--path", help=_PATH_HELP),
    config: Optional[str] = typer.Option(None, "--config", help="TOML config file to read [traffic] path from."),
) -> None:
    """What the record holds: requests by tier, labels by source, counters, size."""
    import json

    from sdk.traffic.store import connect, stats as read_stats

    try:
        conn = connect(_path(path, config), create=False)
    except (OSError, RuntimeError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    try:
        typer.echo(json.dumps(read_stats(conn), indent=2))
    finally:
        conn.close()


@traffic_app.command("purge")
def purge(
    path: Optional[str] = typer.Option(None, "--path", help=_PATH_HELP),
    config: Optional[str] = typer.Option(None, "--config", help="TOML config file to read [traffic] path from."),
    older_than_days: Optional[float] = typer.Option(
        None, "--older-than-days", min=0.0, help="Delete rows older than this."
    ),
    key_fingerprint: Optional[str] = typer.Option(
        None, "--key-fingerprint", help="Delete the rows of one API key (its fingerprint, as the server logs it)."
    ),
    everything: bool = typer.Option(False, "--all", help="Delete every row and counter."),
) -> None:
    """Delete rows (and their labels) from the record; a running server may keep writing new ones."""
    from sdk.traffic.store import connect, purge as delete

    if not everything and older_than_days is None and key_fingerprint is None:
        raise typer.BadParameter("say what to delete: --all, --older-than-days N and/or --key-fingerprint FP")
    try:
        conn = connect(_path(path, config), create=False)
    except (OSError, RuntimeError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    try:
        deleted = delete(
            conn,
            older_than_s=None if older_than_days is None else older_than_days * 86400,
            key_fingerprint=key_fingerprint,
            everything=everything,
        )
    finally:
        conn.close()
    typer.echo(f"deleted {deleted} request rows (and their labels)")
