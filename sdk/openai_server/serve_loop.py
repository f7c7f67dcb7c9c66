"""What `tandem serve` and `tandem cloud serve` share: uvicorn in our own event loop, with
the stop order ours (HTTP drains first, then the rest of the process)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import uvicorn


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


async def watch_loading(name: str, engine, http: HttpServer, failures: list[str], logger: logging.Logger) -> None:
    """Log when `engine` has loaded; if loading fails, note why and stop serving."""
    try:
        await asyncio.to_thread(engine.wait_ready)
        logger.info("%s model %s loaded; max_model_len %d", name, engine.model_name, engine.max_model_len)
    except BaseException:  # the engine thread logged why
        failures.append(f"the {name} model failed to load (see the log above)")
        http.should_exit = True
