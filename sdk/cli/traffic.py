"""`tandem traffic stats|purge`: the traffic record `tandem serve` keeps with [traffic] record = true."""

from __future__ import annotations

from typing import Optional

import typer

traffic_app = typer.Typer(
    help="The traffic record: what `tandem serve` keeps of routed requests to learn from.", no_args_is_help=True
)

_PATH_HELP = (
    "The record: a SQLite file, or the postgresql:// URL of the state database replicas share (default: [server] "
    "state_db from the config, else [traffic] path, else $TANDEM_DATA_DIR/traffic.sqlite3 or "
    "~/.local/share/tandem/traffic.sqlite3)."
)


def _path(path: str | None, config: str | None) -> str:
    if path:
        return path
    from sdk.settings import load_settings

    settings = load_settings(config)
    return settings.get("server.state_db") or settings.traffic_settings().record_path


@traffic_app.command("stats")
def stats(
    path: Optional[str] = typer.Option(None, "--path", help=_PATH_HELP),
    config: Optional[str] = typer.Option(
        None, "--config", help="TOML config file to read [server] state_db and [traffic] path from."
    ),
) -> None:
    """What the record holds: requests by tier, labels by source, counters, size."""
    import json

    from sdk.traffic.store import stats as read_stats
    from sdk.traffic.stores import connect

    target = _path(path, config)
    try:
        conn = connect(target, create=False)
    except (OSError, RuntimeError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    try:
        typer.echo(json.dumps(read_stats(conn), indent=2))
    finally:
        conn.close()


@traffic_app.command("purge")
def purge(
    path: Optional[str] = typer.Option(None, "--path", help=_PATH_HELP),
    config: Optional[str] = typer.Option(
        None, "--config", help="TOML config file to read [server] state_db and [traffic] path from."
    ),
    older_than_days: Optional[float] = typer.Option(
        None, "--older-than-days", min=0.0, help="Delete rows older than this."
    ),
    key_fingerprint: Optional[str] = typer.Option(
        None,
        "--key-fingerprint",
        help="Delete the rows of one API key: its id (the key's SHA-256), or the 16-digit prefix the server logs.",
    ),
    everything: bool = typer.Option(False, "--all", help="Delete every row and counter."),
) -> None:
    """Delete rows (and their labels) from the record; a running server may keep writing new ones."""
    from sdk.traffic.store import purge as delete
    from sdk.traffic.stores import connect

    if not everything and older_than_days is None and key_fingerprint is None:
        raise typer.BadParameter("say what to delete: --all, --older-than-days N and/or --key-fingerprint FP")
    target = _path(path, config)
    try:
        conn = connect(target, create=False)
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
