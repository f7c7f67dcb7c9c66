"""The tandem.v1.Tandem servicer over any EngineProtocol engine (grpc.aio).

Cancellation is the point of the Generate loop: a request whose caller is gone (it
cancelled, its deadline passed, the connection dropped) holds KV blocks and a decode
slot until the engine aborts it. grpc.aio cancels the handler's task in all those
cases, and the `finally` below closes the engine's stream and aborts the request.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import DecodeError

from sdk.serving.grpc import convert
from sdk.serving.grpc.auth import CALLER_KEY_FINGERPRINT
from sdk.protocol.wire import tandem_pb2 as pb
from sdk.protocol.wire import tandem_pb2_grpc as pb_grpc
from sdk.serving.grpc.draft_door import DraftDoor, DraftRefused
from sdk.serving.grpc.errors import status_for
from sdk.protocol.drafts import DraftLimits
from sdk.protocol.engine import Caller, EngineProtocol

logger = logging.getLogger(__name__)
# After a drafted answer's last token: how long the call waits for the caller to close its side (it does as
# soon as it reads that token) before ending anyway.
DRAFTS_CLOSE_GRACE_S = 2.0

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Tandem"].full_name  # "tandem.v1.Tandem"


class TandemServicer(pb_grpc.TandemServicer):
    """Generate and ListModels on one engine."""

    def __init__(self, engine: EngineProtocol, draft_limits: DraftLimits | None = None):
        self.engine = engine
        self.draft_limits = draft_limits or DraftLimits()  # what GenerateWithDrafts takes (draft_door)

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> None:
        await self._serve(request, context)

    async def GenerateWithDrafts(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        """Generate, the caller offering drafts as the answer streams (tandem.proto): the first message opens
        the request, later ones are drafts, handed to the engine between its steps (AsyncStepEngine.offer_draft)
        and verified there; each response carries the draft tokens verified and accepted so far. Each draft
        is bounded where it arrives (sdk.serving.grpc.draft_door)."""
        if self.engine.is_ready and self.engine.max_draft_tokens <= 0:  # still loading: Generate's UNAVAILABLE
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "this server's engine verifies no drafts; call Generate"
            )
            return
        incoming = requests.__aiter__()
        first = await _next_message(incoming, context)
        if first is None or first.WhichOneof("kind") != "open":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "GenerateWithDrafts: the first message must open the request (open)"
            )
            return
        await self._serve(first.open, context, drafts=incoming)

    async def _serve(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext, drafts=None) -> None:
        """One generation streamed to the caller; with `drafts` (the call's remaining messages), the caller's
        drafts are read beside it and every response carries the totals so far."""
        # Written with context.write rather than as an async generator, so a cancellation always
        # lands inside this coroutine (at the engine's queue or at a write) and the finally runs now.
        request_id = request.request_id or f"tandem-{uuid.uuid4().hex}"
        # The engine's id is always unique: clients choose theirs independently and may reuse them.
        engine_request_id = f"{request_id}#{uuid.uuid4().hex[:12]}"
        engine = self.engine
        try:
            generation_request = await convert.generation_request(request, engine, engine_request_id)
            generation_request.caller = Caller(
                CALLER_KEY_FINGERPRINT.get()
            )  # budgets bill per key (gRPC has no `user`)
            generation_request.drafted = drafts is not None  # its verified drafts are metered to the caller
            events = engine.generate(generation_request)
        except Exception as exc:
            await _abort_with(context, exc)  # raises: the call ends here
            return
        refusal: list[DraftRefused] = []  # a draft the door refuses ends the call with its reason
        reader = None
        if drafts is not None:
            door = DraftDoor(engine, self.draft_limits, engine_request_id)
            reader = asyncio.create_task(_offer_drafts(drafts, door, refusal))
        finished = False
        error: Exception | None = None
        try:
            async for event in events:
                if refusal:
                    break
                response = convert.response_from_event(event, request_id)
                if reader is not None:
                    response.speculative.draft_tokens = event.num_draft_tokens
                    response.speculative.accepted_tokens = event.num_accepted_tokens
                await context.write(response)
                if event.finish_reason is not None:
                    finished = True
                    break
        except Exception as exc:  # raised by the engine (its validation runs at the first event)
            error = exc
        finally:
            await _close(engine, events, engine_request_id, abort=not finished)
            if reader is not None:
                if finished:
                    # The caller closes its side once it reads the last token (sdk.cloud.grpc_drafts). Ending the
                    # call before that fails a draft it is still writing, which its grpc reports as INTERNAL
                    # ("Internal error from Core") in place of this call's OK: seen through bench.spec_cascade.
                    await asyncio.wait([reader], timeout=DRAFTS_CLOSE_GRACE_S)
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
        if context.done():
            return  # the caller is gone: nobody to tell
        if error is not None:  # the engine's refusal of the request itself (loading, invalid) comes first
            await _abort_with(context, error)
        if refusal:
            await context.abort(refusal[0].code, refusal[0].message)
        if not finished:
            # The engine ended the stream without a last event (it aborted the request itself).
            await context.abort(grpc.StatusCode.ABORTED, "the server stopped this request before it finished")

    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        fingerprint = await asyncio.to_thread(lambda: self.engine.vocabulary_fingerprint)  # first read: ~0.1 s
        card = pb.ModelCard(
            id=self.engine.model_name,
            max_model_len=max(0, self.engine.max_model_len or 0),
            vocabulary_fingerprint=fingerprint,
        )
        return pb.ListModelsResponse(models=[card])


async def _close(engine: EngineProtocol, events: AsyncIterator, engine_request_id: str, abort: bool) -> None:
    """Close the engine's stream (freeing its slot) and abort the request if it did not finish.

    Runs to the end even while this task is being cancelled. Closing the stream already aborts
    an unfinished request in AsyncStepEngine; the explicit abort makes that hold for any
    EngineProtocol engine (it is a no-op for a request the engine no longer has).
    """
    try:
        await asyncio.shield(_close_and_abort(engine, events, engine_request_id, abort))
    except asyncio.CancelledError:
        raise
    except Exception:
        logger.exception("stopping request %s failed", engine_request_id)


async def _close_and_abort(engine: EngineProtocol, events: AsyncIterator, engine_request_id: str, abort: bool) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()
    if abort:
        await engine.abort(engine_request_id)
        logger.debug("request %s ended before its last token; aborted in the engine", engine_request_id)


async def _next_message(incoming: AsyncIterator[bytes], context: grpc.aio.ServicerContext):
    """The next DraftedGenerateRequest of a stream; None at its end. Bytes that are not one: INVALID_ARGUMENT."""
    try:
        raw = await anext(incoming)
    except StopAsyncIteration:
        return None
    try:
        return pb.DraftedGenerateRequest.FromString(raw)
    except DecodeError as exc:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid tandem.v1.DraftedGenerateRequest: {exc}"
        )


async def _offer_drafts(incoming: AsyncIterator[bytes], door: DraftDoor, refusal: list[DraftRefused]) -> None:
    """Read the caller's drafts until it closes its side; each goes to the engine (never awaited there) once
    the door has checked it, before it is parsed and before anything is made of it."""
    async for raw in incoming:
        try:
            draft = door.admit(raw)
        except DraftRefused as refused:
            refusal.append(refused)
            await door.engine.abort(door.request_id)  # ends the answer's stream now: the call ends with the refusal
            return
        door.engine.offer_draft(draft)


async def _abort_with(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    status = status_for(exc)
    await context.abort(status.code, status.message, trailing_metadata=status.metadata)


def _parsed(method, message_cls):
    """`method` taking the raw request bytes: bytes that are not a `message_cls` (corrupt wire
    format, invalid UTF-8 in a string field) get INVALID_ARGUMENT, where gRPC's own deserializer
    would answer UNKNOWN and log a traceback for every such request."""

    async def handler(raw: bytes, context: grpc.aio.ServicerContext):
        try:
            request = message_cls.FromString(raw)
        except DecodeError as exc:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the request is not a valid {message_cls.DESCRIPTOR.full_name} message: {exc}",
            )
        return await method(request, context)

    return handler


def add_tandem_servicer(
    engine: EngineProtocol, server: grpc.aio.Server, draft_limits: DraftLimits | None = None
) -> TandemServicer:
    """The servicer's methods, registered as tandem_pb2_grpc registers them, but parsing requests themselves."""
    servicer = TandemServicer(engine, draft_limits)
    handlers = {
        "Generate": grpc.unary_stream_rpc_method_handler(
            _parsed(servicer.Generate, pb.GenerateRequest), response_serializer=pb.GenerateResponse.SerializeToString
        ),
        "GenerateWithDrafts": grpc.stream_stream_rpc_method_handler(
            servicer.GenerateWithDrafts, response_serializer=pb.GenerateResponse.SerializeToString
        ),
        "ListModels": grpc.unary_unary_rpc_method_handler(
            _parsed(servicer.ListModels, pb.ListModelsRequest),
            response_serializer=pb.ListModelsResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
    return servicer
