"""Stored responses under a hostile caller (issue 66): one privacy verdict per request decides both where
it runs and whether it is stored (instructions included); what a response echoes outside the prompt is held
to OpenAI's bounds (400 naming the field); one stored response is bounded (a 400 before it runs, else
answered with store: false); and each key has its own share of the store, trimmed on the put that crosses
it, so one key's puts never delete another key's responses. Through the official `openai` client on the
app (the cascade's own machinery over a fake device model and a recording cloud), then the stores
themselves, SQLite and the state database (PostgreSQL)."""

from __future__ import annotations

import time

import openai
import pytest

from tests.app_helpers import make_app
from sdk.response_store import StoredResponse, StoreSettings
from sdk.response_store.sqlite_store import SQLiteResponseStore
from tests.reliability.test_security import RecordingCloud, _cascade
from tests.sdk.test_openai_server import FakeEngine
from tests.sdk.test_stored_responses import client_for

MB = 1024 * 1024
SECRET_INSTRUCTIONS = "Sign every answer for ada@example.com."  # the default `email` detector matches it


async def streamed_response(client, **body):
    """The response a stream's last event carries (response.completed or response.incomplete)."""
    async with client.responses.stream(**body) as stream:
        events = [event async for event in stream]
    assert events[-1].type in ("response.completed", "response.incomplete")
    return events[-1].response


@pytest.fixture
def store(response_store):
    """Each kind of store (tests/sdk/conftest.py): SQLite and the state database."""
    return response_store


# ------------------------------------------------------------------------------------- one privacy verdict


async def test_instructions_under_a_privacy_rule_are_answered_on_the_device_and_never_stored(store):
    """auto:1 sends every request to the cloud unless the privacy verdict keeps it local: instructions holding
    an e-mail address keep it on the device (nothing reaches the cloud) and the same verdict keeps it unstored,
    whole, streamed, and on the model's own name; a request without one is escalated and stored."""
    cloud = RecordingCloud()
    runner = _cascade(cloud)
    client = client_for(make_app(runner.local, cascade=runner, response_store=store))
    try:
        whole = await client.responses.create(
            model="auto:1", input="Plan my week.", instructions=SECRET_INSTRUCTIONS, max_output_tokens=2
        )
        streamed = await streamed_response(
            client, model="auto:1", input="Plan my week.", instructions=SECRET_INSTRUCTIONS, max_output_tokens=2
        )
        own_name = await client.responses.create(model="fake", input="Plan my week.", instructions=SECRET_INSTRUCTIONS)
        for answered in (whole, streamed):
            assert answered.model_extra["tandem"]["tier"] == "local"
        for answered in (whole, streamed, own_name):
            assert answered.store is False and answered.output_text
            with pytest.raises(openai.NotFoundError):
                await client.responses.retrieve(answered.id)
        assert cloud.texts() == []  # the instructions never left the device
        assert await store.stored_bytes() == 0
        plain = await client.responses.create(
            model="auto:1", input="Plan my week.", instructions="Be brief.", max_output_tokens=2
        )
        assert plain.model_extra["tandem"]["tier"] == "cloud" and plain.store is True
        assert (await client.responses.retrieve(plain.id)).output_text == plain.output_text
    finally:
        await runner.cloud.close()


async def test_a_continuation_with_flagged_instructions_is_not_stored(store):
    """The history replayed by previous_response_id is judged with the new instructions: the first turn is
    clean and stored, the second brings an address in its instructions and stays local and unstored."""
    cloud = RecordingCloud()
    runner = _cascade(cloud)
    client = client_for(make_app(runner.local, cascade=runner, response_store=store))
    try:
        first = await client.responses.create(model="auto:1", input="Hello.", max_output_tokens=2)
        second = await client.responses.create(
            model="auto:1",
            input="And then?",
            instructions=SECRET_INSTRUCTIONS,
            previous_response_id=first.id,
            max_output_tokens=2,
        )
        assert first.store is True and second.store is False
        assert second.model_extra["tandem"]["tier"] == "local"
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(second.id)
    finally:
        await runner.cloud.close()


# ------------------------------------------------------------------------------- bounds on what is stored


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"metadata": {"k" * 65: "v"}}, "metadata"),
        ({"metadata": {"note": "v" * 513}}, "metadata.note"),
        ({"user": "u" * 65}, "user"),
        (
            {"text": {"format": {"type": "json_schema", "name": "n" * 65, "schema": {"type": "object"}}}},
            "text.format.name",
        ),
    ],
)
async def test_what_openai_bounds_is_refused_naming_the_field(store, fields, param):
    client = client_for(make_app(FakeEngine(), response_store=store))
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="fake", input="Hi", **fields)
    assert refused.value.body["param"] == param and "Invalid" in refused.value.body["message"]
    assert await store.stored_bytes() == 0


async def test_metadata_at_openai_bounds_is_stored_and_echoed(store):
    client = client_for(make_app(FakeEngine(), response_store=store))
    metadata = {f"{i:02d}".ljust(64, "k"): "v" * 512 for i in range(16)}
    answered = await client.responses.create(model="fake", input="Hi", metadata=metadata, user="u" * 64)
    assert answered.store is True and (await client.responses.retrieve(answered.id)).metadata == metadata
    assert await store.stored_bytes() < 64 * 1024  # the largest metadata OpenAI takes: about 10 KB


async def test_one_stored_response_is_bounded(open_response_store):
    """Over responses_max_row_mb before the answer: a 400 naming `store` before anything runs (store: false
    is answered). An answer that takes the row over it: answered, whole or streamed, with store: false."""
    store = open_response_store(StoreSettings(max_row_mb=16 * 1024 / MB))
    engine = FakeEngine(words=["w" * 5000] * 4)  # a 20 KB answer
    client = client_for(make_app(engine, response_store=store))
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="fake", input="Hi", instructions="x" * 20_000)
    assert refused.value.body["param"] == "store" and "responses_max_row_mb" in refused.value.body["message"]
    assert engine.finished_ids == []  # refused before it ran
    unstored = await client.responses.create(model="fake", input="Hi", instructions="x" * 20_000, store=False)
    assert unstored.store is False and unstored.output_text
    whole = await client.responses.create(model="fake", input="Hi")
    streamed = await streamed_response(client, model="fake", input="Hi")
    for answered in (whole, streamed):
        assert answered.store is False and len(answered.output_text) == 20_000
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(answered.id)
    assert await store.stored_bytes() == 0


# -------------------------------------------------------------------------------------- a share per key


def stored(response_id: str, key: str | None, created_at: float, size: int = 30_000) -> StoredResponse:
    return StoredResponse(response_id, key, created_at, [{"role": "user", "content": "x" * size}], {"id": response_id})


async def check_shares(store) -> None:
    """Shared by both stores (a 0.5 MB store, 0.2 MB a key, 60 KB a row, retention never due): a key's puts
    trim its own oldest on the put that crosses its share, never another key's; a put into a full store
    deletes only its own key's older rows, and is not kept when they free too little."""
    now = time.time()
    others = [f"resp_b{i}" for i in range(6)]  # key b: 180 KB, under its share
    for i, response_id in enumerate(others):
        assert await store.put(stored(response_id, "b", now + i))
    for i in range(20):  # key a: 600 KB of puts against its 200 KB share
        assert await store.put(stored(f"resp_a{i}", "a", now + 10 + i))
        assert await store.stored_bytes("a", every_key=False) <= store.settings.max_bytes_per_key  # at every put
    assert await store.get("resp_a19", "a") is not None and await store.get("resp_a0", "a") is None
    assert all([await store.get(response_id, "b") is not None for response_id in others])  # b's untouched
    assert not await store.put(stored("resp_big", "a", now + 50, size=70_000))  # over one row's bound
    # Key c fills what is left of the whole store; then the store is full, and its next put frees its own oldest.
    for i in range(5):
        await store.put(stored(f"resp_c{i}", "c", now + 60 + i))
    assert await store.stored_bytes() <= store.settings.max_bytes
    assert all([await store.get(response_id, "b") is not None for response_id in others])
    # A key with nothing stored cannot make room in a full store: not kept, and nobody else's row goes.
    assert await store.stored_bytes() + 30_000 > store.settings.max_bytes
    assert not await store.put(stored("resp_d0", "d", now + 70)) and await store.get("resp_d0", "d") is None
    # c has older rows to give: its put is kept, and only c's oldest goes.
    assert await store.put(stored("resp_c5", "c", now + 71))
    assert await store.get("resp_c0", "c") is None and await store.get("resp_c1", "c") is not None
    # e's one small row frees too little for a large one: that is not kept, and e keeps what it had.
    assert await store.put(stored("resp_e0", "e", now + 72, size=10))
    assert not await store.put(stored("resp_e1", "e", now + 73)) and await store.get("resp_e0", "e") is not None
    assert all([await store.get(response_id, "b") is not None for response_id in others])
    assert await store.stored_bytes() <= store.settings.max_bytes


async def test_a_keys_puts_never_delete_another_keys_response(open_response_store):
    """The issue's case: one key storing far past the bound. Each put keeps the store within it (not a
    minute or 200 puts later), and what goes is that key's oldest, never the other key's response."""
    store = open_response_store(StoreSettings(retention_days=2, max_mb=0.5))
    now = time.time()
    await store.put(stored("resp_theirs", "b", now))
    for i in range(30):  # 900 KB from key a
        await store.put(stored(f"resp_{i}", "a", now + 1 + i))
        assert await store.stored_bytes() <= store.settings.max_bytes
    assert await store.get("resp_theirs", "b") is not None
    assert await store.get("resp_29", "a") is not None and await store.get("resp_0", "a") is None
    await store.close()


def shares() -> StoreSettings:
    return StoreSettings(retention_days=2, max_mb=0.5, max_mb_per_key=0.2, max_row_mb=0.06)


async def test_each_store_gives_each_key_its_share(open_response_store):
    await check_shares(open_response_store(shares()))
    reopened = open_response_store(shares())  # the counts survive a restart (a file opened again)
    assert await reopened.stored_bytes() <= shares().max_bytes and await reopened.get("resp_b0", "b") is not None


async def test_a_file_of_an_earlier_version_is_counted_when_opened(tmp_path):
    """A responses file without the per-key counts (an earlier version wrote it) gets them from its rows."""
    import sqlite3

    path = tmp_path / "r.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE responses (id TEXT PRIMARY KEY, key_fingerprint TEXT, created_at REAL NOT NULL, "
        "bytes INTEGER NOT NULL, conversation TEXT NOT NULL, response TEXT NOT NULL)"
    )
    conn.executemany(
        "INSERT INTO responses VALUES (?, ?, ?, ?, '[]', '{}')",
        [("resp_1", "a", time.time(), 1000), ("resp_2", "a", time.time(), 500), ("resp_3", None, time.time(), 7)],
    )
    conn.commit()
    conn.close()
    store = SQLiteResponseStore(path)
    assert await store.stored_bytes() == 1507 and await store.stored_bytes("a", every_key=False) == 1500
    assert await store.delete("resp_1", "a") and await store.stored_bytes("a", every_key=False) == 500
    await store.close()
