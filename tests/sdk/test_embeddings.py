"""POST /v1/embeddings (all-MiniLM-L6-v2) through the official `openai` client, LangChain's
OpenAIEmbeddings and tandem's own clients against a real `tandem serve`; the model itself
against the PyTorch reference, batched against alone."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import openai
import pytest

from sdk.protocol.engine import InvalidRequestError

pytestmark = pytest.mark.slow

MODEL = "all-MiniLM-L6-v2"
TEXTS = [
    "The cat sat on the mat.",
    "A feline rested on the rug.",
    "Quarterly revenue grew by 12%.",
    "Wie spät ist es?",
    "🙂 emoji and accents: café",
] + [f"sentence {i} " + "word " * (i * 7) for i in range(20)]


@pytest.fixture(scope="module")
def model():
    from sdk.embeddings.model import EmbeddingModel

    return EmbeddingModel()


def test_vectors_match_pytorch_and_do_not_depend_on_the_batch(model):
    import torch

    from router.prompt_router.embedder_export import pytorch_embedder
    from router.prompt_router.scorer import _encode

    batched = model.embed(TEXTS).vectors
    alone = np.stack([model.embed([text]).vectors[0] for text in TEXTS])
    np.testing.assert_allclose(batched, alone, atol=1e-5, rtol=0)  # what the int8 export cannot promise
    reference = pytorch_embedder()
    with torch.no_grad():
        expected = reference(**{k: torch.from_numpy(v) for k, v in _encode(model.truncating, TEXTS).items()}).numpy()
    np.testing.assert_allclose(batched, expected, atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    similar = batched[0] @ batched[1], batched[0] @ batched[2]
    assert similar[0] > similar[1] + 0.2  # the cat and the feline are closer than the revenue


def test_window_empty_and_truncate(model):
    long = "token " * 400
    with pytest.raises(InvalidRequestError) as caught:
        model.embed(["fine", long])
    assert caught.value.param == "input[1]" and "truncate" in str(caught.value)
    with pytest.raises(InvalidRequestError) as empty:
        model.embed(["fine", ""])
    assert empty.value.param == "input[1]"
    cut = model.embed(["fine", long], truncate=True)
    assert cut.num_tokens[1] == 256 and cut.num_tokens[0] == model.count_tokens(["fine"])[0]


@pytest.fixture(scope="module")
def client(server_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_openai_client_embeds(client, model):
    reply = client.embeddings.create(model=MODEL, input=TEXTS[:3])
    assert [d.index for d in reply.data] == [0, 1, 2] and reply.model == MODEL and reply.object == "list"
    vectors = np.array([d.embedding for d in reply.data])
    np.testing.assert_allclose(vectors, model.embed(TEXTS[:3]).vectors, atol=1e-5)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == sum(model.count_tokens(TEXTS[:3]))
    one = client.embeddings.create(model=MODEL, input=TEXTS[0])
    assert len(one.data) == 1 and len(one.data[0].embedding) == 384
    raw = httpx.post(
        f"{client.base_url}embeddings", json={"model": MODEL, "input": TEXTS[:2], "encoding_format": "base64"}
    ).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][1]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, vectors[1], atol=1e-6)
    assert MODEL in [m.id for m in client.models.list().data] and client.models.retrieve(MODEL).id == MODEL


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi", "dimensions": 128}, "dimensions"),
        ({"input": [1, 2, 3]}, "input"),
        ({"input": [[1, 2], [3]]}, "input"),
        ({"input": []}, "input"),
        ({"input": ["ok", ""]}, "input[1]"),
        ({"input": ["ok", "word " * 400]}, "input[1]"),
        ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ],
)
def test_refusals_name_the_field(server_url, body, param):
    reply = httpx.post(f"{server_url}/v1/embeddings", json={"model": MODEL, **body}, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param and reply.json()["error"]["type"] == "invalid_request_error"


def test_truncate_models_and_chat_with_an_embedding_model(server_url, client):
    long = "word " * 400
    cut = httpx.post(
        f"{server_url}/v1/embeddings", json={"model": MODEL, "input": long, "truncate": True}, timeout=60
    ).json()
    assert cut["usage"]["prompt_tokens"] == 256
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input="hi")
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert chat.value.body["param"] == "model" and "/v1/embeddings" in chat.value.body["message"]
    no_model = httpx.post(f"{server_url}/v1/embeddings", json={"input": "hi", "user": "u-1"}, timeout=60).json()
    assert no_model["model"] == MODEL and no_model["tandem"] == {"ignored_fields": ["user"]}


def test_langchain_openai_embeddings(server_url, model):
    from langchain_openai import OpenAIEmbeddings

    # Without check_embedding_ctx_length=False LangChain sends tiktoken ids, which the server refuses (input).
    embeddings = OpenAIEmbeddings(
        model=MODEL, base_url=f"{server_url}/v1", api_key="unused", check_embedding_ctx_length=False
    )
    vectors = np.array(embeddings.embed_documents(TEXTS[:2]))
    np.testing.assert_allclose(vectors, model.embed(TEXTS[:2]).vectors, atol=1e-5)
    assert len(embeddings.embed_query("hello")) == 384


def test_sdk_clients_and_the_bridge(server_url, model):
    from sdk import Client

    with Client(base_url=f"{server_url}/v1") as over_http:
        reply = over_http.embeddings.create(input=TEXTS[:2], model=MODEL)
        np.testing.assert_allclose([d.embedding for d in reply.data], model.embed(TEXTS[:2]).vectors, atol=1e-5)
        with pytest.raises(Exception) as refused:
            over_http.embeddings.create(input=[1, 2])
        assert "input" in str(refused.value)
    import android_bridge

    started = json.loads(
        android_bridge.start(json.dumps({"cloud": {"url": "none"}, "local": {"threads": 1, "kv_cache_tokens": 1024}}))
    )
    assert started.get("ok"), started
    try:
        reply = json.loads(android_bridge.embeddings(json.dumps({"input": TEXTS[:2]})))
        np.testing.assert_allclose([d["embedding"] for d in reply["data"]], model.embed(TEXTS[:2]).vectors, atol=1e-5)
        bad = json.loads(android_bridge.embeddings(json.dumps({"input": "x", "dimensions": 8})))
        assert bad["error"]["param"] == "dimensions" and bad["error"]["status"] == 400
    finally:
        android_bridge.stop()


def test_tokenize_and_detokenize_per_tier_and_for_the_embedding_model(server_url):
    def post(path, body):
        return httpx.post(f"{server_url}{path}", json=body, timeout=60)

    text = "Hello, tokens: café!"
    local = post("/tokenize", {"model": "local", "prompt": text}).json()
    cloud = post("/tokenize", {"model": "cloud", "prompt": text}).json()  # the embedded cloud engine: the same GGUF
    assert (
        local["tokens"] == cloud["tokens"] and local["count"] == len(local["tokens"]) and local["max_model_len"] == 512
    )
    assert post("/detokenize", {"model": "local", "tokens": local["tokens"]}).json()["prompt"].endswith(text)
    chat = post("/tokenize", {"messages": [{"role": "user", "content": text}]}).json()
    assert chat["count"] > local["count"]  # the template's own tokens around the text
    minilm = post("/tokenize", {"model": MODEL, "prompt": text}).json()
    assert minilm["max_model_len"] == 256 and minilm["tokens"][0] == 101  # [CLS]
    assert post("/detokenize", {"model": MODEL, "tokens": minilm["tokens"]}).json()["prompt"] == "hello, tokens : cafe!"
    refused = post("/tokenize", {"model": "auto", "prompt": text})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "model"


def test_models_say_what_each_model_is_for(server_url, client):
    """A client picks a chat model by the card's `type` (and tandem's `route`), never by its place:
    the embedding model is listed among the chat models (bench.tokenize_stall once sent chat to it)."""
    from bench.served_models import chat_model_ids, own_chat_model_id

    cards = httpx.get(f"{server_url}/v1/models", timeout=30).json()["data"]
    kinds = {card["id"]: (card["type"], card.get("route")) for card in cards}
    assert kinds[MODEL] == ("embeddings", None)
    assert (
        kinds["auto"] == ("llm", "auto") and kinds["local"] == ("llm", "local") and kinds["cloud"] == ("llm", "cloud")
    )
    own = own_chat_model_id(cards)
    assert kinds[own] == ("llm", None) and own == cards[-1]["id"]  # the engine's own name, still listed last
    assert MODEL not in chat_model_ids(cards)
    assert httpx.get(f"{server_url}/v1/models/{MODEL}", timeout=30).json()["type"] == "embeddings"
    assert client.models.retrieve("auto").model_extra["route"] == "auto"
