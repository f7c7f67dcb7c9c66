"""The asyncio face of a step engine: submit, stream token events, cancel.

Both tiers have a synchronous core whose `step()` is schedule -> run -> update
(`local_runtime.engine.LocalEngine`, `cloud_engine.engine.CloudEngine`). This class
runs such a core on its own thread (llama_decode and torch kernels release the GIL,
so the event loop keeps serving while a step computes). Requests and aborts reach
the loop through an inbox it drains between steps; events go back to each request's
asyncio queue with `call_soon_threadsafe`, one wake-up per event loop per step.

Drafts another model makes for a request (`offer_draft`) wait in the inbox one per request: a newer
one replaces the one waiting (the engine would replace it too), so a caller that drafts faster than
the engine steps costs one draft's memory and one offer a step, however fast it sends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections import deque
from typing import AsyncIterator, Callable, Protocol, Sequence

from sdk.protocol.engine import (
    EngineNotReadyError,
    EngineOverloadedError,
    EngineProtocol,
    EngineStats,
    GenerationRequest,
    TokenEvent,
)
from sdk.protocol.sampling_params import SamplingDefaults

logger = logging.getLogger(__name__)

_ABORTED = object()  # ends a stream whose request was cancelled by the engine side


class StepEngine(Protocol):
    """The synchronous engine core this wrapper drives (single-threaded by design)."""

    model_name: str
    max_model_len: int
    sampling_defaults: SamplingDefaults  # what add_request fills in for unset sampling fields

    def validate(self, request: GenerationRequest) -> None: ...
    def add_request(self, request: GenerationRequest) -> None: ...
    def abort_request(self, request_id: str) -> bool: ...
    def abort_all(self) -> None: ...
    def has_unfinished_requests(self) -> bool: ...
    def step(self) -> list[TokenEvent]: ...
    def tokenize(self, text: str, add_special: bool = True) -> list[int]: ...
    def detokenize(self, token_ids: Sequence[int]) -> str: ...
    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]: ...

    chat_template: str | None  # the model's Jinja template (its text tells the tool format)
    max_token_bytes: int  # the longest text one token stands for
    vocabulary_fingerprint: str  # sdk.protocol.vocabulary (computed on first read)
    vocab_size: int  # token ids are 0..vocab_size - 1
    # The most tokens of one outside draft it verifies; 0: none. Engines above 0 also have
    # `offer_draft(draft) -> str | None` (None when taken, else why not; ValueError for a malformed one).
    max_draft_tokens: int

    def stats(self) -> EngineStats: ...
    def close(self) -> None: ...


class AsyncStepEngine(EngineProtocol):
    """Implements sdk.protocol.engine.EngineProtocol over any StepEngine built on the engine thread."""

    def __init__(
        self,
        load: Callable[[], StepEngine],
        model_name: str,
        max_in_flight: int,
        max_model_len: int = 0,
        thread_name: str = "tandem-engine",
    ):
        self.model_name = model_name
        self.max_model_len = max_model_len  # final value known once loaded
        self._load = load
        self._max_in_flight = max_in_flight
        self._num_aborted = 0  # unfinished requests the engine thread aborted (written by it alone)
        self._engine: StepEngine | None = None
        self._load_error: BaseException | None = None
        self._wakeup = threading.Condition()
        self._inbox: deque[tuple[str, object]] = deque()
        # request id -> (its latest draft not yet taken, drafts offered since the engine last took one)
        self._drafts: dict[str, tuple[object, int]] = {}
        # key fingerprint ("" without keys) -> [draft tokens verified, accepted] of its drafted requests
        self._caller_drafts: dict[str, list[int]] = {}
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> "AsyncStepEngine":
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
            raise TimeoutError("the model did not load in time")

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
    def load_error(self) -> BaseException | None:
        """Why loading failed, once it has."""
        return self._load_error

    @property
    def engine(self) -> StepEngine:
        if self._engine is None or self._stopping:
            raise EngineNotReadyError(
                "the model is still loading" if not self._stopping else "the engine is shutting down"
            )
        return self._engine

    @property
    def sampling_defaults(self) -> SamplingDefaults | None:
        """The engine's defaults for unset sampling fields; None until the model has loaded."""
        return self._engine.sampling_defaults if self._engine is not None else None

    @property
    def vocabulary_fingerprint(self) -> str:
        """sdk.protocol.vocabulary's fingerprint of the loaded model's vocabulary ("" while loading).
        The first read computes it (a pass over the vocabulary): call it off the event loop."""
        return self._engine.vocabulary_fingerprint if self._engine is not None else ""

    @property
    def max_token_bytes(self) -> int | None:
        """The longest text one token of the loaded model stands for (None while loading):
        sdk.serving.prompt_tokens bounds a prompt's tokens from its bytes with it."""
        return self._engine.max_token_bytes if self._engine is not None else None

    @property
    def chat_template(self) -> str | None:
        """The loaded model's chat template (None while loading, or when it has none)."""
        return self._engine.chat_template if self._engine is not None else None

    @property
    def vocab_size(self) -> int | None:
        return self._engine.vocab_size if self._engine is not None else None

    @property
    def max_draft_tokens(self) -> int:
        return self._engine.max_draft_tokens if self._engine is not None else 0

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    # -- EngineProtocol --------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.engine.tokenize(text, add_special)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.engine.detokenize(token_ids)

    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]:
        return self.engine.apply_chat_template(messages)

    def stats(self) -> EngineStats:
        # Read without a lock: a snapshot that may be one step stale is fine for metrics.
        return dataclasses.replace(
            self.engine.stats(),
            num_requests_aborted_total=self._num_aborted,
            caller_draft_tokens_by_key={key: n[0] for key, n in self._caller_drafts.items()},
            caller_accepted_tokens_by_key={key: n[1] for key, n in self._caller_drafts.items()},
        )

    async def generate(self, request: GenerationRequest, hold_at: int | None = None) -> AsyncIterator[TokenEvent]:
        """Validate now (raising before any event), then stream the request's tokens. `hold_at` (engines that
        draft for another: the local engine) makes it a drafting request, held once its output has that many
        tokens until `rewind` moves it on."""
        engine = self.engine
        engine.validate(request)
        if len(self._streams) >= self._max_in_flight:
            raise EngineOverloadedError(
                f"the engine has {len(self._streams)} requests in flight; retry shortly", retry_after_s=1.0
            )
        if request.request_id in self._streams:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request.request_id] = (asyncio.get_running_loop(), queue)
        self._post(("add", (request, hold_at)))
        finished = False
        # A drafted request's verified draft tokens are its caller's: counted per key (stats, /metrics).
        counted = self._caller_drafts.setdefault(_key_of(request), [0, 0]) if request.drafted else None
        verified = accepted = 0
        try:
            while True:
                event = await queue.get()
                if event is _ABORTED:
                    return
                if isinstance(event, BaseException):
                    raise event
                finished = event.finish_reason is not None
                if counted is not None and event.num_draft_tokens > verified:
                    counted[0] += event.num_draft_tokens - verified
                    counted[1] += event.num_accepted_tokens - accepted
                    verified, accepted = event.num_draft_tokens, event.num_accepted_tokens
                yield event
                if finished:
                    return
        finally:
            self._streams.pop(request.request_id, None)
            if not finished:
                # The consumer went away (client disconnect, cancel): free its blocks now.
                self._post(("abort", request.request_id))

    def rewind(self, request_id: str, keep: int, append: Sequence[int], hold_at: int | None) -> None:
        """A drafting request's output becomes its first `keep` tokens and then `append`, held again at
        `hold_at` (LocalEngine.rewind), between two steps. Never waits; a request already gone is left alone."""
        self._post(("rewind", (request_id, keep, list(append), hold_at)))

    def hold_further(self, request_id: str, hold_at: int) -> None:
        """A drafting request's hold raised to `hold_at` (LocalEngine.hold_further), between two steps."""
        self._post(("hold", (request_id, hold_at)))

    def offer_draft(self, draft) -> None:
        """Hand a draft another model made to the engine (engines that verify outside drafts: the cloud
        engine's cloud_engine.spec_decode.outside_drafts), taken between two steps. Never waits; a
        draft the engine cannot use is dropped and the request decodes on its own, and one that waits
        for the engine is replaced by this one."""
        with self._wakeup:
            waiting = self._drafts.get(draft.request_id)
            self._drafts[draft.request_id] = (draft, 1 + (waiting[1] if waiting else 0))
            if waiting is None:
                self._inbox.append(("draft", draft.request_id))
                self._wakeup.notify_all()

    def num_drafts_waiting(self, request_id: str) -> int:
        """Drafts offered for the request since the engine last took one (it keeps only the latest)."""
        with self._wakeup:
            waiting = self._drafts.get(request_id)
        return waiting[1] if waiting else 0

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
            engine = self._load()
        except BaseException as exc:  # surfaced to wait_ready and /health
            logger.exception("loading the model failed")
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
            self._fail_all(EngineNotReadyError("the engine stopped"))
            engine.close()

    def _loop(self, engine: StepEngine) -> None:
        while True:
            with self._wakeup:
                self._wakeup.wait_for(lambda: self._inbox or self._stopping or engine.has_unfinished_requests())
                if self._stopping:
                    return
                inbox, self._inbox = self._inbox, deque()
            for kind, payload in inbox:
                if kind == "add":
                    self._add(engine, payload)
                elif kind == "draft":
                    self._offer(engine, payload)
                elif kind == "rewind":
                    self._rewind(engine, *payload)
                elif kind == "hold":
                    engine.hold_further(*payload)
                elif engine.abort_request(payload):
                    self._num_aborted += 1  # it was still unfinished: its KV blocks are free now
            if not engine.has_unfinished_requests():
                continue
            try:
                events = engine.step()
            except Exception as exc:  # a failed step must not kill the loop silently
                logger.exception("engine step failed; failing in-flight requests")
                self._fail_all(exc)
                engine.abort_all()
                continue
            self._deliver_many([(event.request_id, event) for event in events])

    def _add(self, engine: StepEngine, payload: tuple[GenerationRequest, int | None]) -> None:
        request, hold_at = payload
        if request.request_id not in self._streams:
            return  # cancelled before the engine saw it
        try:
            if hold_at is None:
                engine.add_request(request)
            else:
                engine.add_request(request, hold_at=hold_at)
        except Exception as exc:
            self._deliver_many([(request.request_id, exc)])

    def _rewind(self, engine: StepEngine, request_id: str, keep: int, append: list[int], hold_at: int | None) -> None:
        try:
            engine.rewind(request_id, keep, append, hold_at)
        except Exception as exc:  # a rewind the request cannot take ends it, with the reason
            logger.warning("rewinding %s failed: %s", request_id, exc)
            engine.abort_request(request_id)
            self._deliver_many([(request_id, exc)])

    def _offer(self, engine: StepEngine, request_id: str) -> None:
        with self._wakeup:
            draft, _ = self._drafts.pop(request_id, (None, 0))
        if draft is None:
            return
        try:
            # The door (sdk.serving.grpc.draft_door) refused malformed drafts already: one here came another way.
            refused = engine.offer_draft(draft) if engine.max_draft_tokens else "the engine verifies no drafts"
        except ValueError as exc:
            refused = f"malformed: {exc}"
        if refused is not None:
            logger.debug("draft for %s not taken: %s", request_id, refused)

    def _deliver_many(self, items: list[tuple[str, object]]) -> None:
        """Hand (request id, event or error) pairs to their streams with one wake-up per event loop.

        One wake-up per step rather than per token: the event loop shares the cores.
        """
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for request_id, item in items:
            stream = self._streams.get(request_id)
            if stream is not None:
                by_loop.setdefault(stream[0], []).append((stream[1], item))
        for loop, loop_items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, loop_items)
            except RuntimeError:
                pass  # the consumer's event loop is closed; its abort frees the blocks

    def _fail_all(self, exc: BaseException) -> None:
        self._deliver_many([(request_id, exc) for request_id in list(self._streams)])


def _key_of(request: GenerationRequest) -> str:
    """The key a request is counted under: its caller's key fingerprint ("" without keys)."""
    return (request.caller.key_fingerprint if request.caller is not None else None) or ""


def _put_all(items: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)
