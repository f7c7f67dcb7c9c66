"""Where a GenerateWithDrafts caller's drafts come in: each draft message is bounded before anything is
allocated for it, and refused naming the bound it broke (every caller may be hostile; the device's
drafter, sdk.cascade.device_drafts, stays within the defaults).

In the order they are checked, for each message after the one that opens the request:
- its size, before it is parsed: at most what a draft of the engine's max_draft_tokens tokens, each
  with a support of draft_max_support entries, takes on the wire (INVALID_ARGUMENT);
- the call's rate: drafts_per_second messages a second, in bursts of as many (RESOURCE_EXHAUSTED);
- drafts the engine has not taken yet: drafts_max_outstanding (RESOURCE_EXHAUSTED);
- its tokens (max_draft_tokens) and each token's support (draft_max_support), counted on the parsed
  message before any list is copied out of it, then its token ids against the engine's vocabulary
  and its probabilities (INVALID_ARGUMENT).
"""

from __future__ import annotations

import grpc
from google.protobuf.message import DecodeError

from sdk.protocol.drafts import DraftLimits, OutsideDraft
from sdk.protocol.engine import EngineProtocol
from sdk.protocol.wire import tandem_pb2 as pb
from sdk.serving.client_limits import RequestRateLimiter

# Where each bound is set, as the refusals name it.
TOKENS_SETTING = "cloud.max_draft_tokens"
SUPPORT_SETTING = "cloud_server.draft_max_support"
RATE_SETTING = "cloud_server.drafts_per_second"
OUTSTANDING_SETTING = "cloud_server.drafts_max_outstanding"


class DraftRefused(Exception):
    """A draft message the door does not take: the call ends with `code` and `message`."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class DraftDoor:
    """One GenerateWithDrafts call's drafts for the engine's request `request_id`."""

    def __init__(self, engine: EngineProtocol, limits: DraftLimits, request_id: str):
        self.engine = engine
        self.limits = limits
        self.request_id = request_id
        self.max_tokens = engine.max_draft_tokens
        self.max_bytes = limits.max_message_bytes(self.max_tokens)
        # One bucket for this call alone: a per-request rate, whatever else the caller's key is doing.
        self.rate = RequestRateLimiter(limits.per_second * 60.0, burst=limits.per_second)

    def admit(self, raw: bytes) -> OutsideDraft:
        """The draft in one message, checked; DraftRefused naming the bound it breaks."""
        if len(raw) > self.max_bytes:
            raise _invalid(
                f"a draft message of {len(raw)} bytes; at most {self.max_bytes} (what a draft of {TOKENS_SETTING} = "
                f"{self.max_tokens} tokens with supports of {SUPPORT_SETTING} = {self.limits.max_support} takes)"
            )
        if self.rate.take("call") > 0.0:
            raise DraftRefused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"GenerateWithDrafts: more than {self.limits.per_second:g} drafts a second for one request "
                f"({RATE_SETTING})",
            )
        waiting = self.engine.num_drafts_waiting(self.request_id)
        if waiting >= self.limits.max_outstanding:
            raise DraftRefused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"GenerateWithDrafts: {waiting} drafts of this request wait for the engine; at most "
                f"{self.limits.max_outstanding} ({OUTSTANDING_SETTING})",
            )
        try:
            message = pb.DraftedGenerateRequest.FromString(raw)
        except DecodeError as exc:
            raise _invalid(f"the message is not a valid tandem.v1.DraftedGenerateRequest: {exc}") from None
        if message.WhichOneof("kind") != "draft":
            raise _invalid("only the first message opens the request; later ones are drafts")
        return self._draft_of(message.draft)

    def _draft_of(self, message: pb.Draft) -> OutsideDraft:
        num_tokens = len(message.token_ids)
        if num_tokens > self.max_tokens:
            raise _invalid(
                f"a draft of {num_tokens} tokens; this server verifies at most {self.max_tokens} a draft "
                f"({TOKENS_SETTING})"
            )
        for index, support in enumerate(message.support):
            if len(support.token_ids) > self.limits.max_support or len(support.probs) > self.limits.max_support:
                raise _invalid(
                    f"support[{index}] has {max(len(support.token_ids), len(support.probs))} entries; at most "
                    f"{self.limits.max_support} a draft token ({SUPPORT_SETTING})"
                )
        draft = draft_of(message, self.request_id)
        try:
            draft.check(self.engine.vocab_size or 0, max_tokens=self.max_tokens, max_support=self.limits.max_support)
        except ValueError as exc:
            raise _invalid(f"draft: {exc}") from None
        return draft


def draft_of(message: pb.Draft, engine_request_id: str) -> OutsideDraft:
    """The wire's Draft as the engine takes it (unchecked: DraftDoor checks it first)."""
    support = None
    if message.support:
        support = tuple((tuple(s.token_ids), tuple(s.probs)) for s in message.support)
    return OutsideDraft(engine_request_id, message.start, tuple(message.token_ids), support)


def _invalid(message: str) -> DraftRefused:
    return DraftRefused(grpc.StatusCode.INVALID_ARGUMENT, f"GenerateWithDrafts: {message}")
