"""The errors an engine reports to its callers, each with one meaning on every front door
(sdk.openai_server.errors: HTTP status and OpenAI error JSON; sdk.serving.grpc.errors: gRPC status)."""

from __future__ import annotations


class EngineError(Exception):
    """Base class for errors an engine reports to its callers."""


class InvalidRequestError(EngineError):
    """The request can never succeed as sent (HTTP 400, gRPC INVALID_ARGUMENT)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class ContextLengthError(InvalidRequestError):
    """Prompt plus requested completion do not fit in the model's context."""


class EngineOverloadedError(EngineError):
    """The engine's queue is full; retry later (HTTP 503 + Retry-After)."""

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineNotReadyError(EngineError):
    """The engine is still loading or is shutting down."""


class QuotaExceededError(EngineError):
    """The caller has spent what its budget allows this period: retrying will not help until it
    ends (HTTP 429 insufficient_quota with x-should-retry: false, gRPC RESOURCE_EXHAUSTED with
    `tandem-error-type: insufficient_quota` and no retry-after)."""


class StateUnavailableError(EngineError):
    """The state database replicas share (spend, reservations, rate limits: sdk.state) cannot be
    reached, so a request that must be billed or limited there is refused rather than served
    unbilled (HTTP 503 `state_database_unavailable` + Retry-After, gRPC UNAVAILABLE).

    Its message is what a caller may read (plain words and a reference); `detail` (the database's
    address, the driver's error) is for logs only and never goes into a response."""

    def __init__(self, message: str, retry_after_s: float = 2.0, detail: str | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.detail = detail
