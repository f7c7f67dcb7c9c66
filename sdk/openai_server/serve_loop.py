"""What `tandem serve` and `tandem cloud serve` share: uvicorn in our own event loop, with
the stop order ours (HTTP drains first, then the rest of the process)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time

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


async def watch_loading(name: str, engine, http: HttpServer, failures: list[str], logger: logging.Logger,
                        started: float | None = None) -> None:  # fmt: skip
    """Log when `engine` has loaded, and how long it took since `started` (time.monotonic());
    if loading fails, note why and stop serving."""
    started = time.monotonic() if started is None else started
    try:
        await asyncio.to_thread(engine.wait_ready)
        logger.info("%s model %s loaded in %.1f s; max_model_len %d", name, engine.model_name,
                    time.monotonic() - started, engine.max_model_len)  # fmt: skip
    except BaseException:  # the engine thread logged why
        failures.append(f"the {name} model failed to load (see the log above)")
        http.should_exit = True
