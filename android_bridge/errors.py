"""Errors as they cross the bridge: one JSON object, never a traceback.

    {"error": {"code": "invalid_json", "message": "...", "type": "invalid_request_error",
               "param": null, "status": 400}}

OpenAI's error object (message, type, param, code) with `code` always set and `status`,
the HTTP status the same failure gets from `tandem serve`, so an app can share its error
handling between the bridge and the HTTP endpoint. Stdlib only: errors are built before
anything heavy is imported (a malformed call must not pay for loading the runtime).
"""

from __future__ import annotations

import json
import logging

logger = logging.getLogger("tandem.android_bridge")


class BridgeError(Exception):
    """A failure reported to the app as an error object (module docstring)."""

    def __init__(
        self, code: str, message: str, status: int = 400, type: str = "invalid_request_error", param: str | None = None
    ):
        super().__init__(message)
        self.code, self.message, self.status, self.type, self.param = code, message, status, type, param

    def as_dict(self, **extra) -> dict:
        error = {
            "code": self.code,
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "status": self.status,
        }
        return {"error": error, **extra}


def not_started() -> BridgeError:
    return BridgeError(
        "not_started", "the tandem runtime is not running; call start(config_json) first", 409, "invalid_state"
    )


def cancelled(request_id: str, by_stop: bool = False) -> BridgeError:
    if by_stop:
        return BridgeError(
            "runtime_stopped", f"request {request_id} ended: stop() was called", 503, "service_unavailable"
        )
    return BridgeError("cancelled", f"request {request_id} was cancelled", 499, "cancelled")


def from_exception(exc: BaseException) -> BridgeError:
    """Any exception as a BridgeError: engine and validation errors keep the status, type and
    code tandem serve gives them; anything unexpected is logged here and reported by class name."""
    if isinstance(exc, BridgeError):
        return exc
    try:
        from sdk.openai_server.errors import from_exception as openai_error  # after start: already imported
    except Exception:  # the runtime's packages cannot import: report that, not a second traceback
        logger.exception("android_bridge: cannot import the error mapping")
        return BridgeError("internal_error", f"internal error ({type(exc).__name__})", 500, "server_error")
    error = openai_error(exc)  # logs unexpected exceptions with their traceback
    info = error.info
    return BridgeError(info.code or info.type, info.message, error.status_code, info.type, info.param)


def parse_object(text, what: str) -> dict:
    """A JSON object from the app; BridgeError('invalid_json') for anything else."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BridgeError("invalid_json", f"{what} is not UTF-8: {exc}") from None
    if text is None or text == "":
        return {}
    if not isinstance(text, str):
        raise BridgeError("invalid_json", f"{what} must be a JSON string, got {type(text).__name__}")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BridgeError("invalid_json", f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BridgeError("invalid_json", f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def dumps(value: dict) -> str:
    # ensure_ascii keeps the string plain ASCII: safe through any JNI string conversion.
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))
