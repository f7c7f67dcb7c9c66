"""The wire side of `sdk.cloud.openai_client`: request bodies, SSE chunks -> CloudTokenEvents,
and HTTP failures -> the same `CloudError` classes and `CloudStatus`es as the gRPC client
(sdk.protocol.cloud_backend).

Kept free of I/O so every mapping can be read (and tested) on its own.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

import httpx

from sdk.protocol.cloud_backend import (
    CloudContextLengthError,
    CloudDeadlineExceededError,
    CloudError,
    CloudInvalidArgumentError,
    CloudOverloadedError,
    CloudQuotaExceededError,
    CloudUnauthenticatedError,
    CloudStatus,
    CloudTokenEvent,
    CloudUnavailableError,
    Prompt,
)
from sdk.protocol.engine import InvalidRequestError, SamplingParams, StructuredOutput, TopLogprob
from sdk.engine_common.grammar_closing import CLOSED_WITHIN_MAX_TOKENS
from sdk.protocol.sampling_params import TUNABLES
from sdk.cloud.vllm_wire import chat_style_logprobs, structured_outputs

# The stop_reason values tandem gives (a tandem cloud behind OpenAI's HTTP API sends them too).
TANDEM_STOP_REASONS = ("repetition", CLOSED_WITHIN_MAX_TOKENS)

UNKNOWN_TOKEN_ID = -1  # the text's token ids are the server's, and OpenAI's API does not send them
CONTEXT_LENGTH_CODE = "context_length_exceeded"  # OpenAI's and tandem's error code (sdk.openai_server.errors)
OVERLOADED_CODE = "server_overloaded"  # tandem's 503 for a full queue (sdk.openai_server.errors)
QUOTA_CODE = (
    "insufficient_quota"  # OpenAI's (and tandem's budgets') 429 for spent credit: not a reason to back off and retry
)


# -- requests --------------------------------------------------------------------------------


def chat_messages(prompt: Prompt) -> list[dict]:
    """OpenAI chat messages for a prompt: a string becomes one user message; token ids are refused."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    messages = list(prompt)
    if messages and all(isinstance(m, Mapping) for m in messages):
        out = []
        for m in messages:
            if "role" not in m or "content" not in m:
                raise invalid_argument("each message needs a role and a content", "messages")
            out.append({k: m[k] for k in ("role", "content", "name") if k in m})
        return out
    if not messages:
        raise invalid_argument("messages must contain at least one message", "messages")
    raise invalid_argument(
        "an OpenAI-compatible cloud takes text or chat messages, not token ids (they are the local tokenizer's)",
        "prompt",
    )


def request_body(
    messages: list[dict], params: SamplingParams | None, model: str, priority: int = 0, vllm: bool = False
) -> dict:
    """The streamed /chat/completions body. Only what differs from the defaults is sent, so
    servers without tandem/vLLM's extensions (top_k, stop_token_ids, ignore_eos, priority)
    accept every request that does not need them. `vllm`: a constraint goes as vLLM's
    structured_outputs (which takes tool calls' Lark grammars), else as OpenAI's response_format."""
    body: dict = {"model": model, "messages": messages, "stream": True, "stream_options": {"include_usage": True}}
    if priority:
        body["priority"] = priority  # vLLM extension
    if params is None:
        return body  # the server's defaults (max_tokens: what the context has left)
    body["max_tokens"] = params.max_tokens
    # Unset: nothing sent, so the server uses its default for its model. The extensions among the
    # tunables (min_p, repetition_penalty, top_k) are sent only when the request set them, and top_k
    # not at its off value (older vLLM refuses 0; SamplingParams' 0 means off).
    for name, knob in TUNABLES.items():
        value = getattr(params, name)
        if value is not None and (knob.sent_when_off or value != knob.off):
            body[name] = value
    if params.logit_bias:
        body["logit_bias"] = {str(token_id): bias for token_id, bias in params.logit_bias.items()}
    if params.min_tokens:
        body["min_tokens"] = params.min_tokens
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    if params.ignore_eos:
        body["ignore_eos"] = True
    if params.structured is not None and vllm:
        body["structured_outputs"] = structured_outputs(params.structured)
    elif params.structured is not None:
        body["response_format"] = response_format(params.structured)
    if params.repetition_stop is not None:  # tandem's extension: sent only when the request chose
        body["repetition_stop"] = params.repetition_stop
    if params.close_within_max_tokens is not None:  # likewise: vLLM gets max_tokens as is unless asked
        body["close_within_max_tokens"] = params.close_within_max_tokens
    if params.logprobs is not None:
        body.update(logprobs=True, top_logprobs=params.logprobs)
    return body


def response_format(structured: StructuredOutput) -> dict:
    """OpenAI's response_format for a constraint (the schema's name is not kept: any name will do)."""
    if structured.kind == "lark":  # tool calls: tandem renders them itself; an OpenAI server takes `tools`
        raise InvalidRequestError("tools cannot be sent to an OpenAI-compatible cloud tier yet", "tools")
    if structured.kind == "json_object":
        return {"type": "json_object"}
    return {
        "type": "json_schema",
        "json_schema": {"name": "response", "schema": json.loads(structured.schema), "strict": True},
    }


# -- responses -------------------------------------------------------------------------------


class ChunkStream:
    """Turns the stream's JSON chunks into events.

    The event with the finish_reason is held back until the stream ends ([DONE] or EOF),
    because OpenAI sends the usage in a chunk of its own after it (`choices: []`): that
    way the last event carries finish_reason *and* the usage counts, as with the gRPC
    client, and no empty extra event is emitted. Every other event goes out at once.
    """

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.num_events = 0
        self.final: CloudTokenEvent | None = None
        self.usage: Mapping | None = None

    def feed(self, chunk: Mapping) -> CloudTokenEvent | None:
        """The event to yield now for one chunk, if any; raises CloudError for an in-stream error."""
        if chunk.get("error") or chunk.get("object") == "error":
            info = chunk.get("error") if isinstance(chunk.get("error"), Mapping) else chunk
            raise CloudError(f"the cloud failed mid-stream: {info.get('message') or info}", CloudStatus.INTERNAL)
        if isinstance(chunk.get("usage"), Mapping):
            self.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if not choices:
            return None
        choice = choices[0]
        if self.final is not None:
            raise CloudError("the cloud sent text after the finish_reason", CloudStatus.INTERNAL)
        # A chat chunk's delta, or a /v1/completions chunk's text (a vLLM continuation: sdk.cloud.vllm_wire).
        text = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
        finish_reason = choice.get("finish_reason") or None
        entries = chat_style_logprobs(choice.get("logprobs"))
        if not text and finish_reason is None and not entries:
            return None  # the role prelude, or an empty keep-alive delta
        if text or entries:  # a chunk that only says how the stream ended is no token (llama-server sends one)
            self.num_events += 1
        event = _event(self.request_id or str(chunk.get("id", "")), text, entries, finish_reason, self.num_events)
        if finish_reason is None:
            return event
        stop_reason = choice.get("stop_reason")
        event.stop_reason = stop_reason if stop_reason in TANDEM_STOP_REASONS else None  # vLLM puts stop strings there
        self.final = event
        return None

    def finish(self) -> CloudTokenEvent:
        """The held-back last event with the usage counts; CloudError if the stream never finished."""
        if self.final is None:
            raise CloudError("the cloud's stream ended without a finish_reason", CloudStatus.INTERNAL)
        if self.usage is not None:
            self.final.num_prompt_tokens = int(self.usage.get("prompt_tokens") or 0)
            self.final.num_output_tokens = int(self.usage.get("completion_tokens") or self.final.num_output_tokens)
        return self.final


def _event(request_id: str, text: str, entries: list, finish_reason: str | None, count: int) -> CloudTokenEvent:
    """One content delta. With logprobs, a delta of several tokens gets their summed logprob
    (the text's) and the last token's alternatives; entropy and margin come from those
    alternatives only (a lower bound of the entropy; both 0.0 without logprobs)."""
    logprob, top, token_bytes = 0.0, [], text.encode()
    if entries:
        logprob = sum(float(e.get("logprob", 0.0)) for e in entries)
        top = [
            TopLogprob(
                UNKNOWN_TOKEN_ID,
                str(alt.get("token", "")),
                float(alt.get("logprob", 0.0)),
                bytes(alt.get("bytes") or str(alt.get("token", "")).encode()),
            )
            for alt in entries[-1].get("top_logprobs") or []
        ]
        if len(entries) == 1 and entries[0].get("bytes") is not None:
            token_bytes = bytes(entries[0]["bytes"])
    probs = sorted((math.exp(t.logprob) for t in top if math.isfinite(t.logprob)), reverse=True)
    entropy = -sum(p * math.log(p) for p in probs if p > 0)
    margin = probs[0] - probs[1] if len(probs) >= 2 else 0.0
    return CloudTokenEvent(
        request_id=request_id,
        token_id=UNKNOWN_TOKEN_ID,
        text=text,
        logprob=logprob,
        entropy=entropy,
        margin=margin,
        top_logprobs=top,
        token_bytes=token_bytes,
        finish_reason=finish_reason,
        num_prompt_tokens=0,
        num_output_tokens=count,
    )


def parse_data(data: str) -> dict:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise CloudError(f"the cloud sent a malformed stream chunk: {data[:200]!r}", CloudStatus.INTERNAL) from None
    if not isinstance(chunk, dict):
        raise CloudError(f"the cloud sent a malformed stream chunk: {data[:200]!r}", CloudStatus.INTERNAL)
    return chunk


# -- errors ----------------------------------------------------------------------------------


def invalid_argument(message: str, param: str | None = None) -> CloudInvalidArgumentError:
    return CloudInvalidArgumentError(message, CloudStatus.INVALID_ARGUMENT, param=param)


def error_from_response(status: int, headers: Mapping[str, str], body: bytes, base_url: str) -> CloudError:
    """The CloudError for a non-200 answer, with the message of OpenAI's error JSON when present."""
    info = _error_info(body)
    message = str(info.get("message") or f"HTTP {status} from {base_url}")
    param = info.get("param") if isinstance(info.get("param"), str) else None
    code, kind = str(info.get("code") or ""), str(info.get("type") or "")
    retry_after_s = retry_after_seconds(headers.get("retry-after"))
    S = CloudStatus
    if status == 401:
        return CloudUnauthenticatedError(message, S.UNAUTHENTICATED, param=param)
    if status == 403:
        return CloudError(message, S.PERMISSION_DENIED, param=param)  # router.failure_kinds: AUTH
    if status == 408 or status == 504:
        return CloudDeadlineExceededError(message, S.DEADLINE_EXCEEDED, param=param)
    if status == 429 and QUOTA_CODE in (code, kind):
        return CloudQuotaExceededError(message, S.RESOURCE_EXHAUSTED, param=param)
    if status == 429 or (status == 503 and OVERLOADED_CODE in (code, kind)):
        # 429: rate limited; tandem's own 503 "server_overloaded" is its queue being full.
        return CloudOverloadedError(message, S.RESOURCE_EXHAUSTED, param=param, retry_after_s=retry_after_s)
    if status in (502, 503):  # 502: the gateway could not reach the server (router.failure_kinds agrees)
        return CloudUnavailableError(
            f"the cloud tier at {base_url} is unavailable: {message}",
            S.UNAVAILABLE,
            param=param,
            retry_after_s=retry_after_s,
        )
    if 400 <= status < 500:
        context = CONTEXT_LENGTH_CODE in (code, kind) or "maximum context length" in message  # vLLM: words only
        cls = CloudContextLengthError if context else CloudInvalidArgumentError
        return cls(message, S.INVALID_ARGUMENT, param=param)
    return CloudError(message, S.INTERNAL, param=param)


def error_from_transport(error: httpx.TransportError, base_url: str) -> CloudError:
    """httpx's own failures: timeouts -> DEADLINE_EXCEEDED, the rest (refused, reset, DNS) -> UNAVAILABLE."""
    detail = str(error) or type(error).__name__
    if isinstance(error, httpx.TimeoutException):
        return CloudDeadlineExceededError(
            f"the cloud tier at {base_url} timed out: {detail}", CloudStatus.DEADLINE_EXCEEDED
        )
    return CloudUnavailableError(f"the cloud tier at {base_url} is unavailable: {detail}", CloudStatus.UNAVAILABLE)


def deadline_error(timeout_s: float | None) -> CloudDeadlineExceededError:
    return CloudDeadlineExceededError(
        f"the cloud call ran past its deadline ({timeout_s}s)", CloudStatus.DEADLINE_EXCEEDED
    )


def retry_after_seconds(value: str | None, default: float = 1.0) -> float:
    """Retry-After as seconds: delta-seconds or an HTTP date."""
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return default


def _error_info(body: bytes) -> dict:
    """OpenAI's {"error": {...}}, or vLLM's older flat {"object": "error", "message": ...}."""
    try:
        payload = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", errors="replace").strip()
        return {"message": text[:500]} if text else {}
    if not isinstance(payload, dict):
        return {}
    info = payload.get("error", payload)
    if isinstance(info, str):
        return {"message": info}
    return info if isinstance(info, dict) else {}
