"""`tandem serve`: the cascade behind the OpenAI-compatible HTTP API.

Models: `auto` (the router; `auto:<threshold>` overrides the configured threshold),
`local`, `cloud`, and the local model's own name (the local engine without routing).
Everything comes from sdk.settings (defaults < TOML file < TANDEM_* env < flags).
The local model and an embedded cloud engine load on their own threads; /health says 503
until both are in. SIGTERM/SIGINT: HTTP drains, then the cloud tier and the engines stop.
"""

from __future__ import annotations

import asyncio
import logging

logger = logging.getLogger("tandem.serve")


def run_serve(settings, api_keys: frozenset[str]) -> str | None:
    """Serve until a signal (api_keys: sdk.api_keys.load_api_keys's, loaded while checking the
    settings); returns why serving failed, or None after a clean stop."""
    from local_runtime.async_engine import AsyncLocalEngine

    engine = AsyncLocalEngine(settings.local_engine_config()).start()
    try:
        return asyncio.run(_serve(settings, engine, api_keys))
    finally:
        engine.shutdown()


async def _serve(settings, engine, api_keys: frozenset[str]) -> str | None:
    import uvicorn

    from sdk.cascade import CascadeRunner
    from sdk.cloud_tier import start_cloud_tier
    from sdk.openai_server import create_app
    from sdk.serve_loop import HttpServer, stop_on_signals, watch_loading

    host, port, log_level = settings.get("server.host"), settings.get("server.port"), settings.get("server.log_level")
    try:
        cloud = await start_cloud_tier(settings)
    except OSError as exc:
        return f"the cloud tier could not start: {exc}"
    try:  # the probe and the prompt router load here: a wrong file is a clean exit, not a traceback
        runner = CascadeRunner(engine, cloud.client, settings.cascade_config())
    except (OSError, ValueError) as exc:
        await cloud.close()
        return f"the cascade could not start: {exc}"
    app = create_app(
        engine, served_model_names=[settings.get("local.model_name")] if settings.get("local.model_name") else None,
        api_keys=api_keys, rate_limit_per_minute=settings.get("server.rate_limit"),
        max_concurrent_per_key=settings.get("server.max_concurrent_per_key"), max_body_bytes=settings.get("server.max_body_bytes"),
        bind_host=host, cascade=runner, also_ready=lambda: cloud.is_ready, cloud_engine=cloud.engine,
    )  # fmt: skip
    http = HttpServer(uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5))
    stop_on_signals(http)
    failures: list[str] = []
    watchers = [asyncio.create_task(watch_loading("local", engine, http, failures, logger))]
    if cloud.engine is not None:
        watchers.append(asyncio.create_task(watch_loading("cloud", cloud.engine, http, failures, logger)))
    logger.info("serving the cascade on http://%s:%d (cloud tier: %s, threshold %.2f)",
                host, port, cloud.description, runner.config.default_threshold)
    try:
        await http.serve()
        if not http.started and not failures:
            failures.append(f"the HTTP server could not start on {host}:{port} (see the log above)")
    finally:
        for watcher in watchers:
            watcher.cancel()
        await cloud.close()
    return failures[0] if failures else None
