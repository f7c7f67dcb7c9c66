"""What `tandem serve` and `tandem cloud serve` share: uvicorn in our own event loop, with
the stop order ours (HTTP drains first, then the rest of the process)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time

import uvicorn


logger = logging.getLogger("tandem.serve")


def check_tls_files(tls_cert: str | None, tls_key: str | None) -> None:
    """ValueError unless both PEM paths are given and readable, or neither (plaintext)."""
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("TLS needs both --tls-cert and --tls-key (or neither, for plaintext)")
    for what, path in (("certificate", tls_cert), ("private key", tls_key)):
        if path is not None and not os.access(path, os.R_OK):
            raise ValueError(f"cannot read the TLS {what} {path!r}")


def http_config(
    app, host: str, port: int, log_level: str, api_keys, tls_cert: str | None = None, tls_key: str | None = None
) -> uvicorn.Config:
    """uvicorn's config for an HTTP listener: TLS when both PEM files are given (ValueError for one
    alone or an unreadable one), and a warning when API keys would travel in plaintext beyond
    loopback (a key sent over plain HTTP can be read by anyone on the path)."""
    from sdk.serving.api_keys import is_loopback

    check_tls_files(tls_cert, tls_key)
    if api_keys and tls_cert is None and not is_loopback(host):
        logger.warning(
            "API keys are checked on %s but travel in plaintext HTTP: configure --tls-cert and --tls-key "
            "(or terminate TLS in front of this server)",
            host,
        )
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=5,
        ssl_certfile=tls_cert,
        ssl_keyfile=tls_key,
    )


class HttpServer(uvicorn.Server):
    """uvicorn.Server that leaves SIGINT/SIGTERM to `stop_on_signals`.

    uvicorn's own handlers re-raise SIGTERM once HTTP has drained, which would kill the
    process before gRPC servers and engines get their turn to stop."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def stop_on_signals(http: HttpServer) -> None:
    """SIGINT/SIGTERM make `http.serve()` return after the HTTP drain (call inside the loop)."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, lambda: setattr(http, "should_exit", True))


def drain_on_signals(http: HttpServer, engine, grace_s: float) -> None:
    """SIGINT/SIGTERM drain `engine` (a sdk.openai_server.drain.DrainableEngine), give the requests in
    flight up to `grace_s`, then make `http.serve()` return; a second signal stops at once."""
    from sdk.openai_server.drain import drain_then_stop

    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task] = []

    def on_signal() -> None:
        if tasks:  # asked twice: stop now
            http.should_exit = True
            return
        tasks.append(
            loop.create_task(drain_then_stop(engine, lambda: setattr(http, "should_exit", True), grace_s, logger))
        )

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal)


async def watch_loading(
    name: str, engine, http: HttpServer, failures: list[str], logger: logging.Logger, started: float | None = None
) -> None:
    """Log when `engine` has loaded, and how long it took since `started` (time.monotonic());
    if loading fails, note why and stop serving."""
    started = time.monotonic() if started is None else started
    try:
        await asyncio.to_thread(engine.wait_ready)
        logger.info(
            "%s model %s loaded in %.1f s; max_model_len %d",
            name,
            engine.model_name,
            time.monotonic() - started,
            engine.max_model_len,
        )
    except BaseException:  # the engine thread logged why
        failures.append(f"the {name} model failed to load (see the log above)")
        http.should_exit = True
