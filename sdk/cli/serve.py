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
import time
from typing import Optional

import typer

from sdk.cli.options import SAMPLING_KEYS, sampling_flags
from sdk.cli.setting_options import command_signature, option, settings_given

logger = logging.getLogger("tandem.serve")


# The settings `tandem serve` takes as options, each made from its sdk.settings field (type, help, env,
# check): `--name` for `section.name`, except where renamed.
SERVE_SETTINGS = (
    "cloud.url",
    "cascade.threshold",
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
    from sdk.openai_server.serve_loop import check_tls_files
    from sdk.protocol.api_keys import ApiKeyConfigError, load_api_keys
    from sdk.protocol.model_files import ModelNotFoundError, resolve_model_path
    from sdk.settings import SettingsError, load_settings

    config, local_sampling, cloud_sampling = options["config"], options["local_sampling"], options["cloud_sampling"]
    flags = settings_given(options, SERVE_SETTINGS, RENAMED, ALSO_SETS)
    try:  # every configuration error is reported before anything loads or binds
        flags |= sampling_flags("local", local_sampling) | sampling_flags("cloud", cloud_sampling)
        settings = load_settings(config, cli=flags)
        resolve_model_path(settings.get("local.model"))  # load_settings checked the values, not the file
        api_keys = load_api_keys(settings.get("server.api_key_file"))
        check_tls_files(settings.get("server.tls_cert"), settings.get("server.tls_key"))
        if settings.get("server.budgets_file"):
            from sdk.budgets.manager import check_budgets

            check_budgets(settings.get("server.budgets_file"), cloud_prices_are_zero(settings))
    except (SettingsError, ModelNotFoundError, ApiKeyConfigError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    level = settings.get("server.log_level")
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    failed = run_serve(settings, api_keys)
    if failed:
        typer.echo(f"tandem serve: {failed}", err=True)
        raise typer.Exit(code=1)


serve.__signature__ = command_signature(SERVE_SETTINGS, _OWN_OPTIONS, RENAMED)  # typer reads its options from here


def cloud_prices_are_zero(settings) -> bool:
    """Whether the cascade's cloud tier costs nothing at the configured prices (USD budgets then mean nothing)."""
    from router.costs import CostTable

    prices = CostTable.from_config(settings.get("cascade.prices")).prices("cloud")
    return prices.input_per_million == 0 and prices.output_per_million == 0


def run_serve(settings, api_keys: frozenset[str]) -> str | None:
    """Serve until a signal (api_keys: sdk.protocol.api_keys.load_api_keys's, loaded while checking the
    settings); returns why serving failed, or None after a clean stop."""
    from local_runtime.async_engine import AsyncLocalEngine

    started = time.monotonic()
    logger.info("loading the local model %s", settings.get("local.model") or "(the embedded SmolLM2-135M-Instruct)")
    engine = AsyncLocalEngine(settings.local_engine_config()).start()
    try:
        return asyncio.run(_serve(settings, engine, api_keys, started))
    finally:
        engine.shutdown()


async def _serve(settings, engine, api_keys: frozenset[str], started: float) -> str | None:
    from sdk.cascade.runner import CascadeRunner
    from sdk.cloud.tier import CloudTier, start_cloud_tier
    from sdk.openai_server import attach_cloud_engine, create_app
    from sdk.openai_server.serve_loop import HttpServer, http_config, stop_on_signals, watch_loading
    from sdk.embeddings.service import EmbeddingService
    from sdk.traffic.learning import start_learning

    host, port, log_level = settings.get("server.host"), settings.get("server.port"), settings.get("server.log_level")
    embedded = settings.cloud_target().kind == "embedded"
    try:  # an embedded cloud engine starts later, behind the local tier (bring_up_embedded below)
        cloud = CloudTier(description="embedded", pending=True) if embedded else await start_cloud_tier(settings)
    except OSError as exc:
        return f"the cloud tier could not start: {exc}"
    try:  # the probe and the prompt router load here: a wrong file is a clean exit, not a traceback
        runner = CascadeRunner(engine, cloud.client, settings.cascade_config(), cloud_ready=lambda: cloud.is_ready)
    except (OSError, ValueError) as exc:
        await cloud.close()
        return f"the cascade could not start: {exc}"
    budgets = None
    if settings.get("server.budgets_file"):
        from sdk.budgets.manager import open_budgets

        try:
            budgets = runner.budgets = open_budgets(
                settings.get("server.budgets_file"), settings.get("server.spend_path"), cloud_prices_are_zero(settings)
            )
        except (OSError, ValueError) as exc:
            await cloud.close()
            return f"the budgets could not start: {exc}"
    traffic_settings = settings.traffic_settings()
    try:
        learning = start_learning(runner, traffic_settings)
    except Exception as exc:  # an unusable record file (another schema, no permission): say so before serving
        await cloud.close()
        return f"the traffic record could not start: {exc}"
    app = create_app(
        engine,
        settings.app_config("local", api_keys),
        cascade=runner,
        also_ready=lambda: cloud.is_ready,
        traffic=learning.record,
        budgets=budgets,
        embeddings=EmbeddingService(threads=1),
    )  # loads on first use: MiniLM beside llama.cpp gets one core
    learning.attach_metrics(app)
    http = HttpServer(
        http_config(
            app, host, port, log_level, api_keys, settings.get("server.tls_cert"), settings.get("server.tls_key")
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
            cloud.take(await start_cloud_tier(settings))
        except OSError as exc:
            failures.append(f"the embedded cloud tier could not start: {exc}")
            http.should_exit = True
            return
        runner.cloud = cloud.client
        attach_cloud_engine(app, cloud.engine)
        await watch_loading("cloud", cloud.engine, http, failures, logger, started)

    # /health is 200 once the local model is in; an embedded cloud engine loads behind it.
    watcher = asyncio.create_task(
        bring_up_embedded() if embedded else watch_loading("local", engine, http, failures, logger, started)
    )
    logger.info(
        "serving the cascade on http://%s:%d (cloud tier: %s, threshold %.2f)",
        host,
        port,
        cloud.description,
        runner.config.default_threshold,
    )
    learning.start_background()
    try:
        await http.serve()
        if not http.started and not failures:
            failures.append(f"the HTTP server could not start on {host}:{port} (see the log above)")
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await learning.close()
        if budgets is not None:
            await asyncio.to_thread(budgets.ledger.close)
        await cloud.close()
    return failures[0] if failures else None
