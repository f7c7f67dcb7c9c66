"""Picking a model from GET /v1/models by what each card says it is for, never by its place in the
list (tandem serve lists its embedding model among the chat models: a bench that took "the first
that is not routed" sent chat requests to all-MiniLM-L6-v2)."""

from __future__ import annotations

import httpx


def fetch_model_cards(base_url: str, api_key: str | None = None) -> list[dict]:
    """GET /v1/models' entries ([] when the server does not answer with a list)."""
    root = base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(root + "/v1/models", headers=headers, timeout=10.0, trust_env=False)
        return response.json().get("data", []) if response.status_code == 200 else []
    except (httpx.HTTPError, ValueError):
        return []


def chat_model_ids(cards: list[dict]) -> list[str]:
    """The ids of the chat models, in the server's order. A card without `type` counts as a chat model:
    llama.cpp's and vLLM's servers do not say, and they list only the models they generate with."""
    return [card["id"] for card in cards if card.get("type", "llm") == "llm"]


def own_chat_model_id(cards: list[dict]) -> str:
    """The chat model the server runs itself: a chat model that is no routed name of the cascade
    (tandem's `route` field: auto, local, cloud). Raises ValueError when the list has none."""
    ids = [card["id"] for card in cards if card.get("type", "llm") == "llm" and not card.get("route")]
    if not ids:
        raise ValueError(f"GET /v1/models lists no chat model the server runs itself: {[c.get('id') for c in cards]}")
    return ids[0]
