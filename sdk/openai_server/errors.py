"""Every failure leaves the server in OpenAI's error shape, with the status OpenAI uses.

Clients (the official SDKs included) read `error.message`/`type`/`code` and decide on
retries from the status, so the mapping from engine exceptions lives in one table here.
"""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from sdk.budgets.manager import BudgetExhaustedError
from sdk.protocol.engine import (
    ContextLengthError,
    EngineNotReadyError,
    EngineOverloadedError,
    InvalidRequestError,
    StateUnavailableError,
)
from sdk.protocol.openai_schema import ErrorInfo, ErrorResponse

logger = logging.getLogger(__name__)


class OpenAIError(Exception):
    """An error response: raise it anywhere in a handler to answer with it."""

    def __init__(
        self,
        status_code: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status_code = status_code
        self.info = ErrorInfo(message=message, type=type, param=param, code=code)
        self.headers = headers or {}

    def body(self) -> dict:
        return ErrorResponse(error=self.info).model_dump()

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


def retry_after_header(wait_s: float) -> str:
    """Whole seconds, rounded up and at least 1, as HTTP's Retry-After wants them."""
    return str(max(1, math.ceil(wait_s)))


def invalid_api_key(presented: bool) -> OpenAIError:
    """OpenAI's 401; the message never repeats the key that was sent."""
    if presented:
        message = "Incorrect API key provided. Check the key sent in the Authorization header."
    else:
        message = (
            "You didn't provide an API key. You need to provide your API key in an Authorization header "
            "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    # WWW-Authenticate: what RFC 6750 asks of a 401 for bearer tokens.
    return OpenAIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def rate_limited(wait_s: float, per_minute: float) -> OpenAIError:
    """OpenAI's 429 for a requests-per-minute limit (its `type` names the limit hit: "requests")."""
    retry_after = retry_after_header(wait_s)
    return OpenAIError(
        429,
        f"Rate limit reached on requests per min (RPM): Limit {per_minute:g}. Please try again in {retry_after}s.",
        type="requests",
        code="rate_limit_exceeded",
        headers={"Retry-After": retry_after},
    )


def auth_backoff(wait_s: float) -> OpenAIError:
    """429 for an address backing off after failed API keys (or admin keys): its key was not checked."""
    retry_after = retry_after_header(wait_s)
    return OpenAIError(
        429,
        f"Too many requests with a wrong or missing API key (or admin key) from this address. The key was not checked; "
        f"please try again in {retry_after}s.",
        type="requests",
        code="auth_backoff",
        headers={"Retry-After": retry_after},
    )


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"The model `{model}` does not exist. GET /v1/models lists the served models.",
        param="model",
        code="model_not_found",
    )


def from_exception(exc: BaseException) -> OpenAIError:
    """The OpenAI error for anything a handler or an engine raised."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, ContextLengthError):
        return OpenAIError(400, str(exc), param=exc.param, code="context_length_exceeded")
    if isinstance(exc, InvalidRequestError):
        return OpenAIError(400, str(exc), param=exc.param)
    if isinstance(exc, EngineOverloadedError):
        headers = {"Retry-After": retry_after_header(exc.retry_after_s)}
        return OpenAIError(503, str(exc), type="server_overloaded", code="server_overloaded", headers=headers)
    if isinstance(exc, EngineNotReadyError):
        return OpenAIError(
            503, str(exc), type="service_unavailable", code="model_not_ready", headers={"Retry-After": "1"}
        )
    if isinstance(exc, StateUnavailableError):
        headers = {"Retry-After": retry_after_header(exc.retry_after_s)}
        return OpenAIError(
            503, str(exc), type="service_unavailable", code="state_database_unavailable", headers=headers
        )
    if isinstance(exc, ValidationError):
        return from_validation_errors(exc.errors(include_url=False))
    if isinstance(exc, BudgetExhaustedError):
        # OpenAI's quota error: its clients stop retrying a 429 when told so (x-should-retry).
        return OpenAIError(
            429, str(exc), type="insufficient_quota", code="insufficient_quota", headers={"x-should-retry": "false"}
        )
    logger.error("unexpected error while serving a request", exc_info=exc)
    return OpenAIError(
        500, f"The server hit an internal error ({type(exc).__name__}); it was logged.", type="server_error"
    )


def _loc_to_param(loc: tuple) -> str | None:
    """('messages', 0, 'content') -> 'messages[0].content', the way OpenAI names params."""
    parts = [p for p in loc if p not in ("body",)]
    # Pydantic adds the union member it tried (e.g. 'str', 'list[int]') to the path; drop it.
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in str(part) or str(part) in ("str", "int", "float", "bool", "none"):
            break
        else:
            out += ("." if out else "") + str(part)
    return out or None


def from_validation_errors(errors: list[dict]) -> OpenAIError:
    """A 400 naming the first bad field; malformed JSON gets OpenAI's own wording."""
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid").get("ctx", {}).get("error", "")
        return OpenAIError(
            400,
            "We could not parse the JSON body of your request. The body must be a JSON object "
            f"with the request's fields ({detail}).",
        )
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    param = _loc_to_param(tuple(first.get("loc", ())))
    messages = []
    for error in errors[:3]:
        where = _loc_to_param(tuple(error.get("loc", ())))
        messages.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return OpenAIError(400, "Invalid request: " + "; ".join(messages) + more, param=param)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error FastAPI or a handler can raise through the OpenAI shape."""

    async def on_openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI answers 422 by default; OpenAI answers 400.
        return from_validation_errors(list(exc.errors())).response()

    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        error = OpenAIError(exc.status_code, str(exc.detail), code=code, headers=dict(exc.headers or {}))
        return error.response()

    async def on_any_error(request: Request, exc: Exception) -> JSONResponse:
        return from_exception(exc).response()

    app.add_exception_handler(OpenAIError, on_openai_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    for engine_error in (
        InvalidRequestError,
        EngineOverloadedError,
        EngineNotReadyError,
        StateUnavailableError,
        ValidationError,
    ):
        app.add_exception_handler(engine_error, on_any_error)
    app.add_exception_handler(Exception, on_any_error)
