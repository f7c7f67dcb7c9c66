"""The runtime behind the bridge: what `tandem serve` runs, minus HTTP.

The local engine (llama.cpp on its own thread), the cloud tier from the config and the
cascade runner, driven by an asyncio loop on one background thread. Every bridge call is
a coroutine submitted to that loop from whatever thread the app calls on, so calls are safe
from several threads and no call touches the engine directly.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from android_bridge.callbacks import CallbackDispatcher, check_callback
from android_bridge.errors import BridgeError, cancelled, from_exception, logger
from android_bridge.runtime_status import runtime_status

# The config sections the bridge takes are tandem's own (sdk.settings.fields); on a phone the
# cloud tier is somebody else's server, so the embedded PyTorch engine is not the default.
BRIDGE_DEFAULTS = {"cloud.url": "none"}
DEFAULT_LOAD_TIMEOUT_S = 300.0


class _InFlight:
    """One request the app can cancel: its task on the loop and, for streams, its dispatcher."""

    def __init__(self, dispatcher: CallbackDispatcher | None = None):
        self.task: asyncio.Task = None  # set by _launch
        self.dispatcher = dispatcher
        self.stopping = False  # cancelled by stop(): reported as runtime_stopped, not cancelled


class BridgeRuntime:
    def __init__(self, settings):
        self.settings = settings
        self.engine = None
        self.cascade = None  # sdk.assembly.cascade.Cascade
        self.cloud = None
        self.runner = None
        self.learning = None  # sdk.traffic.learning.Learning
        self.backend = None  # sdk.client.async_client.InProcessBackend
        self.started_at = time.time()
        self._in_flight: dict[str, _InFlight] = {}
        self.cloud_check: dict | None = None  # the last cloud health check a status call ran (runtime_status)
        self._closing = False
        self._submit_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tandem-bridge-loop", daemon=True)

    # -- life cycle ------------------------------------------------------------------------

    def start(self, wait: bool, load_timeout_s: float) -> None:
        """Start the engine (loading on its own thread), the cloud tier and the runner; with
        wait, block until the model is loaded. Raises BridgeError('start_failed') after
        undoing whatever had started."""
        from local_runtime.async_engine import AsyncLocalEngine
        from sdk.settings.serve_config import ServeConfig

        self._thread.start()
        try:
            config = ServeConfig.from_settings(self.settings)
            self.engine = AsyncLocalEngine(config.local).start()
            self._submit(self._start_cascade(config)).result()
            if wait:
                deadline = time.monotonic() + load_timeout_s
                self.engine.wait_ready(timeout=load_timeout_s)
                if self.cloud.engine is not None:  # the embedded cloud engine loads on its own thread too
                    self.cloud.engine.wait_ready(timeout=max(0.0, deadline - time.monotonic()))
        except BaseException as exc:
            self.stop()
            if isinstance(exc, BridgeError):
                raise
            raise BridgeError(
                "start_failed", f"the tandem runtime could not start: {exc}", 500, "server_error"
            ) from None

    async def _start_cascade(self, config) -> None:
        """What `tandem serve` starts (sdk.assembly.cascade), minus HTTP; the cloud tier starts at once."""
        from sdk.assembly.cascade import start_cascade
        from sdk.client.async_client import InProcessBackend

        self.cascade = await start_cascade(config, self.engine)  # clients bind to the loop they are made in
        self.cloud, self.runner, self.learning = self.cascade.cloud, self.cascade.runner, self.cascade.learning
        self.learning.start_background(self.runner)  # the retrain swaps routers into the runner
        self.backend = InProcessBackend(
            self.runner
        )  # feedback() and embeddings() (the embedding model loads on first use)

    def stop(self, grace_s: float = 5.0) -> None:
        """End every request (their callbacks get runtime_stopped), then the cloud tier, the engine, the loop."""
        with self._submit_lock:
            self._closing = True
        if self._thread.is_alive():
            dispatchers = []
            try:
                dispatchers = self._submit(self._stop_requests(), internal=True).result(timeout=grace_s + 5)
            except Exception:
                logger.exception("android_bridge: requests did not stop cleanly")
            for dispatcher in dispatchers:  # their last callback (runtime_stopped) is delivered before stop returns
                if not dispatcher.join(grace_s):
                    logger.warning("android_bridge: a callback of %s is still running at stop", dispatcher.request_id)
            if self.cascade is not None:
                try:
                    # An embedded engine's shutdown joins its thread (up to 30 s while it is still loading).
                    self._submit(self.cascade.close(), internal=True).result(timeout=grace_s + 65)
                except Exception:
                    logger.exception("android_bridge: the cascade (traffic record, cloud tier) did not close cleanly")
        if self.engine is not None:
            self.engine.shutdown()
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=grace_s)
        if not self._thread.is_alive():
            self._loop.close()

    async def _stop_requests(self) -> list[CallbackDispatcher]:
        in_flight = list(self._in_flight.values())
        for request in in_flight:
            request.stopping = True
            request.task.cancel()
        await asyncio.gather(*(request.task for request in in_flight), return_exceptions=True)
        return [request.dispatcher for request in in_flight if request.dispatcher is not None]

    # -- requests --------------------------------------------------------------------------

    def chat(self, body: dict, timeout_s: float | None) -> dict:
        """The whole answer as a chat.completion dict (blocking the calling thread)."""
        request_id = self._claim_id(body)
        future = self._submit(self._chat(request_id, body))
        try:
            return future.result(timeout=timeout_s)
        except FutureTimeout:
            self.cancel(request_id)
            raise BridgeError(
                "timeout", f"request {request_id} took longer than timeout_s={timeout_s}", 504, "timeout"
            ) from None

    def chat_stream(self, body: dict, callback) -> str:
        """Start a streamed answer and return its id at once; events go to the callback."""
        check_callback(callback)
        request_id = self._claim_id(body)
        in_flight = _InFlight(CallbackDispatcher(request_id, callback, lambda: self.cancel(request_id)))
        # A request refused while validating is this call's error (as HTTP answers 400 before
        # any event); only what fails once it runs reaches on_error.
        self._submit(self._launch_stream(request_id, body, in_flight)).result(timeout=30)
        in_flight.dispatcher.start()  # only once launched: a refused launch must leave no thread waiting
        return request_id

    def cancel(self, request_id: str) -> bool:
        """Cancel a request (either kind); False when no such request is in flight."""
        return self._submit(self._cancel(request_id)).result(timeout=10)

    async def _cancel(self, request_id: str) -> bool:
        in_flight = self._in_flight.get(request_id)
        if in_flight is None or in_flight.task.done():
            return False
        in_flight.task.cancel()  # closing the cascade's stream aborts the engine request and frees its blocks
        return True

    def _claim_id(self, body: dict) -> str:
        request_id = body.pop("request_id", None)
        if request_id is None:
            return f"chatcmpl-{uuid.uuid4().hex}"
        if not isinstance(request_id, str) or not 0 < len(request_id) <= 128:
            raise BridgeError(
                "invalid_request_error", "request_id must be a string of 1 to 128 characters", param="request_id"
            )
        return request_id

    async def _launch(self, request_id: str, in_flight: _InFlight, work) -> asyncio.Task:
        """Register the request under its id (refusing one in flight) and start it as a task."""
        if request_id in self._in_flight:
            work.close()
            raise BridgeError("duplicate_request_id", f"request {request_id} is already in flight", param="request_id")
        self._in_flight[request_id] = in_flight
        in_flight.task = asyncio.create_task(work)

        def forget(_task) -> None:
            if self._in_flight.get(request_id) is in_flight:
                del self._in_flight[request_id]

        in_flight.task.add_done_callback(forget)
        return in_flight.task

    async def _launch_stream(self, request_id: str, body: dict, in_flight: _InFlight) -> None:
        validated = await self._validated(body)
        await self._launch(request_id, in_flight, self._stream(request_id, validated, in_flight))

    async def _chat(self, request_id: str, body: dict) -> dict:
        in_flight = _InFlight()
        validated = await self._validated(body)
        task = await self._launch(request_id, in_flight, self._complete(request_id, validated))
        try:
            return await task
        except asyncio.CancelledError:
            if task.cancelled():  # the request was cancelled, not this waiter
                raise cancelled(request_id, by_stop=in_flight.stopping) from None
            raise

    async def _validated(self, body: dict):
        from router.decision import parse_model_choice
        from sdk.cascade.openai import prepare_routed
        from sdk.protocol.openai_schema import ChatCompletionRequest

        if self.runner is None:
            raise BridgeError("not_started", "the tandem runtime is not running", 409, "invalid_state")
        body.setdefault("model", "auto")
        # Through JSON text, exactly like an HTTP body: the same strict types and the same 400s.
        request = ChatCompletionRequest.model_validate_json(json.dumps(body))
        parse_model_choice(request.model)  # here, not on the first event: a bad model fails the call itself
        return request, await prepare_routed(self.runner, request, request.model)

    async def _complete(self, request_id: str, validated) -> dict:
        from sdk.cascade.openai import routed_completion

        request, chat = validated
        reply = await routed_completion(
            self.runner,
            chat,
            model=request.model,
            private=bool(request.private),
            response_id=request_id,
            created=int(time.time()),
        )
        return reply.model_dump(mode="json", exclude_none=True)

    async def _stream(self, request_id: str, validated, in_flight: _InFlight) -> None:
        """The stream's task: every ending reaches the callback, so the task itself never fails."""
        dispatcher = in_flight.dispatcher
        try:
            await self._deliver_stream(request_id, validated, dispatcher)
        except asyncio.CancelledError:
            dispatcher.error(cancelled(request_id, by_stop=in_flight.stopping))
        except Exception as exc:
            dispatcher.error(from_exception(exc))

    async def _deliver_stream(self, request_id: str, validated, dispatcher: CallbackDispatcher) -> None:
        from sdk.cascade.openai import routed_stream
        from sdk.cascade.responses import TandemChatCompletion
        from sdk.protocol.openai_schema import ChatChoice, ChatResponseMessage, ToolCall

        request, chat = validated
        created = int(time.time())
        chunks = await routed_stream(
            self.runner,
            chat,
            model=request.model,
            private=bool(request.private),
            response_id=request_id,
            created=created,
        )
        text, calls, last = [], [], None
        async for chunk in chunks:
            last = chunk
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is not None and (delta.content or delta.tool_calls):  # on_token: text, or the calls (each whole)
                text.append(delta.content or "")
                calls += [ToolCall(id=c.id, function=c.function) for c in delta.tool_calls or ()]
                dispatcher.token(chunk.model_dump(mode="json", exclude_none=True))
        if last is None or last.tandem is None:
            raise RuntimeError("the stream ended without its final chunk")
        message = ChatResponseMessage(content="".join(text) or (None if calls else ""), tool_calls=calls or None)
        choice = ChatChoice(index=0, message=message, finish_reason=last.choices[0].finish_reason)
        reply = TandemChatCompletion(
            id=request_id, created=created, model=request.model, choices=[choice], usage=last.usage, tandem=last.tandem
        )
        dispatcher.done(reply.model_dump(mode="json", exclude_none=True))

    # -- status ----------------------------------------------------------------------------

    def feedback(self, body: dict) -> dict:
        """POST /v1/feedback's answer for {"id", "score" | "thumbs"} (sdk.client's feedback, in-process)."""
        from sdk.client.async_client import build_feedback
        from sdk.traffic.record import FeedbackError

        request = build_feedback(body.get("id"), body.get("score"), body.get("thumbs"))
        unknown = sorted(set(body) - {"id", "score", "thumbs"})
        if unknown:
            raise BridgeError(
                "invalid_request_error",
                f"unknown field(s) {', '.join(unknown)}; feedback takes id, score or thumbs",
                param=unknown[0],
            )
        try:
            return self._submit(self.backend.feedback(request)).result().model_dump(exclude_none=True)
        except FeedbackError as exc:
            code = "response_not_found" if exc.status == 404 else "permission_denied"
            raise BridgeError(
                code, str(exc), exc.status, "not_found" if exc.status == 404 else "permission_denied", "id"
            ) from None

    def embeddings(self, body: dict) -> dict:
        """POST /v1/embeddings' answer for OpenAI's embeddings body (all-MiniLM-L6-v2, in-process)."""
        from sdk.client.async_client import build_embedding_request

        return (
            self._submit(self.backend.embeddings(build_embedding_request(body))).result().model_dump(exclude_none=True)
        )

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def status(self, check_cloud: bool, timeout_s: float) -> dict:
        """android_bridge.runtime_status: the engine's state and load, and the cloud's (checked when asked)."""
        return self._submit(runtime_status(self, check_cloud, timeout_s)).result(timeout=timeout_s + 10)

    def _submit(self, coroutine, internal: bool = False) -> Future:
        """Run a coroutine on the runtime's loop. Once stop() began, only its own work gets in:
        a call that raced with stop gets runtime_stopped instead of a future nobody resolves."""
        with self._submit_lock:
            if self._closing and not internal:
                coroutine.close()
                raise BridgeError("runtime_stopped", "the tandem runtime is stopping", 503, "service_unavailable")
            return asyncio.run_coroutine_threadsafe(coroutine, self._loop)
