"""Delivering one stream's events to the app's callback object, in order, off the runtime's loop.

Each stream gets its own delivery thread: a callback that is slow (or blocks, say on a
Kotlin channel) holds up only its own stream's deliveries, never generation or the other
streams. The object is duck-typed: anything with on_token / on_done / on_error methods
taking one string (a Python object, or a Java/Kotlin object passed in through Chaquopy).

The contract the app relies on: on_token zero or more times, then exactly one of on_done
or on_error, and nothing after it. A callback that raises is the app's bug: the generation
is cancelled and on_error says `callback_error` (if on_error itself raises, that is logged).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from android_bridge.errors import BridgeError, dumps, logger

CALLBACK_METHODS = ("on_token", "on_done", "on_error")
_TOKEN, _DONE, _ERROR = CALLBACK_METHODS


def check_callback(callback) -> None:
    missing = [name for name in CALLBACK_METHODS if not callable(getattr(callback, name, None))]
    if missing:
        raise BridgeError(
            "invalid_callback",
            f"the callback object needs methods {', '.join(CALLBACK_METHODS)}; missing: {', '.join(missing)}",
            param="callback",
        )


class CallbackDispatcher:
    """Queues a stream's events from the runtime's loop and calls the callback on its own thread."""

    def __init__(self, request_id: str, callback, cancel_generation: Callable[[], None]):
        self.request_id = request_id
        self._callback = callback
        self._cancel_generation = cancel_generation  # called (from this thread) when a callback raises
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._failure: BaseException | None = None
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._deliver, name=f"tandem-callback-{request_id[-8:]}", daemon=True)

    def start(self) -> None:
        """Start delivering (events queued before this are kept)."""
        self._thread.start()

    # -- the producer side (any thread; never blocks) --------------------------------------

    def token(self, payload: dict) -> None:
        self._queue.put((_TOKEN, payload))

    def done(self, payload: dict) -> None:
        self._queue.put((_DONE, payload))

    def error(self, error: BridgeError) -> None:
        self._queue.put((_ERROR, error.as_dict(id=self.request_id)))

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the terminal callback returned; False on timeout (a callback still running)."""
        return self._finished.wait(timeout)

    # -- the delivery thread ---------------------------------------------------------------

    def _deliver(self) -> None:
        try:
            while True:
                kind, payload = self._queue.get()
                if kind == _TOKEN:
                    if self._failure is None:
                        self._call(_TOKEN, payload)
                    continue
                if self._failure is not None:  # whatever ended the generation, the app broke it first
                    kind, payload = _ERROR, self._callback_error()
                self._call(kind, payload, terminal=True)
                return
        finally:
            self._finished.set()

    def _call(self, name: str, payload: dict, terminal: bool = False) -> None:
        try:
            getattr(self._callback, name)(dumps(payload))
        except BaseException as exc:  # a Java exception arrives as a Python exception through Chaquopy
            logger.error("android_bridge: callback %s of request %s raised", name, self.request_id, exc_info=exc)
            if terminal:
                return
            self._failure = exc
            self._cancel_generation()

    def _callback_error(self) -> dict:
        message = (
            f"the app's callback raised {type(self._failure).__name__}: {self._failure}; the generation was cancelled"
        )
        return BridgeError("callback_error", message, 500, "callback_error").as_dict(id=self.request_id)
