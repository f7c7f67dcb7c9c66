"""Tenants by full-width ids (issue 66): a key's id is the whole SHA-256 of the key, so two keys whose
hashes share their first 8 hex digits (the fingerprints of earlier versions) share no stored response
and no budget; budgets.toml names a key by its id or a prefix of at least 16 digits; and the rows
earlier versions kept under 8-digit owners move to the full id of the configured key they came from
at start (SQLite files and the state database), the rest staying unowned."""

from __future__ import annotations

import functools
import hashlib
import sqlite3
import time

import httpx
import openai
import pytest

from sdk.budgets.config import BudgetConfigError, parse_budgets
from sdk.budgets.ledger import SpendLedger, key_scope, user_scope
from sdk.budgets.manager import BudgetManager
from tests.app_helpers import make_app
from sdk.response_store.sqlite_store import SQLiteResponseStore
from sdk.serving.api_keys import key_fingerprint
from tests.sdk.test_openai_server import FakeEngine
from tests.sdk.test_stored_responses import client_for


@functools.cache
def colliding_keys() -> tuple[str, str]:
    """Two keys whose SHA-256s share their first 8 hex digits (about 80k tries: the birthday bound of 32 bits)."""
    seen: dict[str, str] = {}
    for i in range(2_000_000):
        key = f"sk-collide-{i}"
        head = hashlib.sha256(key.encode()).hexdigest()[:8]
        if head in seen:
            return seen[head], key
        seen[head] = key
    raise AssertionError("no collision found")


def test_a_key_id_is_the_whole_sha256_of_the_key():
    assert key_fingerprint("sk-a") == hashlib.sha256(b"sk-a").hexdigest() and len(key_fingerprint("sk-a")) == 64


async def test_keys_that_share_eight_digits_share_no_response_and_no_budget(tmp_path):
    one, two = colliding_keys()
    assert key_fingerprint(one)[:8] == key_fingerprint(two)[:8]
    store = SQLiteResponseStore(tmp_path / "responses.sqlite3")
    (tmp_path / "budgets.toml").write_text("[default]\nusd_per_day = 1.0\n")
    ledger = SpendLedger(tmp_path / "spend.sqlite3").start()
    budgets = BudgetManager(str(tmp_path / "budgets.toml"), ledger, prices_are_zero=False)
    app = make_app(FakeEngine(), api_keys={one, two}, response_store=store, budgets=budgets)
    mine, theirs = client_for(app, one), client_for(app, two)
    made = await mine.responses.create(model="fake", input="Hi")
    with pytest.raises(openai.NotFoundError):
        await theirs.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        await theirs.responses.create(model="fake", input="x", previous_response_id=made.id)
    with pytest.raises(openai.NotFoundError):
        await theirs.responses.delete(made.id)
    assert (await mine.responses.retrieve(made.id)).id == made.id
    budgets.record(key_fingerprint(one), None, usd=0.75, cloud_tokens=10, total_tokens=10)
    await ledger.settled()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        status = (await http.get("/v1/budget", headers={"Authorization": f"Bearer {two}"})).json()
    assert status["key_fingerprint"] == key_fingerprint(two)
    assert status["scopes"][0]["limits"][0]["spent"] == 0.0  # the other key's spend is not this one's
    await store.close()
    ledger.close()


# ------------------------------------------------------------------------------------------- budgets.toml


def test_budgets_name_a_key_by_its_id_or_a_prefix_of_16_digits():
    one, two = colliding_keys()
    full, other = key_fingerprint(one), key_fingerprint(two)
    config = parse_budgets(
        {"default": {"usd_per_day": 1.0}, "keys": {full[:16]: {"usd_per_day": 2.0}, other: {"usd_per_day": 3.0}}}
    )
    assert config.for_key(full).limits[0].value == 2.0 and config.for_key(other).limits[0].value == 3.0
    assert config.for_key(key_fingerprint("sk-else")).limits[0].value == 1.0 and config.for_key(None) == config.default
    upper = parse_budgets({"keys": {full[:20].upper(): {"usd_per_day": 4.0}}})  # hex in either case
    assert upper.for_key(full).limits[0].value == 4.0


@pytest.mark.parametrize(
    ("entries", "named"),
    [
        (lambda full: [full[:8]], "8 hex digits"),  # an id of an earlier version: could name several keys
        (lambda full: [full[:15]], "15 hex digits"),
        (lambda full: ["not-a-key-id-at-all"], "hex digits"),
        (lambda full: [full + "0"], "hex digits"),
        (lambda full: [full[:16], full], "would both be"),  # two entries for one key
        (lambda full: [full[:16], full[:24].upper()], "would both be"),
    ],
)
def test_budgets_refuse_short_or_ambiguous_key_ids_naming_them(entries, named):
    full = key_fingerprint("sk-budget")
    names = entries(full)
    with pytest.raises(BudgetConfigError, match=named) as refused:
        parse_budgets({"keys": {name: {"usd_per_day": 1.0} for name in names}}, "budgets.toml")
    assert f"keys.{names[0].lower() if len(names) > 1 else names[0]}" in str(refused.value)


# ------------------------------------------------------------------------------------- the old rows moved


OLD_RESPONSES = (
    "CREATE TABLE responses (id TEXT PRIMARY KEY, key_fingerprint TEXT, created_at REAL NOT NULL, "
    "bytes INTEGER NOT NULL, conversation TEXT NOT NULL, response TEXT NOT NULL)"
)
OLD_SPEND = (
    "CREATE TABLE spend (scope TEXT NOT NULL, period TEXT NOT NULL, usd REAL NOT NULL, cloud_tokens INTEGER NOT NULL, "
    "total_tokens INTEGER NOT NULL, requests INTEGER NOT NULL, PRIMARY KEY (scope, period))"
)


def keys_of_earlier_rows() -> dict[str, str]:
    """The configured keys (mine, and the colliding two), and one key no longer configured."""
    one, two = colliding_keys()
    return {"mine": "sk-mine-0123456789", "one": one, "two": two, "gone": "sk-removed-0123456789"}


def old(key: str) -> str:
    return key_fingerprint(key)[:8]


def write_earlier_files(tmp_path) -> dict[str, str]:
    """responses, spend and the traffic record as an earlier version left them: owners of 8 digits."""
    from sdk.traffic import store as traffic_store

    keys = keys_of_earlier_rows()
    now = time.time()
    day = f"day:{time.strftime('%Y-%m-%d', time.gmtime(now))}"
    responses = sqlite3.connect(tmp_path / "responses.sqlite3")
    responses.execute(OLD_RESPONSES)
    rows = [
        (f"resp_{name}", old(key), now, 100, '[{"role":"user","content":"hi"}]', f'{{"id":"resp_{name}"}}')
        for name, key in keys.items()
    ]
    responses.executemany("INSERT INTO responses VALUES (?, ?, ?, ?, ?, ?)", rows)
    responses.commit()
    responses.close()
    spend = sqlite3.connect(tmp_path / "spend.sqlite3")
    spend.execute(OLD_SPEND)
    mine = keys["mine"]
    spend.executemany(
        "INSERT INTO spend VALUES (?, ?, ?, ?, ?, ?)",
        [
            (key_scope(old(mine)), day, 0.25, 10, 20, 2),
            (key_scope(key_fingerprint(mine)), day, 0.5, 5, 5, 1),  # spent since under the full id: added up
            (user_scope(old(mine), "ana:x"), day, 0.125, 1, 1, 1),
            (key_scope(old(keys["gone"])), day, 9.0, 1, 1, 1),
        ],
    )
    spend.commit()
    spend.close()
    traffic = traffic_store.connect(tmp_path / "traffic.sqlite3")
    for name, key in keys.items():
        traffic_store.insert_request(
            traffic,
            {"id": f"chatcmpl-{name}", "created_at": now, "key_fingerprint": old(key), "model": "auto"}
            | {"tier": "local", "escalated": 0, "reason": "confident"},
        )
    traffic.close()
    return {name: key_fingerprint(key) for name, key in keys.items()}


def owners(path, table: str) -> dict[str, str]:
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute(f"SELECT id, key_fingerprint FROM {table}").fetchall())
    finally:
        conn.close()


async def test_rows_of_earlier_versions_move_to_the_full_id_of_their_key(tmp_path, monkeypatch):
    from sdk.owner_migration import migrate_owners_at_start
    from sdk.settings.server_sections import ListenerConfig
    from sdk.traffic.config import TrafficSettings

    ids = write_earlier_files(tmp_path)
    keys = keys_of_earlier_rows()
    configured = [keys["mine"], keys["one"], keys["two"]]
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path))  # the defaults: what `tandem serve` opens there
    await migrate_owners_at_start(ListenerConfig(), configured, None, TrafficSettings(record=True))
    responses = owners(tmp_path / "responses.sqlite3", "responses")
    assert responses["resp_mine"] == ids["mine"]
    # A key no longer configured, and two keys whose 8 digits collide: left as they were (no key's id).
    assert responses["resp_gone"] == ids["gone"][:8]
    assert responses["resp_one"] == responses["resp_two"] == ids["one"][:8]
    traffic = owners(tmp_path / "traffic.sqlite3", "requests")
    assert traffic["chatcmpl-mine"] == ids["mine"] and traffic["chatcmpl-gone"] == ids["gone"][:8]
    ledger = SpendLedger(tmp_path / "spend.sqlite3").start()
    spent = ledger.spend(key_scope(ids["mine"]), "day")
    assert (spent.usd, spent.cloud_tokens, spent.total_tokens, spent.requests) == (0.75, 15, 25, 3)
    assert ledger.spend(user_scope(ids["mine"], "ana:x"), "day").usd == 0.125
    assert ledger.spend(key_scope(ids["mine"][:8]), "day").usd == 0.0
    assert ledger.spend(key_scope(ids["gone"][:8]), "day").usd == 9.0  # counts against no key
    ledger.close()
    # The moved response answers its key over HTTP; the ambiguous one answers neither of the two.
    store = SQLiteResponseStore(tmp_path / "responses.sqlite3")
    app = make_app(FakeEngine(), api_keys=set(configured), response_store=store)
    assert (await client_for(app, keys["mine"]).responses.retrieve("resp_mine")).id == "resp_mine"
    for key in (keys["one"], keys["two"]):
        with pytest.raises(openai.NotFoundError):
            await client_for(app, key).responses.retrieve(f"resp_{'one' if key == keys['one'] else 'two'}")
    assert await store.stored_bytes(ids["mine"], every_key=False) == 100  # its share counts the moved row
    await store.close()
    # A second start moves nothing more.
    from sdk.owner_migration import migrate_owners, owner_files

    assert await migrate_owners(configured, owner_files(ListenerConfig(), TrafficSettings(record=True))) == {}


async def test_rows_of_earlier_versions_move_in_the_state_database(state_db):
    from sdk.owner_migration import migrate_owners
    from sdk.response_store.postgres_store import PostgresResponseStore

    keys = keys_of_earlier_rows()
    ids = {name: key_fingerprint(key) for name, key in keys.items()}
    now = time.time()
    for name in keys:
        await state_db.call(
            "INSERT INTO tandem_responses VALUES (%s, %s, %s, 100, '[]', %s)",
            (f"resp_{name}", ids[name][:8], now, f'{{"id":"resp_{name}"}}'),
        )
        await state_db.call(
            "INSERT INTO tandem_traffic.requests (id, created_at, key_fingerprint, model, tier, escalated, reason) "
            "VALUES (%s, %s, %s, 'auto', 'local', 0, 'confident')",
            (f"chatcmpl-{name}", now, ids[name][:8]),
        )
    for scope, usd in (
        (key_scope(ids["mine"][:8]), 0.25),
        (key_scope(ids["mine"]), 0.5),
        (user_scope(ids["mine"][:8], "ana"), 0.125),
    ):
        await state_db.call("INSERT INTO tandem_spend VALUES (%s, 'day:x', %s, 1, 1, 1)", (scope, usd))
    await state_db.call(
        "INSERT INTO tandem_reservations (id, replica, scope, period, usd) VALUES (7, 'r', %s, 'day:x', 0.1)",
        (key_scope(ids["mine"][:8]),),
    )
    moved = await migrate_owners([keys["mine"], keys["one"], keys["two"]], [], state_db)
    assert moved and await migrate_owners([keys["mine"]], [], state_db) == {}  # once
    rows = dict(await state_db.call("SELECT id, key_fingerprint FROM tandem_responses"))
    assert rows["resp_mine"] == ids["mine"] and rows["resp_gone"] == ids["gone"][:8]
    assert rows["resp_one"] == ids["one"][:8] == ids["two"][:8]
    traffic = dict(await state_db.call("SELECT id, key_fingerprint FROM tandem_traffic.requests"))
    assert traffic["chatcmpl-mine"] == ids["mine"] and traffic["chatcmpl-two"] == ids["two"][:8]
    spend = dict(await state_db.call("SELECT scope, usd FROM tandem_spend"))
    assert spend == {key_scope(ids["mine"]): 0.75, user_scope(ids["mine"], "ana"): 0.125}
    assert await state_db.call("SELECT scope FROM tandem_reservations") == [(key_scope(ids["mine"]),)]
    store = PostgresResponseStore(state_db)
    assert await store.stored_bytes(ids["mine"], every_key=False) == 100  # the per-key count followed the row
    assert (await store.get("resp_mine", ids["mine"])).id == "resp_mine"


def test_the_traffic_record_is_purged_by_the_id_prefix_the_server_logs(tmp_path):
    from sdk.serving.api_keys import loggable_id
    from sdk.traffic import store as traffic_store

    conn = traffic_store.connect(tmp_path / "traffic.sqlite3")
    for name, owner in (
        ("mine", key_fingerprint("sk-mine")),
        ("theirs", key_fingerprint("sk-theirs")),
        ("old", "0a1b2c3d"),
    ):
        traffic_store.insert_request(
            conn,
            {"id": name, "created_at": time.time(), "key_fingerprint": owner, "model": "auto"}
            | {"tier": "local", "escalated": 0, "reason": "confident"},
        )
    assert traffic_store.purge(conn, key_fingerprint=loggable_id(key_fingerprint("sk-mine"))) == 1
    assert traffic_store.purge(conn, key_fingerprint="0a1b2c3d") == 1  # an unowned row of an earlier version
    assert [row[0] for row in conn.execute("SELECT id FROM requests")] == ["theirs"]
    conn.close()


async def test_the_server_moves_them_at_start_before_its_stores_open(tmp_path, monkeypatch):
    """`tandem serve`'s start (sdk.assembly.cascade.start_cascade), with the keys of its key file: the spend
    ledger it opens already reads the moved spend under the full id."""
    from sdk.assembly.cascade import start_cascade
    from sdk.settings.loading import load_settings
    from sdk.settings.serve_config import ServeConfig

    ids = write_earlier_files(tmp_path)
    keys = keys_of_earlier_rows()
    (tmp_path / "keys.txt").write_text(f"{keys['mine']}\n{keys['one']}\n")
    (tmp_path / "budgets.toml").write_text("[default]\ncloud_share_per_day = 1.0\n")
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path))  # the default paths the server opens
    cli = {"cloud.url": "none", "server.api_key_file": str(tmp_path / "keys.txt")}
    cli["server.budgets_file"] = str(tmp_path / "budgets.toml")
    config = ServeConfig.from_settings(load_settings(None, env={"TANDEM_DATA_DIR": str(tmp_path)}, cli=cli))
    cascade = await start_cascade(config, FakeEngine())
    try:
        assert (await cascade.budgets.ledger.current(key_scope(ids["mine"]), "day")).usd == 0.75
    finally:
        await cascade.close()
    assert owners(tmp_path / "responses.sqlite3", "responses")["resp_mine"] == ids["mine"]
    assert owners(tmp_path / "traffic.sqlite3", "requests")["chatcmpl-mine"] == ids["mine"]
