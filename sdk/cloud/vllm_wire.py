"""What tandem sends a vLLM server beyond OpenAI's API, so a vLLM cloud gets the whole cascade.

vLLM is what an app's cloud tier becomes at scale (docs/cloud-at-scale.md, "cloud tier at scale"). Over OpenAI's
API alone it would get a reduced cascade; its own extensions close the gap:

- Discovery: `GET {root}/version` answers `{"version": "..."}` on vLLM (the root is the URL
  without `/v1`). Any other answer: a plain OpenAI-compatible server, which gets OpenAI's fields only.
- Continuation: `POST {root}/tokenize` with the chat messages renders the cloud model's own chat
  template into token ids; the local answer's token ids are appended and the whole goes to
  `/v1/completions` as `prompt: [ids]`, so the cloud goes on after the tokens already streamed,
  as a tandem.v1 server does with `continuation_token_ids`. Only when both tiers share a
  vocabulary: vLLM's model list gives no fingerprint, so the cascade compares the two tokenizers'
  ids for a probe text set (`/tokenize` with `prompt`; sdk.protocol.vocabulary).
- Constraints: `structured_outputs` ({"grammar": Lark} for tandem's tool-call grammars, {"json": schema},
  {"json_object": true}), so tool turns go to the cloud with tandem's own tool format and grammar.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from sdk.protocol.engine import StructuredOutput

VLLM = "vllm"
OPENAI = "openai"


@dataclass(frozen=True)
class ServerTraits:
    """What the server behind an OpenAI-compatible URL takes beyond OpenAI's API."""

    kind: str = OPENAI  # VLLM or OPENAI
    version: str = ""

    @property
    def takes_token_prompts(self) -> bool:
        """/tokenize with messages, and token-id prompts on /v1/completions."""
        return self.kind == VLLM

    @property
    def takes_grammars(self) -> bool:
        """structured_outputs with a Lark grammar."""
        return self.kind == VLLM


def server_root(base_url: str) -> str:
    """The server's root for the paths vLLM keeps outside /v1 (/version, /tokenize)."""
    base_url = base_url.rstrip("/")
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url


def traits_from_version(status: int, content: bytes) -> ServerTraits:
    """The traits a `GET /version` answer shows (a 404 or any other shape: a plain OpenAI server)."""
    if status != 200:
        return ServerTraits()
    try:
        payload = json.loads(content)
    except ValueError:
        return ServerTraits()
    if isinstance(payload, dict) and isinstance(payload.get("version"), str) and set(payload) <= {"version"}:
        return ServerTraits(VLLM, payload["version"])
    return ServerTraits()


def structured_outputs(structured: StructuredOutput) -> dict:
    """vLLM's structured_outputs for a constraint (its xgrammar backend compiles Lark directly)."""
    if structured.kind == "lark":
        return {"grammar": structured.grammar}
    if structured.kind == "json_object":
        return {"json_object": True}
    return {"json": json.loads(structured.schema)}


def completions_body(chat_body: dict, prompt_token_ids: list[int]) -> dict:
    """The streamed /v1/completions body for a chat body's sampling fields and a token-id prompt."""
    body = {key: value for key, value in chat_body.items() if key not in ("messages", "logprobs", "top_logprobs")}
    body["prompt"] = prompt_token_ids
    if chat_body.get("logprobs"):
        body["logprobs"] = chat_body.get("top_logprobs") or 0  # the legacy API: how many alternatives
    return body


def tokenize_chat_body(model: str, messages: list[dict]) -> dict:
    return {"model": model, "messages": messages, "add_generation_prompt": True}


def tokenize_text_body(model: str, text: str) -> dict:
    return {"model": model, "prompt": text, "add_special_tokens": False}


def token_ids_of(payload: object) -> list[int]:
    """The ids of a /tokenize answer; ValueError for any other shape."""
    tokens = payload.get("tokens") if isinstance(payload, Mapping) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise ValueError("the /tokenize answer has no list of token ids")
    return tokens


def chat_style_logprobs(logprobs: Mapping | None) -> list[dict]:
    """A /v1/completions chunk's legacy logprobs ({tokens, token_logprobs, top_logprobs}) as the
    chat API's `logprobs.content` entries, which sdk.cloud.openai_wire reads."""
    if not logprobs:
        return []
    if "content" in logprobs:
        return list(logprobs.get("content") or [])
    tokens, values = logprobs.get("tokens") or [], logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs") or [None] * len(tokens)
    return [
        {
            "token": token,
            "logprob": value if value is not None else 0.0,
            "top_logprobs": [{"token": t, "logprob": lp} for t, lp in (top or {}).items()],
        }
        for token, value, top in zip(tokens, values, tops)
    ]
