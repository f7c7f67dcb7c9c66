"""The caller's side of tandem.v1's GenerateWithDrafts: a generation on the cloud tier that the
device's model drafts for (issue 56). The call streams the cloud's tokens as Generate does; the
caller offers drafts of the next tokens whenever it has them, never waiting for a reply to send
the next, and the cloud verifies each in its next step.

    call = client.generate_with_drafts(prompt, params)
    async for event in call:                  # the cloud's tokens (event.num_accepted_tokens: so far)
        call.offer(start, token_ids, support) # start: how many of the streamed tokens the draft follows
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import grpc

from sdk.protocol.cloud_backend import CloudTokenEvent
from sdk.protocol.wire import tandem_pb2 as pb
from sdk.protocol.wire import tandem_pb2_grpc as pb_grpc
from sdk.protocol.wire.messages import event_from_response

_END = None  # closes the request stream: no more drafts


class DraftedGeneration:
    """One GenerateWithDrafts call: iterate it for the cloud's tokens; `offer` drafts meanwhile."""

    def __init__(self, channel: grpc.aio.Channel, opening: pb.GenerateRequest, timeout_s, metadata, on_error):
        self._outgoing: asyncio.Queue = asyncio.Queue()
        self._outgoing.put_nowait(pb.DraftedGenerateRequest(open=opening))
        self._on_error = on_error  # grpc.aio.AioRpcError -> the CloudError to raise
        self._call = pb_grpc.TandemStub(channel).GenerateWithDrafts(
            self._requests(), timeout=timeout_s, metadata=metadata
        )
        self.num_offered = 0
        self._closed = False

    async def _requests(self) -> AsyncIterator[pb.DraftedGenerateRequest]:
        while (message := await self._outgoing.get()) is not _END:
            yield message

    def offer(
        self,
        start: int,
        token_ids: Sequence[int],
        support: Sequence[tuple[Sequence[int], Sequence[float]]] | None = None,
    ) -> None:
        """Send a draft of the tokens after the first `start` streamed ones (never waits); `support`: per
        token, the (token ids, probabilities) it was drawn from."""
        if self._closed or not token_ids:
            return
        draft = pb.Draft(start=start, token_ids=list(token_ids))
        for ids, probs in support or ():
            draft.support.add(token_ids=list(ids), probs=list(probs))
        self._outgoing.put_nowait(pb.DraftedGenerateRequest(draft=draft))
        self.num_offered += 1

    def close_drafts(self) -> None:
        """No more drafts: the cloud decodes the rest on its own."""
        if not self._closed:
            self._closed = True
            self._outgoing.put_nowait(_END)

    def cancel(self) -> None:
        """End the call (the cloud aborts the request and frees its KV cache)."""
        self.close_drafts()
        self._call.cancel()

    async def __aiter__(self) -> AsyncIterator[CloudTokenEvent]:
        num_output_tokens = 0
        answered = False
        try:
            async for response in self._call:
                num_output_tokens += 1
                event = event_from_response(response, num_output_tokens)
                if event.finish_reason is not None:
                    # The answer is whole: close the drafts' side now, so that no draft is being written when
                    # the server ends the call (it waits for this: sdk.serving.grpc.service).
                    answered = True
                    self.close_drafts()
                yield event
        except grpc.aio.AioRpcError as error:
            if answered and error.code() == grpc.StatusCode.INTERNAL:
                return  # a draft written as the call ended, reported by grpc in place of the OK: the answer is whole
            raise self._on_error(error) from None
        finally:
            self.cancel()  # a no-op once the stream ended
