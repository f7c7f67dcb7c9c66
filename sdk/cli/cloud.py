"""`tandem cloud serve`: the cloud engine behind gRPC (tandem.v1) and the OpenAI HTTP API, in one process.

Both servers share one AsyncCloudEngine and one asyncio loop. The model loads on the
engine thread, so /health answers 503 and gRPC health says NOT_SERVING until it is in.
SIGTERM/SIGINT drain the replica (sdk.openai_server.drain): health turns NOT_SERVING on both
listeners, new requests are refused (UNAVAILABLE / 503: a client retries them elsewhere), the
ones in flight get --drain-grace-s to finish; then HTTP and gRPC stop and the engine shuts down.
A second signal stops at once.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Optional

import typer

from sdk.cli.options import SAMPLING_KEYS, sampling_flags
from sdk.cli.setting_options import command_signature, option, settings_given

if TYPE_CHECKING:
    from sdk.settings.serve_config import CloudServeConfig

cloud_app = typer.Typer(help="The cloud tier: serve the PyTorch engine over gRPC and HTTP.", no_args_is_help=True)

# The settings `tandem cloud serve` takes as options (`--name` for `section.name`), each made from its
# sdk.settings field: the [cloud] engine and the [cloud_server] listeners, env variables TANDEM_CLOUD_*.
CLOUD_SERVE_SETTINGS = (
    "cloud.model",
    "cloud.model_name",
    "cloud_server.host",
    "cloud_server.port",
    "cloud_server.grpc_port",
    "cloud.device",
    "cloud_server.threads",
    "cloud.dtype",
    "cloud.kv_cache_gb",
    "cloud.kv_cache_dtype",
    "cloud.weight_dtype",
    "cloud.max_num_seqs",
    "cloud.max_num_batched_tokens",
    "cloud.max_model_len",
    "cloud.max_waiting",
    "cloud.speculative",
    "cloud.num_speculative_tokens",
    "cloud.max_draft_tokens",
    "cloud.compile",
    "cloud.close_within_max_tokens",
    "cloud_server.api_key_file",
    "cloud_server.rate_limit",
    "cloud_server.max_concurrent_per_key",
    "cloud_server.auth_backoff_after",
    "cloud_server.auth_backoff_max_s",
    "cloud_server.strict_fields",
    "cloud_server.max_body_bytes",
    "cloud_server.price_input_per_million",
    "cloud_server.price_output_per_million",
    "cloud_server.budgets_file",
    "cloud_server.spend_path",
    "cloud_server.admin_key_file",
    "cloud_server.drain_grace_s",
    "cloud_server.draft_max_support",
    "cloud_server.drafts_per_second",
    "cloud_server.drafts_max_outstanding",
    "cloud_server.state_db",
    "cloud_server.state_db_lease_s",
    "cloud_server.state_db_timeout_s",
    "cloud_server.store_responses",
    "cloud_server.tls_cert",
    "cloud_server.tls_key",
    "cloud_server.log_level",
)

_OWN_OPTIONS = [
    option(
        "config",
        Optional[str],
        "--config",
        help="TOML config file: its [cloud] and [cloud_server] sections "
        "(default: $TANDEM_CONFIG, else ~/.config/tandem/config.toml if present).",
    ),
    option(
        "sampling",
        Optional[list[str]],
        "--sampling",
        metavar="KEY=VALUE",
        help=f"Default for a sampling field requests leave out (repeatable): {SAMPLING_KEYS}; default: the model's "
        "(its metadata, a built-in table, else OpenAI's). [env: TANDEM_CLOUD_SAMPLING_<KEY>]",
    ),
]


def serve(**options) -> None:
    """Serve the cloud engine: gRPC (default :50051) and the OpenAI HTTP API (default :8000)."""
    import asyncio
    import logging

    from cloud_engine.async_engine import AsyncCloudEngine
    from sdk.budgets.config import BudgetConfigError
    from sdk.serving.api_keys import ApiKeyConfigError
    from sdk.settings import SettingsError, load_settings
    from sdk.settings.serve_config import CloudServeConfig

    try:  # every configuration error is reported before anything loads or binds
        flags = settings_given(options, CLOUD_SERVE_SETTINGS) | sampling_flags("cloud", options["sampling"])
        config = CloudServeConfig.from_settings(load_settings(options["config"], cli=flags))
        grpc_server_config(config)  # its own checks (ports, TLS pairs), before the model loads
    except (ValueError, ApiKeyConfigError, SettingsError, BudgetConfigError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc

    level = config.listener.log_level
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if config.hosted.threads is not None:
        import torch

        torch.set_num_threads(config.hosted.threads)  # process-wide: the engine thread's kernels use it
    engine = AsyncCloudEngine(config.engine).start()
    try:
        failed = asyncio.run(_serve_both(engine, config))
    finally:
        engine.shutdown()
    if failed:
        typer.echo(f"tandem cloud serve: {failed}", err=True)
        raise typer.Exit(code=1)


serve.__signature__ = command_signature(CLOUD_SERVE_SETTINGS, _OWN_OPTIONS)  # typer reads its options from here
cloud_app.command("serve")(serve)


# `tandem cloud precompile` takes the engine's settings only: they alone shape the compiled step.
PRECOMPILE_SETTINGS = tuple(name for name in CLOUD_SERVE_SETTINGS if name.startswith("cloud."))


def precompile(**options) -> None:
    """Compile the cloud engine's decode step ahead of time for these settings: `tandem cloud serve` with the same
    ones and compile = auto then loads it at start instead of running eager steps."""
    import dataclasses
    import logging

    from cloud_engine.engine import CloudEngine
    from sdk.settings import SettingsError, load_settings
    from sdk.settings.serve_config import CloudServeConfig

    try:
        flags = settings_given(options, PRECOMPILE_SETTINGS)
        config = CloudServeConfig.from_settings(load_settings(options["config"], cli=flags))
    except (ValueError, SettingsError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    logging.basicConfig(level="WARNING", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = CloudEngine(dataclasses.replace(config.engine, compile="auto"))
    try:
        path, seconds = engine.precompile()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    finally:
        engine.close()
    typer.echo(f"precompiled the decode step in {seconds:.1f} s: {path}")


precompile.__signature__ = command_signature(PRECOMPILE_SETTINGS, _OWN_OPTIONS[:1])
cloud_app.command("precompile")(precompile)


def grpc_server_config(config: CloudServeConfig):
    """The gRPC listener's config: [cloud_server]'s host, grpc_port, keys, TLS and what it takes of drafts."""
    from sdk.protocol.drafts import DraftLimits
    from sdk.serving.grpc.server import GrpcServerConfig

    listener, hosted = config.listener, config.hosted
    return GrpcServerConfig(
        host=listener.host,
        port=hosted.grpc_port,
        api_keys=config.api_keys,
        tls_cert_path=listener.tls_cert,
        tls_key_path=listener.tls_key,
        draft_limits=DraftLimits(hosted.draft_max_support, hosted.drafts_per_second, hosted.drafts_max_outstanding),
    )


async def _serve_both(engine, config: CloudServeConfig) -> str | None:
    """Run uvicorn and the gRPC server until a signal or a failed load; returns why it failed, or None.
    With [cloud_server] budgets_file, both listeners serve the engine through one
    sdk.budgets.metered_engine.BudgetedEngine, so a key has one budget whichever door it uses.
    With [cloud_server] state_db, the budgets and the client limits are kept in the database every
    replica shares (sdk.state); unreachable at start, the server does not start."""
    from sdk.state.database import open_state_database

    try:
        state = await open_state_database(config.listener)
    except RuntimeError as exc:
        return str(exc)
    from sdk.owner_migration import migrate_owners_at_start

    budgets = None
    try:
        await migrate_owners_at_start(config.listener, config.api_keys, state)  # before the stores open
        if config.listener.budgets_file:
            from sdk.budgets.manager import open_budgets
            from sdk.budgets.metered_engine import BudgetedEngine

            try:
                budgets = open_budgets(
                    config.listener.budgets_file,
                    config.listener.spend_path,
                    prices_are_zero=False,
                    cloud_only=True,
                    state=state,
                )
            except (OSError, ValueError) as exc:
                return f"the budgets could not start: {exc}"
            engine = BudgetedEngine(engine, budgets, config.prices)
        return await _serve_engine(engine, config, budgets, state)
    finally:
        if budgets is not None:
            await budgets.ledger.aclose()
        if state is not None:
            await state.close()


async def _serve_engine(engine, config: CloudServeConfig, budgets=None, state=None) -> str | None:
    """Both listeners over one DrainableEngine (a replica of a replicated tier: sdk.openai_server.drain)."""
    import asyncio
    import logging

    from sdk.serving.grpc.server import start_grpc_server, stop_grpc_server
    from sdk.openai_server import AppServices, create_app
    from sdk.openai_server.drain import DrainableEngine, admin_routes
    from sdk.response_store import open_response_store
    from sdk.openai_server.serve_loop import HttpServer, drain_on_signals, http_config, watch_loading

    logger = logging.getLogger("tandem.cloud.serve")
    listener, grpc_config = config.listener, grpc_server_config(config)
    # One budget per key for both listeners: a key cannot double its share by switching protocol.
    client_limits = config.app.client_limits(state=state)
    engine = DrainableEngine(engine)
    try:
        responses = open_response_store(listener, state)
    except (OSError, sqlite3.Error, ValueError) as exc:
        return f"the stored responses could not be opened: {exc}"
    services = AppServices(
        engine, client_limits=client_limits, budgets=budgets, state_db=state, response_store=responses
    )
    app = create_app(config.app, services)
    if config.admin_key:
        admin_routes(app, engine, config.admin_key)
    http = HttpServer(
        http_config(
            app, listener.host, listener.port, listener.log_level, config.api_keys, listener.tls_cert, listener.tls_key
        )
    )
    try:
        grpc_server = await start_grpc_server(engine, grpc_config, client_limits)
    except OSError as exc:
        if responses is not None:
            await responses.close()
        return str(exc)
    failures: list[str] = []
    drain_on_signals(http, engine, config.hosted.drain_grace_s)
    watcher = asyncio.create_task(watch_loading("cloud", engine, http, failures, logger))
    logger.info("gRPC on %s, HTTP on %s:%d", grpc_config.address, listener.host, listener.port)
    try:
        await http.serve()  # returns after SIGINT/SIGTERM (stop_on_signals) and the HTTP drain
        if not http.started and not failures:
            failures.append(f"the HTTP server could not start on {listener.host}:{listener.port} (see the log above)")
    finally:
        watcher.cancel()
        await stop_grpc_server(grpc_server, grace_s=5.0)
        if responses is not None:
            await responses.close()
    return failures[0] if failures else None
