"""The cloud tier as the product sees it: `CloudBackend`, its events, models and errors.

Every way of reaching a cloud (sdk.cloud.grpc_client over tandem.v1, sdk.cloud.openai_client over
any OpenAI-compatible HTTP API, and any later one) implements `CloudBackend` and declares what it
can do in the capability fields; the cascade and the servers read those fields and never probe a
client with getattr. Failures are `CloudError`s carrying a transport-neutral `CloudStatus`: each
client maps its own transport's failures (gRPC status codes, HTTP statuses, socket errors) onto it,
so router.failure_kinds and the cascade treat every backend alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, Self

from sdk.protocol.engine import (
    ContextLengthError,
    EngineError,
    EngineNotReadyError,
    EngineOverloadedError,
    InvalidRequestError,
    QuotaExceededError,
    SamplingParams,
    TokenEvent,
)

Prompt = str | Sequence[int] | Sequence[Mapping[str, str]]  # text, token ids, or chat messages


class CloudStatus(Enum):
    """Why a cloud call failed, in the canonical status vocabulary gRPC and Google's APIs share
    (the names are gRPC's codes, so a gRPC status maps by name; HTTP clients map their statuses)."""

    CANCELLED = "cancelled"
    UNKNOWN = "unknown"
    INVALID_ARGUMENT = "invalid_argument"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    NOT_FOUND = "not_found"
    ALREADY_EXISTS = "already_exists"
    PERMISSION_DENIED = "permission_denied"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    FAILED_PRECONDITION = "failed_precondition"
    ABORTED = "aborted"
    OUT_OF_RANGE = "out_of_range"
    UNIMPLEMENTED = "unimplemented"
    INTERNAL = "internal"
    UNAVAILABLE = "unavailable"
    DATA_LOSS = "data_loss"
    UNAUTHENTICATED = "unauthenticated"


class CloudError(EngineError):
    """A call to the cloud tier failed; `code` says how, `param` names the request field at fault."""

    def __init__(self, message: str, code: CloudStatus, param: str | None = None, retry_after_s: float = 1.0):
        Exception.__init__(self, message)  # the engine exceptions' own __init__s only set what is set here
        self.code = code
        self.param = param
        self.retry_after_s = retry_after_s


class CloudUnauthenticatedError(CloudError):
    """The API key is missing or wrong (UNAUTHENTICATED): retrying will not help."""


class CloudUnavailableError(CloudError, EngineNotReadyError):
    """The server is unreachable, shutting down or still loading (UNAVAILABLE): try later or elsewhere."""


class CloudDeadlineExceededError(CloudError):
    """The call ran past its deadline (DEADLINE_EXCEEDED); the server aborted the request."""


class CloudInvalidArgumentError(CloudError, InvalidRequestError):
    """The request can never succeed as sent (INVALID_ARGUMENT, or NOT_FOUND for an unknown model)."""


class CloudContextLengthError(CloudInvalidArgumentError, ContextLengthError):
    """Prompt plus completion do not fit in the cloud model's context."""


class CloudOverloadedError(CloudError, EngineOverloadedError):
    """RESOURCE_EXHAUSTED with a retry hint: the server's queue is full, or the caller spent its rate or
    concurrency budget; retry after `retry_after_s`."""


class CloudQuotaExceededError(CloudError, QuotaExceededError):
    """The key's budget on the cloud server is spent (gRPC RESOURCE_EXHAUSTED `insufficient_quota`, HTTP 429
    `insufficient_quota`): retrying will not help until the budget's period ends."""


@dataclass
class CloudModel:
    """A model the cloud tier serves."""

    id: str
    max_model_len: int  # 0 when the server does not say
    vocabulary_fingerprint: str = ""  # sdk.protocol.vocabulary; "" when the server does not say


@dataclass
class CloudTokenEvent(TokenEvent):
    """A TokenEvent received from the cloud tier; its speculative stats (TokenEvent's
    num_draft_tokens / num_accepted_tokens) arrive on the last event only."""


class DraftingCall(Protocol):
    """One cloud answer streamed while the caller drafts its next tokens (CloudBackend.generate_with_drafts;
    tandem.v1's GenerateWithDrafts): iterate it for the cloud's tokens, and offer drafts meanwhile."""

    def __aiter__(self) -> AsyncIterator[CloudTokenEvent]: ...

    def offer(
        self,
        start: int,
        token_ids: Sequence[int],
        support: Sequence[tuple[Sequence[int], Sequence[float]]] | None = None,
    ) -> None:
        """A draft of the tokens after the first `start` streamed ones (never waits); `support`: per token, the
        (token ids, probabilities) it was drawn from (None: one-hot)."""
        ...

    def close_drafts(self) -> None:
        """No more drafts: the cloud decodes the rest on its own."""
        ...

    def cancel(self) -> None:
        """End the call (the cloud aborts the request)."""
        ...


class CloudBackend(Protocol):
    """What the cascade, the servers and the bridge need from a cloud tier.

    Implementations subclass this to inherit the capability defaults (those of a tandem.v1 server
    reached directly) and override what differs."""

    # Takes `continuation_token_ids` (the local answer's tokens), so hand-off "continue" works;
    # False: the cascade must hand off by restarting (the cloud's tokenizer is not the local one).
    supports_continuation: bool = True
    # Takes Lark grammars (tool calls' structured output); False: such requests are answered locally.
    takes_grammars: bool = True
    # Continues a constrained answer (a grammar or JSON schema) after the local tokens, the constraint
    # advanced past them; False: a constrained answer is not handed off mid-way (the local one stands).
    continues_constrained: bool = True
    # Streams an answer while the caller drafts for it (generate_with_drafts: tandem.v1's GenerateWithDrafts, the
    # device drafting for the cloud); False: the cascade streams the cloud's answer alone (`draft_refused`).
    verifies_drafts: bool = False
    # Continues a raw prompt (text as it is, or token ids) without a chat template, as /v1/completions does;
    # False: a /v1/completions request through the cascade is answered locally (`cloud_no_raw_prompts`).
    takes_raw_prompts: bool = True

    @property
    def spreads_over_replicas(self) -> bool:
        """True when calls go to one of several replicas in turn: one replica going away mid-stream
        then says nothing about the tier (the next call goes to another)."""
        return False

    def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        model: str = "",
        request_id: str = "",
        continuation_token_ids: Sequence[int] = (),
        priority: int = 0,
        timeout_s: float | None = None,
    ) -> AsyncIterator[CloudTokenEvent]:
        """Stream the answer's tokens; the last event carries finish_reason and the usage counts.
        Closing the iterator early aborts the request on the server; failures raise CloudError."""
        ...

    def generate_with_drafts(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        model: str = "",
        request_id: str = "",
        continuation_token_ids: Sequence[int] = (),
        timeout_s: float | None = None,
    ) -> DraftingCall:
        """As `generate`, the caller drafting (backends whose `verifies_drafts` is True); else InvalidRequestError."""
        raise InvalidRequestError(f"{type(self).__name__} streams no answer with drafts (verifies_drafts is False)")

    async def list_models(self, timeout_s: float | None = None) -> list[CloudModel]: ...

    async def discover(self, *, timeout_s: float | None = None) -> None:
        """Learn what the server behind the client can do (once; CloudError when it cannot be reached, and
        the next call asks again). The capability fields may change after it; the cascade awaits it
        before reading them for a request that needs one (a grammar, a continuation)."""

    async def tokenize(self, texts: Sequence[str], *, timeout_s: float | None = None) -> list[list[int]] | None:
        """Each text's token ids in the cloud model's vocabulary (no special tokens added), or None when
        the server cannot say: the cascade compares them with the local tokenizer's when the cloud
        gives no vocabulary fingerprint (sdk.cascade.runner.CascadeRunner.vocabulary_verdict)."""
        return None

    async def health(self, *, timeout_s: float | None = None) -> str:
        """ "SERVING" when the tier can take calls (else another status name, or a CloudError)."""
        ...

    async def close(self) -> None:
        """Close what the client opened (a channel, HTTP connections); `async with` closes it on leaving."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()
