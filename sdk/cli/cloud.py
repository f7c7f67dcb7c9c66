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

from sdk.cli.options import SAMPLING_KEYS, LogLevel, sampling_flags

# The value, not an import of sdk.openai_server (which pulls FastAPI) at CLI start; a test checks they agree.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024

cloud_app = typer.Typer(help="The cloud tier: serve the PyTorch engine over gRPC and HTTP.", no_args_is_help=True)


def _env(name: str) -> str:
    return f"TANDEM_CLOUD_{name}"


@cloud_app.command("serve")
def serve(
    model: Optional[str] = typer.Option(None, "--model", envvar=_env("MODEL"), help="HF directory or GGUF file; default: the embedded SmolLM2-135M-Instruct."),
    model_name: Optional[str] = typer.Option(None, envvar=_env("MODEL_NAME"), help="The id clients send as `model`."),
    host: str = typer.Option("127.0.0.1", envvar=_env("HOST"), help="Address both servers bind (0.0.0.0 for all; use keys and TLS then)."),
    port: int = typer.Option(8000, envvar=_env("PORT"), min=0, max=65535, help="OpenAI HTTP API port."),
    grpc_port: int = typer.Option(50051, envvar=_env("GRPC_PORT"), min=0, max=65535, help="gRPC port."),
    device: str = typer.Option("auto", envvar=_env("DEVICE"), help="auto, cpu, cuda or cuda:N."),
    threads: Optional[int] = typer.Option(None, envvar=_env("THREADS"), min=1, help="CPU threads of torch's kernels (default: torch's, one per core); several replicas on one host need their share each."),
    dtype: str = typer.Option("auto", envvar=_env("DTYPE"), help="auto, float32, bfloat16, float16."),
    kv_cache_gb: Optional[float] = typer.Option(None, envvar=_env("KV_CACHE_GB"), min=0.0, help="KV cache budget; default: a fraction of free memory."),
    max_num_seqs: Optional[int] = typer.Option(None, envvar=_env("MAX_NUM_SEQS"), min=1, help="Requests in one step; default 32."),
    max_num_batched_tokens: Optional[int] = typer.Option(None, envvar=_env("MAX_NUM_BATCHED_TOKENS"), min=1, help="Token budget of one step; default 512."),
    max_model_len: Optional[int] = typer.Option(None, envvar=_env("MAX_MODEL_LEN"), min=1, help="Prompt + completion limit."),
    max_waiting: Optional[int] = typer.Option(None, envvar=_env("MAX_WAITING"), min=0, help="Queued requests beyond this are refused (HTTP 503, gRPC RESOURCE_EXHAUSTED)."),
    speculative: str = typer.Option("off", envvar=_env("SPECULATIVE"), help="Speculative decoding: off, ngram (prompt lookup), draft:PATH (a smaller model with the same tokenizer) or draft:PATH@N (its first N layers)."),
    num_speculative_tokens: Optional[int] = typer.Option(None, envvar=_env("NUM_SPECULATIVE_TOKENS"), min=1, max=16, help="Draft tokens per request per step (k); default 8. The adaptive policy lowers it at large batch or low acceptance."),
    close_within_max_tokens: bool = typer.Option(True, "--close-within-max-tokens/--no-close-within-max-tokens", envvar=_env("CLOSE_WITHIN_MAX_TOKENS"), help="A structured answer about to reach max_tokens takes its grammar's closing path and ends valid (stop_reason closed_within_max_tokens) unless the request sends close_within_max_tokens false; off: cut at max_tokens, as OpenAI's API."),
    sampling: Optional[list[str]] = typer.Option(None, "--sampling", metavar="KEY=VALUE", help=f"Default for a sampling field requests leave out (repeatable): {SAMPLING_KEYS}; default: the model's (its metadata, a built-in table, else OpenAI's). [env: TANDEM_CLOUD_SAMPLING_<KEY>]"),
    api_key_file: Optional[str] = typer.Option(None, envvar=_env("API_KEY_FILE"), help="File of API keys, one per line (TANDEM_API_KEYS adds comma-separated keys)."),
    rate_limit: Optional[float] = typer.Option(None, envvar=_env("RATE_LIMIT"), min=0.0, help="Requests per minute per key (per client address without keys), HTTP and gRPC together."),
    max_concurrent_per_key: Optional[int] = typer.Option(None, envvar=_env("MAX_CONCURRENT_PER_KEY"), min=1, help="Requests in flight at once per key (per client address without keys), HTTP and gRPC together; default: no limit."),
    auth_backoff_after: int = typer.Option(10, envvar=_env("AUTH_BACKOFF_AFTER"), min=0, help="Failed keys (API keys and the admin key) from one client address before it backs off (HTTP 429 / gRPC RESOURCE_EXHAUSTED, its key unchecked, 1 s doubling); 0: off."),
    auth_backoff_max_s: float = typer.Option(300.0, envvar=_env("AUTH_BACKOFF_MAX_S"), min=1.0, help="Longest backoff wait, seconds."),
    strict_fields: bool = typer.Option(False, "--strict-fields/--no-strict-fields", envvar=_env("STRICT_FIELDS"), help="Refuse HTTP request fields tandem does not know (400) instead of ignoring them with a warning."),
    max_body_bytes: int = typer.Option(DEFAULT_MAX_BODY_BYTES, envvar=_env("MAX_BODY_BYTES"), min=1024, help="Largest HTTP request body, bytes; larger is 413 (gRPC has its own 4 MiB message limit)."),
    price_input_per_million: float = typer.Option(0.0, envvar=_env("PRICE_INPUT_PER_MILLION"), min=0.0, help="USD per million prompt tokens this server charges (budgets bill at it)."),
    price_output_per_million: float = typer.Option(0.0, envvar=_env("PRICE_OUTPUT_PER_MILLION"), min=0.0, help="USD per million completion tokens."),
    budgets_file: Optional[str] = typer.Option(None, envvar=_env("BUDGETS_FILE"), help="TOML of USD budgets per API key and per `user` (reloaded when it changes; see README, Budgets): over a hard one, 429 insufficient_quota. Needs the prices."),
    spend_path: Optional[str] = typer.Option(None, envvar=_env("SPEND_PATH"), help="SQLite file of what each key spent (default: $TANDEM_DATA_DIR/spend.sqlite3)."),
    admin_key_file: Optional[str] = typer.Option(None, envvar=_env("ADMIN_KEY_FILE"), help="File holding the admin key of POST /admin/drain and /admin/resume (take this replica out of rotation and back); without it, no admin endpoints."),
    drain_grace_s: float = typer.Option(30.0, envvar=_env("DRAIN_GRACE_S"), min=0.0, help="On SIGTERM: seconds the requests in flight get to finish while health says NOT_SERVING and new ones are refused."),
    tls_cert: Optional[str] = typer.Option(None, envvar=_env("TLS_CERT"), help="PEM certificate chain: TLS on both the gRPC and the HTTP port."),
    tls_key: Optional[str] = typer.Option(None, envvar=_env("TLS_KEY"), help="PEM private key for --tls-cert."),
    log_level: LogLevel = typer.Option(LogLevel.info, envvar=_env("LOG_LEVEL"), case_sensitive=False, help="Log level."),
) -> None:
    """Serve the cloud engine: gRPC (default :50051) and the OpenAI HTTP API (default :8000)."""
    import asyncio
    import logging

    from cloud_engine.async_engine import AsyncCloudEngine
    from cloud_engine.config import CloudEngineConfig
    from cloud_engine.grpc.server import GrpcServerConfig
    from cloud_engine.spec_decode.config import parse_speculative
    from router.costs import TierPrices
    from sdk.budgets.config import BudgetConfigError
    from sdk.budgets.manager import check_budgets
    from sdk.openai_server.serve_loop import check_tls_files
    from sdk.protocol.api_keys import ApiKeyConfigError, load_api_keys
    from sdk.protocol.client_limits import ClientLimits
    from sdk.settings.fields import SettingsError

    logging.basicConfig(level=log_level.value.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = {"kv_cache_gb": kv_cache_gb, "max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
                 "max_model_len": max_model_len, "max_waiting": max_waiting}
    try:  # every configuration error is reported before anything loads or binds
        api_keys = load_api_keys(api_key_file)
        engine_config = CloudEngineConfig(model=model, model_name=model_name, device=device, dtype=dtype,
                                          speculative=parse_speculative(speculative, num_speculative_tokens),
                                          sampling=_sampling_defaults(sampling), close_within_max_tokens=close_within_max_tokens,
                                          **{k: v for k, v in overrides.items() if v is not None})
        grpc_config = GrpcServerConfig(host=host, port=grpc_port, api_keys=api_keys, tls_cert_path=tls_cert, tls_key_path=tls_key)
        check_tls_files(tls_cert, tls_key)
        prices = TierPrices(price_input_per_million, price_output_per_million)
        admin_key = _read_admin_key(admin_key_file) if admin_key_file else None
        if budgets_file:
            check_budgets(budgets_file, prices_are_zero=prices == TierPrices(), cloud_only=True)
        # One budget per key for both listeners: a key cannot double its share by switching protocol.
        client_limits = ClientLimits.build(rate_limit or None, None, max_concurrent_per_key,
                                           auth_backoff_after=auth_backoff_after, auth_backoff_max_s=auth_backoff_max_s)
    except (ValueError, ApiKeyConfigError, SettingsError, BudgetConfigError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc

    if threads is not None:
        import torch

        torch.set_num_threads(threads)  # process-wide: the engine thread's kernels use it
    engine = AsyncCloudEngine(engine_config).start()
    try:
        limits = {"client_limits": client_limits, "max_body_bytes": max_body_bytes, "strict_fields": strict_fields}
        billing = (budgets_file, spend_path, prices) if budgets_file else None
        replica = {"admin_key": admin_key, "drain_grace_s": drain_grace_s}
        failed = asyncio.run(_serve_both(engine, grpc_config, host, port, api_keys, limits, model_name, log_level.value,
                                         billing, replica))  # fmt: skip
    finally:
        engine.shutdown()
    if failed:
        typer.echo(f"tandem cloud serve: {failed}", err=True)
        raise typer.Exit(code=1)


def _sampling_defaults(pairs: list[str] | None) -> dict:
    """--sampling KEY=VALUE pairs, plus TANDEM_CLOUD_SAMPLING_<KEY> variables (flags win), as {key: value}."""
    import os

    from sdk.settings.fields import FIELDS

    from_env = [f"{f.key}={os.environ[f.env]}" for f in FIELDS.values() if f.section == "cloud.sampling" and os.environ.get(f.env)]
    return {dotted.rpartition(".")[2]: value for dotted, value in sampling_flags("cloud", from_env + list(pairs or [])).items()}


def _read_admin_key(path: str) -> str:
    """The admin key: the file's first key (ApiKeyConfigError for an unreadable file, ValueError for a missing or short key)."""
    from sdk.protocol.api_keys import read_key_file

    keys = read_key_file(path, "the admin key file")
    if not keys or len(keys[0]) < 16:
        raise ValueError(f"the admin key file {path!r} must hold one key of at least 16 characters")
    return keys[0]


async def _serve_both(engine, grpc_config, host: str, port: int, api_keys, limits: dict, model_name, log_level: str,
                      billing: tuple | None = None, replica: dict | None = None) -> str | None:  # fmt: skip
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
        return await _serve_engine(engine, grpc_config, host, port, api_keys, limits, model_name, log_level, budgets, logger,
                                   replica or {})  # fmt: skip
    finally:
        if budgets is not None:
            await asyncio.to_thread(budgets.ledger.close)


async def _serve_engine(engine, grpc_config, host, port, api_keys, limits, model_name, log_level, budgets, logger,
                        replica: dict) -> str | None:  # fmt: skip
    """Both listeners over one DrainableEngine (a replica of a replicated tier: sdk.openai_server.drain)."""
    import asyncio

    from cloud_engine.grpc.server import start_grpc_server, stop_grpc_server
    from sdk.openai_server import create_app
    from sdk.openai_server.drain import DrainableEngine, admin_routes
    from sdk.openai_server.serve_loop import HttpServer, drain_on_signals, http_config, watch_loading

    engine = DrainableEngine(engine)
    app = create_app(engine, served_model_names=[model_name] if model_name else None, api_keys=api_keys,
                     bind_host=host, budgets=budgets, **limits)
    if replica.get("admin_key"):
        admin_routes(app, engine, replica["admin_key"])
    http = HttpServer(http_config(app, host, port, log_level, api_keys, grpc_config.tls_cert_path, grpc_config.tls_key_path))
    try:
        grpc_server = await start_grpc_server(engine, grpc_config, limits["client_limits"])
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
