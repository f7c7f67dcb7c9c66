"""tandem for Android apps through Chaquopy: a small JSON-in / JSON-out API.

    bridge = Python.getInstance().getModule("android_bridge")
    bridge.callAttr("start", "{\"local\": {\"model\": \"/data/.../model.gguf\", \"threads\": 4}}")
    val reply = bridge.callAttr("chat", requestJson).toString()  // {"messages": [{"role": "user", ...}]}
    val id = bridge.callAttr("chat_stream", requestJson, callback).toString()   // returns at once
    bridge.callAttr("cancel", requestId); bridge.callAttr("status"); bridge.callAttr("stop")
    bridge.callAttr("feedback", "{\"id\": \"chatcmpl-...\", \"thumbs\": \"up\"}")  // with "traffic": {"record": true}

Every function takes and returns JSON text. A failure returns (or, for a stream, reaches
on_error with) an error object `{"error": {"code", "message", "type", "param", "status"}}`
(android_bridge.errors), never a traceback. Functions are safe to call from any thread, but
start and chat block until done: call them off the UI thread. chat_stream returns at once
and calls the callback's on_token / on_done / on_error from a thread of its own.

Importing this module is cheap (stdlib only): the runtime's packages load in start().
See android_bridge/README.md for the app side (Gradle, Chaquopy, Kotlin).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from android_bridge.errors import BridgeError, dumps, not_started, parse_object

__all__ = ["cancel", "chat", "chat_stream", "embeddings", "feedback", "start", "status", "stop", "version"]

API_VERSION = 1  # bumped on any incompatible change to the functions or their JSON

_lock = threading.Lock()  # start/stop are serialized; requests read _runtime without it
_runtime = None  # android_bridge.runtime.BridgeRuntime while started


def _json_call(function: Callable[..., dict]) -> Callable[..., str]:
    """The bridge's error contract: whatever happens, the app gets JSON back."""

    def call(*args):
        try:
            return dumps(function(*args))
        except BaseException as exc:  # noqa: BLE001  (KeyboardInterrupt included: nothing may escape to Java)
            from android_bridge.errors import from_exception

            return dumps(from_exception(exc).as_dict())

    call.__name__, call.__doc__ = function.__name__, function.__doc__
    return call


def _running():
    runtime = _runtime
    if runtime is None:
        raise not_started()
    return runtime


@_json_call
def start(config_json: str = "{}") -> dict:
    """Start the runtime. The config holds tandem's own sections ("local", "cloud", "cascade",
    the keys of `tandem config show`) plus "bridge": {"wait": true, "load_timeout_s": 300}.
    By default the cloud tier is off ("cloud": {"url": "none"}); with wait (the default) this
    returns once the model is loaded. Returns {"ok": true, "status": {...}}."""
    global _runtime
    config = parse_object(config_json, "the start config")
    options = config.pop("bridge", {})
    if not isinstance(options, dict) or set(options) - {"wait", "load_timeout_s"}:
        raise BridgeError(
            "invalid_config",
            'the "bridge" section takes only "wait" (boolean) and "load_timeout_s" (seconds)',
            param="bridge",
        )
    wait, load_timeout_s = options.get("wait", True), options.get("load_timeout_s")
    if not isinstance(wait, bool) or not (
        load_timeout_s is None or (isinstance(load_timeout_s, (int, float)) and load_timeout_s > 0)
    ):
        raise BridgeError(
            "invalid_config", "bridge.wait must be a boolean and bridge.load_timeout_s a number > 0", param="bridge"
        )
    with _lock:
        if _runtime is not None:
            raise BridgeError(
                "already_started", "the tandem runtime is already running; call stop() first", 409, "invalid_state"
            )
        from android_bridge.runtime import BRIDGE_DEFAULTS, DEFAULT_LOAD_TIMEOUT_S, BridgeRuntime
        from sdk.settings import SettingsError, settings_from_mapping

        try:
            settings = settings_from_mapping(config, "the start config", defaults=BRIDGE_DEFAULTS)
        except SettingsError as exc:
            raise BridgeError("invalid_config", str(exc)) from None
        runtime = BridgeRuntime(settings)
        runtime.start(wait, load_timeout_s or DEFAULT_LOAD_TIMEOUT_S)
        _runtime = runtime
        return {"ok": True, "status": runtime.status(check_cloud=False, timeout_s=5.0)}


@_json_call
def stop() -> dict:
    """Stop the runtime: in-flight requests end (streams get on_error "runtime_stopped"), the
    model is unloaded. Returns {"ok": true, "was_running": bool}; stopping twice is fine."""
    global _runtime
    with _lock:
        runtime, _runtime = _runtime, None
        if runtime is not None:
            runtime.stop()
        return {"ok": True, "was_running": runtime is not None}


@_json_call
def chat(request_json: str) -> dict:
    """One chat completion, blocking until the whole answer is in. The request is OpenAI's
    chat body (model defaults to "auto"; "auto:<threshold>", "local", "cloud"; "private": true
    keeps it on the device) plus optional "request_id" (to cancel it from another thread) and
    "timeout_s". Returns OpenAI's chat.completion with tandem's routing field."""
    body = parse_object(request_json, "the chat request")
    timeout_s = body.pop("timeout_s", None)
    if timeout_s is not None and (
        isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0
    ):
        raise BridgeError("invalid_request_error", "timeout_s must be a number of seconds > 0", param="timeout_s")
    return _running().chat(body, timeout_s)


@_json_call
def chat_stream(request_json: str, callback) -> dict:
    """Start a streamed chat completion and return {"id": request_id} at once. The callback's
    on_token(json) gets each chat.completion.chunk with text, then exactly one of on_done(json)
    (the whole chat.completion, as chat() returns it) or on_error(json) (an error object with
    the request's "id"; code "cancelled" after cancel(id))."""
    body = parse_object(request_json, "the chat request")
    return {"id": _running().chat_stream(body, callback)}


@_json_call
def cancel(request_id: str) -> dict:
    """Cancel a request by id (a stream, or a chat given a "request_id"). Returns
    {"ok": true, "id": ...}, or the error code "request_not_found" once it has ended."""
    if not isinstance(request_id, str):
        raise BridgeError(
            "invalid_request_error", f"request_id must be a string, got {type(request_id).__name__}", param="request_id"
        )
    if not _running().cancel(request_id):
        raise BridgeError(
            "request_not_found", f"no request {request_id!r} is in flight (unknown, or already ended)", 404, "not_found"
        )
    return {"ok": True, "id": request_id}


@_json_call
def feedback(request_json: str) -> dict:
    """How right an answer was, for the router to learn from: {"id": "<the chat.completion's id>",
    "score": 0..1} or {"id", "thumbs": "up" | "down"}. Needs the runtime started with
    "traffic": {"record": true}. Returns {"object": "feedback", "id", "score", "recorded", "tier"}
    (recorded false for a privacy-flagged request); error code "response_not_found" for an id
    the record never saw."""
    return _running().feedback(parse_object(request_json, "the feedback request"))


@_json_call
def embeddings(request_json: str) -> dict:
    """Text embeddings, OpenAI's shape: {"input": "text" | ["text", ...], "encoding_format": "float" |
    "base64"} -> {"object": "list", "data": [{"embedding": [...384 floats], "index"}], "model":
    "all-MiniLM-L6-v2", "usage"}. The model loads on the first call (about a second; its ONNX export
    must already be in the cache: the device has no torch to make it)."""
    return _running().embeddings(parse_object(request_json, "the embeddings request"))


@_json_call
def status(options_json: str = "{}") -> dict:
    """{"state": "stopped" | "loading" | "ready" | "failed", "model", "model_loaded",
    "kv_cache": {"blocks_used", "blocks_total", "usage"}, "engine": {"running", "waiting"},
    "requests_in_flight", "cloud": {"configured", "target", "breaker", "reachable"}}.
    {"check_cloud": true, "timeout_s": 2} asks the cloud's health endpoint now (reachable
    stays null until a check has run)."""
    options = parse_object(options_json, "the status options")
    check_cloud, timeout_s = options.get("check_cloud", False), options.get("timeout_s", 2.0)
    if (
        not isinstance(check_cloud, bool)
        or isinstance(timeout_s, bool)
        or not isinstance(timeout_s, (int, float))
        or not 0 < timeout_s <= 60
    ):
        raise BridgeError("invalid_request_error", "check_cloud must be a boolean and timeout_s a number in (0, 60]")
    runtime = _runtime
    if runtime is None:
        return {"state": "stopped", "model_loaded": False}
    return runtime.status(check_cloud, float(timeout_s))


@_json_call
def version() -> dict:
    """{"api_version": 1, "tandem": "<package version>"}."""
    from importlib.metadata import PackageNotFoundError, version as package_version

    try:
        tandem = package_version("tandem-llm")
    except PackageNotFoundError:  # running from a source tree (as Chaquopy's app packaging may)
        tandem = None
    return {"api_version": API_VERSION, "tandem": tandem}
