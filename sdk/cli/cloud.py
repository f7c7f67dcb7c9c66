"""`tandem cloud serve`: the cloud engine behind gRPC (tandem.v1) and the OpenAI HTTP API, in one process.

Both servers share one AsyncCloudEngine and one asyncio loop. The model loads on the
engine thread, so /health answers 503 and gRPC health says NOT_SERVING until it is in.
SIGTERM/SIGINT drain the replica (sdk.openai_server.drain): health turns NOT_SERVING on both
listeners, new requests are refused (UNAVAILABLE / 503: a client retries them elsewhere), the
ones in flight get --drain-grace-s to finish; then HTTP and gRPC stop and the engine shuts down.
A second signal stops at once.
"""

from __future__ import annotations

from typing import Optional

import typer

from sdk.cli.options import SAMPLING_KEYS, sampling_flags
from sdk.cli.setting_options import command_signature, option, settings_given

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
    "cloud.max_num_seqs",
    "cloud.max_num_batched_tokens",
    "cloud.max_model_len",
    "cloud.max_waiting",
    "cloud.speculative",
    "cloud.num_speculative_tokens",
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
    from cloud_engine.grpc.server import GrpcServerConfig
    from router.costs import TierPrices
    from sdk.budgets.config import BudgetConfigError
    from sdk.budgets.manager import check_budgets
    from sdk.openai_server.serve_loop import check_tls_files
    from sdk.protocol.api_keys import ApiKeyConfigError, load_api_keys
    from sdk.settings import SettingsError, load_settings

    try:  # every configuration error is reported before anything loads or binds
        flags = settings_given(options, CLOUD_SERVE_SETTINGS) | sampling_flags("cloud", options["sampling"])
        settings = load_settings(options["config"], cli=flags)
        server = settings.values["cloud_server"]  # the listeners' keys (the engine's are [cloud]'s)
        api_keys = load_api_keys(server["api_key_file"])
        engine_config = settings.cloud_engine_config()
        grpc_config = GrpcServerConfig(
            host=server["host"],
            port=server["grpc_port"],
            api_keys=api_keys,
            tls_cert_path=server["tls_cert"],
            tls_key_path=server["tls_key"],
        )
        check_tls_files(server["tls_cert"], server["tls_key"])
        prices = TierPrices(server["price_input_per_million"], server["price_output_per_million"])
        admin_key = _read_admin_key(server["admin_key_file"]) if server["admin_key_file"] else None
        if server["budgets_file"]:
            check_budgets(server["budgets_file"], prices_are_zero=prices == TierPrices(), cloud_only=True)
        app_config = settings.app_config("cloud", api_keys)
        # One budget per key for both listeners: a key cannot double its share by switching protocol.
        client_limits = app_config.client_limits()
    except (ValueError, ApiKeyConfigError, SettingsError, BudgetConfigError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc

    logging.basicConfig(level=server["log_level"].upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if server["threads"] is not None:
        import torch

        torch.set_num_threads(server["threads"])  # process-wide: the engine thread's kernels use it
    engine = AsyncCloudEngine(engine_config).start()
    try:
        billing = (server["budgets_file"], server["spend_path"], prices) if server["budgets_file"] else None
        replica = {"admin_key": admin_key, "drain_grace_s": server["drain_grace_s"]}
        failed = asyncio.run(
            _serve_both(
                engine, grpc_config, app_config, client_limits, server["port"], server["log_level"], billing, replica
            )
        )
    finally:
        engine.shutdown()
    if failed:
        typer.echo(f"tandem cloud serve: {failed}", err=True)
        raise typer.Exit(code=1)


serve.__signature__ = command_signature(CLOUD_SERVE_SETTINGS, _OWN_OPTIONS)  # typer reads its options from here
cloud_app.command("serve")(serve)


def _read_admin_key(path: str) -> str:
    """The admin key: the file's first key (ApiKeyConfigError for an unreadable file, ValueError for a missing or short key)."""
    from sdk.protocol.api_keys import read_key_file

    keys = read_key_file(path, "the admin key file")
    if not keys or len(keys[0]) < 16:
        raise ValueError(f"the admin key file {path!r} must hold one key of at least 16 characters")
    return keys[0]


async def _serve_both(
    engine,
    grpc_config,
    app_config,
    client_limits,
    port: int,
    log_level: str,
    billing: tuple | None = None,
    replica: dict | None = None,
) -> str | None:
    """Run uvicorn and the gRPC server until a signal or a failed load; returns why it failed, or None.
    `billing`: (budgets file, spend path, prices): both listeners serve the engine through one
    sdk.budgets.metered_engine.BudgetedEngine, so a key has one budget whichever door it uses."""
    import asyncio
    import logging

    logger = logging.getLogger("tandem.cloud.serve")

    budgets = None
    if billing is not None:
        from sdk.budgets.manager import open_budgets
        from sdk.budgets.metered_engine import BudgetedEngine

        budgets_file, spend_path, prices = billing
        try:
            budgets = open_budgets(budgets_file, spend_path, prices_are_zero=False, cloud_only=True)
        except (OSError, ValueError) as exc:
            return f"the budgets could not start: {exc}"
        engine = BudgetedEngine(engine, budgets, prices)
    try:
        return await _serve_engine(
            engine, grpc_config, app_config, client_limits, port, log_level, budgets, logger, replica or {}
        )
    finally:
        if budgets is not None:
            await asyncio.to_thread(budgets.ledger.close)


async def _serve_engine(
    engine, grpc_config, app_config, client_limits, port, log_level, budgets, logger, replica: dict
) -> str | None:
    """Both listeners over one DrainableEngine (a replica of a replicated tier: sdk.openai_server.drain)."""
    import asyncio

    from cloud_engine.grpc.server import start_grpc_server, stop_grpc_server
    from sdk.openai_server import create_app
    from sdk.openai_server.drain import DrainableEngine, admin_routes
    from sdk.openai_server.serve_loop import HttpServer, drain_on_signals, http_config, watch_loading

    engine = DrainableEngine(engine)
    host = app_config.bind_host
    app = create_app(engine, app_config, client_limits=client_limits, budgets=budgets)
    if replica.get("admin_key"):
        admin_routes(app, engine, replica["admin_key"])
    http = HttpServer(
        http_config(
            app, host, port, log_level, app_config.api_keys, grpc_config.tls_cert_path, grpc_config.tls_key_path
        )
    )
    try:
        grpc_server = await start_grpc_server(engine, grpc_config, client_limits)
    except OSError as exc:
        return str(exc)
    failures: list[str] = []
    drain_on_signals(http, engine, replica.get("drain_grace_s", 30.0))
    watcher = asyncio.create_task(watch_loading("cloud", engine, http, failures, logger))
    logger.info("gRPC on %s, HTTP on %s:%d", grpc_config.address, host, port)
    try:
        await http.serve()  # returns after SIGINT/SIGTERM (stop_on_signals) and the HTTP drain
        if not http.started and not failures:
            failures.append(f"the HTTP server could not start on {host}:{port} (see the log above)")
    finally:
        watcher.cancel()
        await stop_grpc_server(grpc_server, grace_s=5.0)
    return failures[0] if failures else None
