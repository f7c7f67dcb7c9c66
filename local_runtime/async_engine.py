"""The asyncio face of the local engine: submit, stream token events, cancel.

The step loop runs on its own thread (llama_decode releases the GIL, so the
event loop keeps serving while a step computes). Requests and aborts reach the
loop through an inbox it drains between steps; events go back to each
request's asyncio queue with `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from typing import AsyncIterator, Sequence

from local_runtime.config import LocalEngineConfig
from local_runtime.engine import LocalEngine
from local_runtime.model_files import model_name_for
from sdk.engine_protocol import (
    EngineNotReadyError,
    EngineOverloadedError,
    EngineStats,
    GenerationRequest,
    TokenEvent,
)

logger = logging.getLogger(__name__)

_ABORTED = object()  # ends a stream whose request was cancelled by the engine side


class AsyncLocalEngine:
    """Implements sdk.engine_protocol.EngineProtocol over LocalEngine."""

    def __init__(self, config: LocalEngineConfig):
        self.config = config
        self.model_name = config.model_name or model_name_for(config.model_path)
        self.max_model_len = config.max_model_len or 0  # final value known once loaded
        self._engine: LocalEngine | None = None
        self._load_error: BaseException | None = None
        self._wakeup = threading.Condition()
        self._inbox: deque[tuple[str, object]] = deque()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tandem-local-engine", daemon=True)

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> "AsyncLocalEngine":
        """Load the model and start stepping, on the engine thread."""
        self._thread.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until loaded; re-raise the load error if loading failed."""
        with self._wakeup:
            self._wakeup.wait_for(lambda: self._engine is not None or self._load_error is not None, timeout)
        if self._load_error is not None:
            raise self._load_error
        if self._engine is None:
            raise TimeoutError("the local model did not load in time")

    def shutdown(self) -> None:
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    @property
    def is_ready(self) -> bool:
        return self._engine is not None and not self._stopping

    @property
    def engine(self) -> LocalEngine:
        if self._engine is None or self._stopping:
            raise EngineNotReadyError("the local model is still loading" if not self._stopping else "the engine is shutting down")
        return self._engine

    # -- EngineProtocol --------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.engine.tokenize(text, add_special)

    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]:
        return self.engine.apply_chat_template(messages)

    def stats(self) -> EngineStats:
        # Read without the engine lock: a snapshot that may be one step stale is fine for metrics.
        return self.engine.stats()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        """Validate now (raising before any event), then stream the request's tokens."""
        engine = self.engine
        engine.validate(request)
        if len(self._streams) >= self.config.max_waiting + self.config.max_num_seqs:
            raise EngineOverloadedError(
                f"the local engine has {len(self._streams)} requests in flight; retry shortly", retry_after_s=1.0
            )
        if request.request_id in self._streams:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request.request_id] = (asyncio.get_running_loop(), queue)
        self._post(("add", request))
        finished = False
        try:
            while True:
                event = await queue.get()
                if event is _ABORTED:
                    return
                if isinstance(event, BaseException):
                    raise event
                finished = event.finish_reason is not None
                yield event
                if finished:
                    return
        finally:
            self._streams.pop(request.request_id, None)
            if not finished:
                # The consumer went away (client disconnect, cancel): free its blocks now.
                self._post(("abort", request.request_id))

    async def abort(self, request_id: str) -> None:
        self._post(("abort", request_id))
        stream = self._streams.get(request_id)
        if stream is not None:
            stream[1].put_nowait(_ABORTED)

    # -- the engine thread -----------------------------------------------------------------

    def _post(self, item: tuple[str, object]) -> None:
        with self._wakeup:
            self._inbox.append(item)
            self._wakeup.notify_all()

    def _run(self) -> None:
        try:
            engine = LocalEngine(self.config)
        except BaseException as exc:  # surfaced to wait_ready and /health
            logger.exception("loading the local model failed")
            with self._wakeup:
                self._load_error = exc
                self._wakeup.notify_all()
            return
        self.model_name = engine.model_name
        self.max_model_len = engine.max_model_len
        with self._wakeup:
            self._engine = engine
            self._wakeup.notify_all()
        try:
            self._loop(engine)
        finally:
            self._fail_all(EngineNotReadyError("the local engine stopped"))
            engine.close()

    def _loop(self, engine: LocalEngine) -> None:
        while True:
            with self._wakeup:
                self._wakeup.wait_for(lambda: self._inbox or self._stopping or engine.has_unfinished_requests())
                if self._stopping:
                    return
                inbox, self._inbox = self._inbox, deque()
            for kind, payload in inbox:
                if kind == "add":
                    self._add(engine, payload)
                else:
                    engine.abort_request(payload)
            if not engine.has_unfinished_requests():
                continue
            try:
                events = engine.step()
            except Exception as exc:  # a failed decode must not kill the loop silently
                logger.exception("engine step failed; failing in-flight requests")
                self._fail_all(exc)
                for request_id in list(engine.scheduler.requests):
                    engine.abort_request(request_id)
                continue
            self._deliver_many([(event.request_id, event) for event in events])

    def _add(self, engine: LocalEngine, request: GenerationRequest) -> None:
        if request.request_id not in self._streams:
            return  # cancelled before the engine saw it
        try:
            engine.add_request(request)
        except Exception as exc:
            self._deliver(request.request_id, exc)

    def _deliver(self, request_id: str, item: object) -> None:
        self._deliver_many([(request_id, item)])

    def _deliver_many(self, items: list[tuple[str, object]]) -> None:
        """Hand (request id, event or error) pairs to their streams with one wake-up per event loop.

        One wake-up per step rather than per token: the event loop shares our two cores.
        """
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for request_id, item in items:
            stream = self._streams.get(request_id)
            if stream is not None:
                by_loop.setdefault(stream[0], []).append((stream[1], item))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:
                pass  # the consumer's event loop is closed; its abort frees the blocks

    def _fail_all(self, exc: BaseException) -> None:
        for request_id in list(self._streams):
            self._deliver(request_id, exc)


def _put_all(items: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)
