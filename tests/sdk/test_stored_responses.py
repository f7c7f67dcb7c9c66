"""Stored responses (POST /v1/responses with store, OpenAI's default): previous_response_id continues
the conversation, GET and DELETE /v1/responses/{id} reach it, only for the key that made it; a
privacy-flagged request, `store: false` or a server with storing off keeps nothing. Through the
official `openai` client on a fake engine, then the stores themselves: retention and the size bound,
in SQLite and in the state database (PostgreSQL) replicas share."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.app_helpers import make_app
from sdk.openai_server.stored_responses import answer_message
from sdk.protocol.openai_schema import ChatCompletionRequest
from sdk.protocol.openai_schema.response_objects import FunctionCallItem, ResponseObject
from sdk.protocol.openai_schema.responses_api import ResponseCreateRequest
from sdk.response_store import ResponseStore, StoredResponse, StoreSettings
from sdk.response_store.sqlite_store import SQLiteResponseStore
from sdk.response_store.stored import MaintenanceClock
from tests.sdk.test_openai_server import FakeEngine


class RecordingEngine(FakeEngine):
    """The fake engine, keeping each conversation it was asked to template."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conversations: list[list[tuple[str, str | None]]] = []

    def apply_chat_template(self, messages):
        self.conversations.append([(_field(m, "role"), _field(m, "content")) for m in messages])
        return super().apply_chat_template(messages)


def _field(message, name):
    return message.get(name) if isinstance(message, dict) else getattr(message, name)


def client_for(app, key: str = "unused") -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key=key, http_client=http, max_retries=0)


@pytest.fixture
def store(response_store):
    """Each kind of store (tests/sdk/conftest.py): every test here runs on SQLite and on the state database."""
    assert isinstance(response_store, ResponseStore)  # the protocol the server is written against
    return response_store


async def test_previous_response_id_continues_and_get_delete_reach_it(store):
    engine = RecordingEngine(words=("Hello", " there"))
    client = client_for(make_app(engine, response_store=store))
    first = await client.responses.create(model="fake", input="Hi", instructions="Be brief.")
    assert first.store is True
    second = await client.responses.create(model="fake", input="And then?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    # The second turn saw the first (its instructions not carried over, as OpenAI does), then its own input.
    assert engine.conversations[-1] == [("user", "Hi"), ("assistant", "Hello there"), ("user", "And then?")]
    got = await client.responses.retrieve(first.id)
    assert got.model_dump() == first.model_dump()
    await client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as gone:
        await client.responses.create(model="fake", input="x", previous_response_id=first.id)
    assert gone.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        await client.responses.delete(first.id)
    # Three turns: the second's stored conversation holds the first.
    await client.responses.create(model="fake", input="Last.", previous_response_id=second.id)
    assert [role for role, _ in engine.conversations[-1]] == ["user", "assistant", "user", "assistant", "user"]


async def test_a_streamed_response_is_stored_before_its_last_event(store):
    client = client_for(make_app(RecordingEngine(words=("a", "b")), response_store=store))
    async with client.responses.stream(model="fake", input="Hi") as stream:
        async for event in stream:
            if event.type in ("response.completed", "response.incomplete"):
                # The id the last event names is already there for the next request.
                stored = await client.responses.retrieve(event.response.id)
                assert stored.output_text == "ab" and stored.status == event.response.status


def test_function_calls_are_carried_into_the_next_turn():
    """A stored answer that called a function is the assistant turn its function_call_output answers."""
    answer = ResponseObject(
        id="resp_1",
        created_at=0,
        status="completed",
        model="m",
        output=[FunctionCallItem(id="fc_1", call_id="call_1", name="get_weather", arguments='{"city":"Paris"}')],
    )
    history = [{"role": "user", "content": "Weather?"}, answer_message(answer)]
    follow_up = ResponseCreateRequest.model_validate(
        {"input": [{"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]}
    )
    chat = ChatCompletionRequest.model_validate(follow_up.chat_payload(history))
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool"]
    assert chat.messages[1].tool_calls[0].function.name == "get_weather" and chat.messages[2].tool_call_id == "call_1"


async def test_another_keys_response_is_not_found(store):
    app = make_app(FakeEngine(), api_keys={"sk-a", "sk-b"}, response_store=store)
    mine, theirs = client_for(app, "sk-a"), client_for(app, "sk-b")
    made = await mine.responses.create(model="fake", input="Hi")
    with pytest.raises(openai.NotFoundError):
        await theirs.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        await theirs.responses.create(model="fake", input="x", previous_response_id=made.id)
    with pytest.raises(openai.NotFoundError):
        await theirs.responses.delete(made.id)
    assert (await mine.responses.retrieve(made.id)).id == made.id  # still there for its own key


async def test_store_false_and_private_requests_keep_nothing(store):
    client = client_for(make_app(FakeEngine(), response_store=store))
    unstored = await client.responses.create(model="fake", input="Hi", store=False)
    private = await client.responses.create(model="fake", input="Hi", extra_body={"private": True})
    for response in (unstored, private):
        assert response.store is False
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(response.id)
    assert await store.stored_bytes() == 0


async def test_a_privacy_rule_keeps_a_request_unstored_on_every_model(store):
    """The cascade's rules decide storage on the model's own name too, not only on the routed models."""
    from router.privacy import PrivacyRules

    app = make_app(FakeEngine(), response_store=store)
    app.state.tandem.privacy_rules = PrivacyRules.from_config(None)  # the cascade's, with its default detectors
    client = client_for(app)
    flagged = await client.responses.create(model="fake", input="Mail me at ada@example.com")
    plain = await client.responses.create(model="fake", input="Hello")
    assert (flagged.store, plain.store) == (False, True)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(flagged.id)
    # A rule matching in the earlier turns counts too: continuing a clean response with a flagged input.
    continued = await client.responses.create(model="fake", input="ada@example.com", previous_response_id=plain.id)
    assert continued.store is False


async def test_a_server_that_stores_nothing_says_so():
    client = client_for(make_app(FakeEngine()))
    answered = await client.responses.create(model="fake", input="Hi")
    assert answered.store is False
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="fake", input="x", previous_response_id=answered.id)
    assert refused.value.body["param"] == "previous_response_id" and "store_responses" in refused.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(answered.id)


# ------------------------------------------------------------------------------------------- the stores


def stored(response_id: str, key: str | None, created_at: float, size: int = 100) -> StoredResponse:
    return StoredResponse(response_id, key, created_at, [{"role": "user", "content": "x" * size}], {"id": response_id})


async def check_bounds(store) -> None:
    """Shared by both stores: key scoping, retention, and the size bound keeping the newest."""
    now = time.time()
    await store.put(stored("resp_old", "k1", now - 3 * 86400))  # past the 2-day retention
    await store.put(stored("resp_a", "k1", now))
    await store.put(stored("resp_none", None, now))
    assert await store.get("resp_old", "k1") is None  # expired rows are never answered, even before they go
    assert (await store.get("resp_a", "k1")).conversation[0]["content"] == "x" * 100
    assert await store.get("resp_a", "k2") is None and await store.get("resp_a", None) is None
    assert (await store.get("resp_none", None)).id == "resp_none"
    assert not await store.delete("resp_a", "k2") and await store.delete("resp_a", "k1")
    # 30 rows of ~30 KB each against a 0.5 MB bound: the oldest go, the newest stay, under the bound.
    for i in range(30):
        await store.put(stored(f"resp_{i}", "k1", now + i, size=30_000))
    assert await store.stored_bytes() <= store.settings.max_bytes
    assert await store.get("resp_29", "k1") is not None and await store.get("resp_0", "k1") is None


async def test_each_store_keeps_its_bounds(open_response_store):
    store = open_response_store(StoreSettings(retention_days=2, max_mb=0.5), MaintenanceClock(every_s=0))
    await check_bounds(store)
    if isinstance(store, SQLiteResponseStore):
        assert store.path.stat().st_mode & 0o077 == 0  # conversations: readable by the owner only


async def test_a_response_comes_back_as_it_was_stored(store):
    """Every field through each store's row mapping (by column name): text beyond ASCII, nested JSON, no key."""
    now = time.time()
    original = StoredResponse(
        "resp_é", None, now, [{"role": "user", "content": "naïve ✓"}], {"id": "resp_é", "output": [{"n": [1, 2.5]}]}
    )
    assert await store.put(original)
    assert await store.get("resp_é", None) == original
    assert await store.stored_bytes(None, every_key=False) == original.to_row()["bytes"]


async def test_replicas_continue_each_others_conversations(state_db):
    """Two apps on one state database: a response one answered continues on the other."""
    from sdk.response_store.postgres_store import PostgresResponseStore

    engine = RecordingEngine(words=("Yes",))
    one = client_for(make_app(FakeEngine(words=("Hello",)), response_store=PostgresResponseStore(state_db)))
    other = client_for(make_app(engine, response_store=PostgresResponseStore(state_db)))
    first = await one.responses.create(model="fake", input="Hi")
    await other.responses.create(model="fake", input="More", previous_response_id=first.id)
    assert engine.conversations[-1] == [("user", "Hi"), ("assistant", "Hello"), ("user", "More")]


async def test_the_shared_store_while_its_database_is_away(postgres_server, state_db_url):
    """The state database's failure policy: an answer to keep is written once the database is back; reading a
    stored one meanwhile is a 503 with Retry-After, never a 500 or a silent 404."""
    from sdk.response_store.postgres_store import PostgresResponseStore
    from sdk.state.database import StateDatabase
    from tests.cloud_engine.grpc_helpers import wait_until

    db = await StateDatabase(state_db_url, lease_s=3.0).open()
    client = client_for(make_app(FakeEngine(), response_store=PostgresResponseStore(db)))
    before = await client.responses.create(model="fake", input="Hi")
    postgres_server.stop()
    try:
        during = await client.responses.create(model="fake", input="Hi again")  # answered; its store deferred
        assert during.store
        with pytest.raises(openai.InternalServerError) as away:
            await client.responses.retrieve(before.id)
        assert away.value.status_code == 503 and away.value.response.headers.get("retry-after")
        assert away.value.body["code"] == "state_database_unavailable"
    finally:
        postgres_server.start()
    assert await wait_until(lambda: db.available, timeout_s=15), "the database was not seen back"
    await db.flush()
    assert (await client.responses.retrieve(during.id)).id == during.id
    await db.close()
