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

from sdk.cli.options import SAMPLING_KEYS, LogLevel, sampling_flags

logger = logging.getLogger("tandem.serve")


def serve(
    config: Optional[str] = typer.Option(None, "--config", help="TOML config file (default: $TANDEM_CONFIG, else ~/.config/tandem/config.toml if present)."),
    model: Optional[str] = typer.Option(None, "--model", help="Local GGUF file; default: the embedded SmolLM2-135M-Instruct. [env: TANDEM_MODEL]"),
    model_name: Optional[str] = typer.Option(None, help="The id of the local model without routing; default: derived from the file. [env: TANDEM_MODEL_NAME]"),
    cloud: Optional[str] = typer.Option(None, "--cloud", help="embedded (default), none, grpc://HOST:PORT, grpcs://HOST:PORT, replicas (ipv4:H1:P1,H2:P2 or dns:///HOST:PORT: round robin over the healthy ones) or an OpenAI-compatible https://HOST/v1. [env: TANDEM_CLOUD]"),
    threshold: Optional[float] = typer.Option(None, min=0.0, max=1.0, help="Routing threshold of model `auto`: 0 never escalates, 1 always does. [env: TANDEM_THRESHOLD]"),
    host: Optional[str] = typer.Option(None, help="Address to listen on; default 127.0.0.1. [env: TANDEM_HOST]"),
    port: Optional[int] = typer.Option(None, min=0, max=65535, help="TCP port; default 8000. [env: TANDEM_PORT]"),
    api_key_file: Optional[str] = typer.Option(None, help="File of API keys for this endpoint, one per line. [env: TANDEM_API_KEY_FILE]"),
    rate_limit: Optional[float] = typer.Option(None, min=0.0, help="Requests per minute per key. [env: TANDEM_RATE_LIMIT]"),
    max_concurrent_per_key: Optional[int] = typer.Option(None, min=1, help="Requests in flight at once per key (per client address without keys); default: no limit. [env: TANDEM_MAX_CONCURRENT_PER_KEY]"),
    auth_backoff_after: Optional[int] = typer.Option(None, min=0, help="Failed API keys from one client address before it backs off (429 unchecked, 1 s doubling to [server] auth_backoff_max_s); 0: off; default 10. [env: TANDEM_AUTH_BACKOFF_AFTER]"),
    strict_fields: Optional[bool] = typer.Option(None, "--strict-fields/--no-strict-fields", help="Refuse request fields tandem does not know (400) instead of ignoring them with a warning. [env: TANDEM_STRICT_FIELDS]"),
    max_body_bytes: Optional[int] = typer.Option(None, min=1024, help="Largest request body, bytes; larger is 413 (4 MiB). [env: TANDEM_MAX_BODY_BYTES]"),
    tls_cert: Optional[str] = typer.Option(None, "--tls-cert", help="PEM certificate chain: serve HTTPS (with --tls-key). [env: TANDEM_TLS_CERT]"),
    tls_key: Optional[str] = typer.Option(None, "--tls-key", help="PEM private key for --tls-cert. [env: TANDEM_TLS_KEY]"),
    kv_cache_tokens: Optional[int] = typer.Option(None, min=1, help="Local KV cells shared by all sequences (8192). [env: TANDEM_KV_CACHE_TOKENS]"),
    max_num_seqs: Optional[int] = typer.Option(None, min=1, help="Local sequences decoded together (16). [env: TANDEM_MAX_NUM_SEQS]"),
    max_num_batched_tokens: Optional[int] = typer.Option(None, min=1, help="Local token budget of one step (512). [env: TANDEM_MAX_NUM_BATCHED_TOKENS]"),
    max_model_len: Optional[int] = typer.Option(None, min=1, help="Local prompt + completion limit. [env: TANDEM_MAX_MODEL_LEN]"),
    max_waiting: Optional[int] = typer.Option(None, min=0, help="Queued local requests beyond this get 503 (256). [env: TANDEM_MAX_WAITING]"),
    threads: Optional[int] = typer.Option(None, min=1, help="CPU threads for llama.cpp; default: all cores. [env: TANDEM_THREADS]"),
    n_gpu_layers: Optional[int] = typer.Option(None, min=0, help="Layers offloaded to a GPU when llama.cpp has one. [env: TANDEM_N_GPU_LAYERS]"),
    batch_invariant: Optional[bool] = typer.Option(None, "--batch-invariant/--no-batch-invariant", help="A sequence's numbers do not depend on what shares its batch (slower prompts); default off. [env: TANDEM_LOCAL_BATCH_INVARIANT]"),
    extra_buffer_types: Optional[bool] = typer.Option(None, "--extra-buffer-types/--no-extra-buffer-types", help="llama.cpp's repacked CPU weight layouts for tensor types that have one (Q4_0, Q4_K, IQ4_NL, ...; llama-server's default); refused with --batch-invariant; default off. [env: TANDEM_LOCAL_EXTRA_BUFFER_TYPES]"),
    repetition_stop: Optional[bool] = typer.Option(None, "--repetition-stop/--no-repetition-stop", help="Stop a local answer caught in an exact loop (finish_reason length, stop_reason repetition) unless the request sends repetition_stop false; default on. [env: TANDEM_LOCAL_REPETITION_STOP]"),
    close_within_max_tokens: Optional[bool] = typer.Option(None, "--close-within-max-tokens/--no-close-within-max-tokens", help="A structured answer about to reach max_tokens takes its grammar's closing path and ends valid (stop_reason closed_within_max_tokens), on both tiers, unless the request sends close_within_max_tokens false; default on. [env: TANDEM_LOCAL_CLOSE_WITHIN_MAX_TOKENS, TANDEM_CLOUD_CLOSE_WITHIN_MAX_TOKENS]"),
    local_sampling: Optional[list[str]] = typer.Option(None, "--local-sampling", metavar="KEY=VALUE", help=f"Local tier's default for a sampling field requests leave out (repeatable): {SAMPLING_KEYS}; default: the model's (SmolLM2-Instruct: temperature=0.2, top_p=0.9). [env: TANDEM_LOCAL_SAMPLING_<KEY>]"),
    cloud_sampling: Optional[list[str]] = typer.Option(None, "--cloud-sampling", metavar="KEY=VALUE", help="The embedded cloud engine's, likewise. [env: TANDEM_CLOUD_SAMPLING_<KEY>]"),
    log_level: Optional[LogLevel] = typer.Option(None, case_sensitive=False, help="Log level (info). [env: TANDEM_LOG_LEVEL]"),
) -> None:
    """Serve the cascade over the OpenAI-compatible HTTP API: models auto, local, cloud."""
    from sdk.openai_server.serve_loop import check_tls_files
    from sdk.protocol.api_keys import ApiKeyConfigError, load_api_keys
    from sdk.protocol.model_files import ModelNotFoundError, resolve_model_path
    from sdk.settings import SettingsError, load_settings

    flags = {
        "server.host": host, "server.port": port, "server.api_key_file": api_key_file, "server.rate_limit": rate_limit,
        "server.max_concurrent_per_key": max_concurrent_per_key, "server.max_body_bytes": max_body_bytes,
        "server.auth_backoff_after": auth_backoff_after,
        "server.strict_fields": strict_fields, "server.tls_cert": tls_cert, "server.tls_key": tls_key,
        "server.log_level": log_level.value if log_level else None,
        "local.model": model, "local.model_name": model_name, "local.kv_cache_tokens": kv_cache_tokens,
        "local.max_num_seqs": max_num_seqs, "local.max_num_batched_tokens": max_num_batched_tokens,
        "local.max_model_len": max_model_len, "local.max_waiting": max_waiting, "local.threads": threads,
        "local.n_gpu_layers": n_gpu_layers, "local.batch_invariant": batch_invariant, "local.extra_buffer_types": extra_buffer_types, "local.repetition_stop": repetition_stop,
        "local.close_within_max_tokens": close_within_max_tokens, "cloud.close_within_max_tokens": close_within_max_tokens, "cloud.url": cloud, "cascade.threshold": threshold,
    }  # fmt: skip
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
            budgets = runner.budgets = open_budgets(settings.get("server.budgets_file"), settings.get("server.spend_path"),
                                                    cloud_prices_are_zero(settings))  # fmt: skip
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
        engine, served_model_names=[settings.get("local.model_name")] if settings.get("local.model_name") else None,
        api_keys=api_keys, rate_limit_per_minute=settings.get("server.rate_limit"),
        max_concurrent_per_key=settings.get("server.max_concurrent_per_key"), max_body_bytes=settings.get("server.max_body_bytes"),
        auth_backoff_after=settings.get("server.auth_backoff_after"), auth_backoff_max_s=settings.get("server.auth_backoff_max_s"),
        bind_host=host, cascade=runner, also_ready=lambda: cloud.is_ready, strict_fields=settings.get("server.strict_fields"),
        traffic=learning.record, feedback_per_minute=traffic_settings.feedback_per_minute,
        embeddings=EmbeddingService(threads=1),  # loads on first use: MiniLM beside llama.cpp gets one core
        budgets=budgets,
    )  # fmt: skip
    learning.attach_metrics(app)
    http = HttpServer(http_config(app, host, port, log_level, api_keys, settings.get("server.tls_cert"), settings.get("server.tls_key")))
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
    watcher = asyncio.create_task(bring_up_embedded() if embedded else watch_loading("local", engine, http, failures, logger, started))
    logger.info("serving the cascade on http://%s:%d (cloud tier: %s, threshold %.2f)",
                host, port, cloud.description, runner.config.default_threshold)
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
