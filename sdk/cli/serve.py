"""`tandem serve`: the cascade behind the OpenAI-compatible HTTP API.

Models: `auto` (the router; `auto:<threshold>` overrides the configured threshold),
`local`, `cloud`, and the local model's own name (the local engine without routing).
Everything comes from sdk.settings (defaults < TOML file < TANDEM_* env < flags).
The local model and an embedded cloud engine load on their own threads; /health says 503
until both are in. SIGTERM/SIGINT: HTTP drains, then the cloud tier and the engines stop.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sqlite3
import time
from typing import TYPE_CHECKING, Optional

import typer

from sdk.cli.options import SAMPLING_KEYS, sampling_flags
from sdk.cli.setting_options import command_signature, option, settings_given

if TYPE_CHECKING:
    from sdk.settings.serve_config import ServeConfig

logger = logging.getLogger("tandem.serve")


# The settings `tandem serve` takes as options, each made from its sdk.settings field (type, help, env,
# check): `--name` for `section.name`, except where renamed.
SERVE_SETTINGS = (
    "cloud.url",
    "cascade.threshold",
    "cascade.draft_on_device",
    "local.model",
    "local.model_name",
    "server.host",
    "server.port",
    "server.api_key_file",
    "server.rate_limit",
    "server.max_concurrent_per_key",
    "server.auth_backoff_after",
    "server.strict_fields",
    "server.max_body_bytes",
    "server.state_db",
    "server.state_db_lease_s",
    "server.state_db_timeout_s",
    "server.store_responses",
    "server.tls_cert",
    "server.tls_key",
    "local.kv_cache_tokens",
    "local.max_num_seqs",
    "local.max_num_batched_tokens",
    "local.max_model_len",
    "local.max_waiting",
    "local.threads",
    "local.n_gpu_layers",
    "local.batch_invariant",
    "local.kv_layout",
    "local.kv_cache_type",
    "local.flash_attn",
    "local.prefill_weights",
    "local.extra_buffer_types",
    "local.repetition_stop",
    "local.close_within_max_tokens",
    "server.log_level",
)
RENAMED = {"cloud.url": "cloud"}
ALSO_SETS = {"local.close_within_max_tokens": ("cloud.close_within_max_tokens",)}  # one switch for both tiers

_OWN_OPTIONS = [
    option(
        "config",
        Optional[str],
        "--config",
        help="TOML config file (default: $TANDEM_CONFIG, else ~/.config/tandem/config.toml if present).",
    ),
    option(
        "local_sampling",
        Optional[list[str]],
        "--local-sampling",
        metavar="KEY=VALUE",
        help=f"Local tier's default for a sampling field requests leave out (repeatable): {SAMPLING_KEYS}; default: "
        "the model's (SmolLM2-Instruct: temperature=0.2, top_p=0.9). [env: TANDEM_LOCAL_SAMPLING_<KEY>]",
    ),
    option(
        "cloud_sampling",
        Optional[list[str]],
        "--cloud-sampling",
        metavar="KEY=VALUE",
        help="The embedded cloud engine's, likewise. [env: TANDEM_CLOUD_SAMPLING_<KEY>]",
    ),
]


def serve(**options) -> None:
    """Serve the cascade over the OpenAI-compatible HTTP API: models auto, local, cloud."""
    from sdk.budgets.config import BudgetConfigError
    from sdk.serving.api_keys import ApiKeyConfigError
    from sdk.engine_common.model_files import ModelNotFoundError
    from sdk.settings import SettingsError, load_settings
    from sdk.settings.serve_config import ServeConfig

    config, local_sampling, cloud_sampling = options["config"], options["local_sampling"], options["cloud_sampling"]
    flags = settings_given(options, SERVE_SETTINGS, RENAMED, ALSO_SETS)
    try:  # every configuration error is reported before anything loads or binds
        flags |= sampling_flags("local", local_sampling) | sampling_flags("cloud", cloud_sampling)
        serve_config = ServeConfig.from_settings(load_settings(config, cli=flags))
    except (SettingsError, ModelNotFoundError, ApiKeyConfigError, BudgetConfigError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    level = serve_config.listener.log_level
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    failed = run_serve(serve_config)
    if failed:
        typer.echo(f"tandem serve: {failed}", err=True)
        raise typer.Exit(code=1)


serve.__signature__ = command_signature(SERVE_SETTINGS, _OWN_OPTIONS, RENAMED)  # typer reads its options from here


def run_serve(config: ServeConfig) -> str | None:
    """Serve until a signal; returns why serving failed, or None after a clean stop."""
    from local_runtime.async_engine import AsyncLocalEngine

    started = time.monotonic()
    logger.info("loading the local model %s", config.local.model_path or "(the embedded SmolLM2-135M-Instruct)")
    engine = AsyncLocalEngine(config.local).start()
    try:
        return asyncio.run(_serve(config, engine, started))
    finally:
        engine.shutdown()


async def _serve(config: ServeConfig, engine, started: float) -> str | None:
    from sdk.assembly.cascade import CascadeStartError, start_cascade
    from sdk.embeddings.service import EmbeddingService
    from sdk.openai_server import AppServices, attach_cloud_engine, create_app
    from sdk.openai_server.serve_loop import HttpServer, http_config, stop_on_signals, watch_loading
    from sdk.response_store import open_response_store

    listener = config.listener
    try:  # an embedded cloud engine starts later, behind the local tier (bring_up_embedded below)
        cascade = await start_cascade(config, engine, cloud_later=True)
    except CascadeStartError as exc:
        return str(exc)
    try:
        responses = open_response_store(listener, cascade.state)
    except (OSError, sqlite3.Error, ValueError) as exc:
        await cascade.close()
        return f"the stored responses could not be opened: {exc}"
    services = AppServices(
        engine,
        cascade=cascade.runner,
        also_ready=lambda: cascade.cloud.is_ready,
        client_limits=config.app.client_limits(state=cascade.state),
        learning=cascade.learning,
        budgets=cascade.budgets,
        state_db=cascade.state,
        response_store=responses,
        embeddings=EmbeddingService(threads=1),  # loads on first use: MiniLM beside llama.cpp gets one core
    )
    app = create_app(config.app, services)
    http = HttpServer(
        http_config(
            app, listener.host, listener.port, listener.log_level, config.api_keys, listener.tls_cert, listener.tls_key
        )
    )
    stop_on_signals(http)
    failures: list[str] = []

    async def bring_up_embedded() -> None:
        """The engine loads after the local model: both loading at once took the local tier from
        ~0.5 s to ~10 s (the cloud engine's load holds the GIL). torch and the engine's modules
        import after it too, on a thread (the loop keeps answering /health): importing them while
        the local model loaded took that load from ~0.7 s to ~3.5 s on 2 cores (the import holds
        the GIL, and the local load's per-token ctypes calls wait for it each time they return),
        which cost /health more than the overlap gained the cloud tier."""
        await watch_loading("local", engine, http, failures, logger, started)
        if failures:
            return
        try:
            await asyncio.to_thread(importlib.import_module, "cloud_engine.async_engine")
            await cascade.bring_up_cloud(config)
        except OSError as exc:
            failures.append(f"the embedded cloud tier could not start: {exc}")
            http.should_exit = True
            return
        attach_cloud_engine(app, cascade.cloud.engine)
        await watch_loading("cloud", cascade.cloud.engine, http, failures, logger, started)

    # /health is 200 once the local model is in; an embedded cloud engine loads behind it.
    watcher = asyncio.create_task(
        bring_up_embedded()
        if config.cloud.embedded
        else watch_loading("local", engine, http, failures, logger, started)
    )
    logger.info(
        "serving the cascade on http://%s:%d (cloud tier: %s, threshold %.2f)",
        listener.host,
        listener.port,
        cascade.cloud.description,
        cascade.runner.config.default_threshold,
    )
    cascade.learning.start_background(cascade.runner)
    try:
        await http.serve()
        if not http.started and not failures:
            failures.append(f"the HTTP server could not start on {listener.host}:{listener.port} (see the log above)")
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        if responses is not None:
            await responses.close()
        await cascade.close()
    return failures[0] if failures else None
