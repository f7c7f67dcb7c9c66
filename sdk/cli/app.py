"""The `tandem` command line: one typer app; heavy imports stay inside the commands."""

from __future__ import annotations

from typing import Optional

import typer

from sdk.cli_options import LogLevel
from sdk.cloud_cli import cloud_app
from sdk.config_cli import config_app
from sdk.eval_cli import register_eval_commands
from sdk.router_cli import router_app

app = typer.Typer(help="tandem: a hybrid on-device-to-cloud LLM runtime.", no_args_is_help=True)
app.add_typer(cloud_app, name="cloud")
app.add_typer(config_app, name="config")
register_eval_commands(app)
app.add_typer(router_app, name="router")


@app.command()
def serve(
    config: Optional[str] = typer.Option(None, "--config", help="TOML config file (default: $TANDEM_CONFIG, else ~/.config/tandem/config.toml if present)."),
    model: Optional[str] = typer.Option(None, "--model", help="Local GGUF file; default: the embedded SmolLM2-135M-Instruct. [env: TANDEM_MODEL]"),
    model_name: Optional[str] = typer.Option(None, help="The id of the local model without routing; default: derived from the file. [env: TANDEM_MODEL_NAME]"),
    cloud: Optional[str] = typer.Option(None, "--cloud", help="embedded (default), none, grpc://HOST:PORT, grpcs://HOST:PORT or an OpenAI-compatible https://HOST/v1. [env: TANDEM_CLOUD]"),
    threshold: Optional[float] = typer.Option(None, min=0.0, max=1.0, help="Routing threshold of model `auto`: 0 never escalates, 1 always does. [env: TANDEM_THRESHOLD]"),
    host: Optional[str] = typer.Option(None, help="Address to listen on; default 127.0.0.1. [env: TANDEM_HOST]"),
    port: Optional[int] = typer.Option(None, min=0, max=65535, help="TCP port; default 8000. [env: TANDEM_PORT]"),
    api_key_file: Optional[str] = typer.Option(None, help="File of API keys for this endpoint, one per line. [env: TANDEM_API_KEY_FILE]"),
    rate_limit: Optional[float] = typer.Option(None, min=0.0, help="Requests per minute per key. [env: TANDEM_RATE_LIMIT]"),
    max_concurrent_per_key: Optional[int] = typer.Option(None, min=1, help="Requests in flight at once per key (per client address without keys); default: no limit. [env: TANDEM_MAX_CONCURRENT_PER_KEY]"),
    max_body_bytes: Optional[int] = typer.Option(None, min=1024, help="Largest request body, bytes; larger is 413 (4 MiB). [env: TANDEM_MAX_BODY_BYTES]"),
    kv_cache_tokens: Optional[int] = typer.Option(None, min=1, help="Local KV cells shared by all sequences (8192). [env: TANDEM_KV_CACHE_TOKENS]"),
    max_num_seqs: Optional[int] = typer.Option(None, min=1, help="Local sequences decoded together (16). [env: TANDEM_MAX_NUM_SEQS]"),
    max_num_batched_tokens: Optional[int] = typer.Option(None, min=1, help="Local token budget of one step (512). [env: TANDEM_MAX_NUM_BATCHED_TOKENS]"),
    max_model_len: Optional[int] = typer.Option(None, min=1, help="Local prompt + completion limit. [env: TANDEM_MAX_MODEL_LEN]"),
    max_waiting: Optional[int] = typer.Option(None, min=0, help="Queued local requests beyond this get 503 (256). [env: TANDEM_MAX_WAITING]"),
    threads: Optional[int] = typer.Option(None, min=1, help="CPU threads for llama.cpp; default: all cores. [env: TANDEM_THREADS]"),
    n_gpu_layers: Optional[int] = typer.Option(None, min=0, help="Layers offloaded to a GPU when llama.cpp has one. [env: TANDEM_N_GPU_LAYERS]"),
    log_level: Optional[LogLevel] = typer.Option(None, case_sensitive=False, help="Log level (info). [env: TANDEM_LOG_LEVEL]"),
) -> None:
    """Serve the cascade over the OpenAI-compatible HTTP API: models auto, local, cloud."""
    import logging

    from local_runtime.model_files import ModelNotFoundError, resolve_model_path
    from sdk.api_keys import ApiKeyConfigError, load_api_keys
    from sdk.serve_cli import run_serve
    from sdk.settings import SettingsError, load_settings

    flags = {
        "server.host": host, "server.port": port, "server.api_key_file": api_key_file, "server.rate_limit": rate_limit,
        "server.max_concurrent_per_key": max_concurrent_per_key, "server.max_body_bytes": max_body_bytes,
        "server.log_level": log_level.value if log_level else None,
        "local.model": model, "local.model_name": model_name, "local.kv_cache_tokens": kv_cache_tokens,
        "local.max_num_seqs": max_num_seqs, "local.max_num_batched_tokens": max_num_batched_tokens,
        "local.max_model_len": max_model_len, "local.max_waiting": max_waiting, "local.threads": threads,
        "local.n_gpu_layers": n_gpu_layers, "cloud.url": cloud, "cascade.threshold": threshold,
    }  # fmt: skip
    try:  # every configuration error is reported before anything loads or binds
        settings = load_settings(config, cli=flags)
        resolve_model_path(settings.get("local.model"))  # load_settings checked the values, not the file
        api_keys = load_api_keys(settings.get("server.api_key_file"))
    except (SettingsError, ModelNotFoundError, ApiKeyConfigError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    level = settings.get("server.log_level")
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    failed = run_serve(settings, api_keys)
    if failed:
        typer.echo(f"tandem serve: {failed}", err=True)
        raise typer.Exit(code=1)


@app.command()
def version() -> None:
    """Print the installed tandem version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        typer.echo(package_version("tandem-llm"))
    except PackageNotFoundError:
        typer.echo("tandem-llm (not installed; running from a source tree)")


if __name__ == "__main__":
    app()
