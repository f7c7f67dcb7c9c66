"""The `tandem` command line: one typer app; heavy imports stay inside the commands."""

from __future__ import annotations

from typing import Optional

import typer

from sdk.cli_options import LogLevel
from sdk.cloud_cli import cloud_app

app = typer.Typer(help="tandem: a hybrid on-device-to-cloud LLM runtime.", no_args_is_help=True)
app.add_typer(cloud_app, name="cloud")


def _env(name: str) -> str:
    return f"TANDEM_{name}"


@app.command()
def serve(
    model: Optional[str] = typer.Option(
        None, "--model", envvar=_env("MODEL"), help="GGUF file to serve; default: the embedded SmolLM2-135M-Instruct."
    ),
    model_name: Optional[str] = typer.Option(
        None, envvar=_env("MODEL_NAME"), help="The id clients send as `model`; default: derived from the file."
    ),
    host: str = typer.Option("127.0.0.1", envvar=_env("HOST"), help="Address to listen on (0.0.0.0 for all)."),
    port: int = typer.Option(8000, envvar=_env("PORT"), min=0, max=65535, help="TCP port to listen on."),
    kv_cache_tokens: Optional[int] = typer.Option(
        None, envvar=_env("KV_CACHE_TOKENS"), min=1, help="KV cells shared by all sequences; default: the engine's (8192)."
    ),
    max_num_seqs: Optional[int] = typer.Option(
        None, envvar=_env("MAX_NUM_SEQS"), min=1, help="Sequences decoded together; default: the engine's (16)."
    ),
    max_num_batched_tokens: Optional[int] = typer.Option(
        None, envvar=_env("MAX_NUM_BATCHED_TOKENS"), min=1, help="Token budget of one step; default: the engine's (512)."
    ),
    max_model_len: Optional[int] = typer.Option(
        None, envvar=_env("MAX_MODEL_LEN"), min=1, help="Prompt + completion limit per request; default: min(model, pool, 4096)."
    ),
    max_waiting: Optional[int] = typer.Option(
        None, envvar=_env("MAX_WAITING"), min=0, help="Queued requests beyond this get 503; default: the engine's (256)."
    ),
    threads: Optional[int] = typer.Option(None, envvar=_env("THREADS"), min=1, help="CPU threads for llama.cpp; default: all cores."),
    n_gpu_layers: Optional[int] = typer.Option(
        None, envvar=_env("N_GPU_LAYERS"), min=0, help="Layers offloaded to a GPU when llama.cpp has a GPU backend."
    ),
    log_level: LogLevel = typer.Option(LogLevel.info, envvar=_env("LOG_LEVEL"), case_sensitive=False, help="Server log level."),
) -> None:
    """Serve a local GGUF model over the OpenAI-compatible HTTP API."""
    import logging
    import threading

    import uvicorn

    from local_runtime.async_engine import AsyncLocalEngine
    from local_runtime.config import LocalEngineConfig
    from local_runtime.model_files import ModelNotFoundError, resolve_model_path
    from sdk.openai_server import create_app

    logging.basicConfig(level=log_level.value.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logger = logging.getLogger("tandem.serve")
    # Unset options keep the engine's own defaults, so they are written down in one place.
    overrides = {
        "model_name": model_name,
        "kv_cache_tokens": kv_cache_tokens,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "max_model_len": max_model_len,
        "max_waiting": max_waiting,
        "n_threads": threads,
        "n_gpu_layers": n_gpu_layers,
    }
    try:
        resolve_model_path(model)  # fail before binding the port, with the file's name
        config = LocalEngineConfig(model_path=model, **{k: v for k, v in overrides.items() if v is not None})
    except (ValueError, ModelNotFoundError) as exc:
        raise typer.BadParameter(str(exc)) from exc

    # Loading runs on the engine thread, so /health answers 503 until the model is in.
    engine = AsyncLocalEngine(config).start()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(engine, served_model_names=[model_name] if model_name else None),
            host=host,
            port=port,
            log_level=log_level.value,
            timeout_graceful_shutdown=5,
        )
    )
    load_failed = threading.Event()

    def watch_loading() -> None:
        try:
            engine.wait_ready()
            logger.info("model %s loaded; max_model_len %d", engine.model_name, engine.max_model_len)
        except BaseException:  # the engine thread already logged why
            load_failed.set()
            server.should_exit = True

    threading.Thread(target=watch_loading, name="tandem-load-watch", daemon=True).start()
    try:
        server.run()
    finally:
        engine.shutdown()
    if load_failed.is_set():
        typer.echo("tandem serve: the model failed to load (see the log above)", err=True)
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
