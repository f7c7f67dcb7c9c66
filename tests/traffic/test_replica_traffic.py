"""Two `tandem serve` processes on one state database (`--state-db`, docs/cloud-at-scale.md "More
than one replica"): both write one traffic record, feedback given to either replica labels an
answer the other one gave, and a router one replica swaps in is served by both (the
routers table of sdk.traffic.shared_routers, checked every second here)."""

from __future__ import annotations

import shutil
import time

import httpx
import openai
import psycopg
import pytest
from typer.testing import CliRunner

from router.prompt_router.scorer import load_scorer
from sdk.cli.app import app
from sdk.traffic.shared_routers import SharedRouters
from tests.conftest import running_server

pytestmark = pytest.mark.slow

KEY = "sk-tandem-replica-traffic-0123456789"
QUESTION = [{"role": "user", "content": "What is 2+2?"}]


def ask(url: str) -> str:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)
    return client.chat.completions.create(model="auto:0.5", messages=QUESTION, max_tokens=4, temperature=0).id


def rows(database: str, sql: str, params=()) -> list[tuple]:
    with psycopg.connect(database, options="-c search_path=tandem_traffic") as conn:
        return conn.execute(sql, params).fetchall()


def wait_for_rows(database: str, sql: str, params=(), timeout_s: float = 60.0) -> list[tuple]:
    deadline = time.monotonic() + timeout_s
    while not (found := rows(database, sql, params)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def test_two_serve_replicas_keep_one_record_and_serve_one_router(postgres_server, tmp_path):
    database = postgres_server.new_database()
    keys = tmp_path / "keys.txt"
    keys.write_text(KEY + "\n")

    def replica(name: str):
        env = {
            "TANDEM_STATE_DB": database,
            "TANDEM_TRAFFIC_RECORD": "1",
            "TANDEM_TRAFFIC_EMBED": "0",
            "TANDEM_TRAFFIC_RETRAIN": "1",
            "TANDEM_TRAFFIC_RETRAIN_CHECK_S": "1",
            "TANDEM_TRAFFIC_ROUTER_DIR": str(tmp_path / name / "routers"),
            "TANDEM_CASCADE_PROMPT_ROUTER": "default",
            "TANDEM_DATA_DIR": str(tmp_path / name),
        }
        args = ["serve", "--cloud", "none", "--threads", "1", "--api-key-file", str(keys)]
        return running_server(args, tmp_path / f"{name}.log", name=f"replica {name}", extra_env=env)

    with replica("a") as (_, first), replica("b") as (_, second):
        answered = {ask(first): first, ask(second): second}
        for response_id in answered:
            assert wait_for_rows(database, "SELECT 1 FROM requests WHERE id = %s", (response_id,)), response_id
        # Feedback on each answer goes to the replica that did not give it.
        for response_id, url in answered.items():
            other = second if url == first else first
            given = httpx.post(
                f"{other}/v1/feedback",
                json={"id": response_id, "score": 1.0},
                headers={"Authorization": f"Bearer {KEY}"},
                timeout=30,
            )
            assert given.status_code == 200 and given.json()["recorded"], given.text
        assert wait_for_rows(database, "SELECT 1 FROM labels WHERE source = 'feedback' HAVING count(*) = 2")

        # A router swapped in by one replica (stored as sdk.traffic.shared_routers does) is served by both.
        swapped = tmp_path / "router-shared.onnx"
        shutil.copyfile(load_scorer().path, swapped)
        SharedRouters(database, "test").publish(str(swapped), "a test swap")
        for name, url in (("a", first), ("b", second)):
            expected = str(tmp_path / name / "routers" / "router-shared.onnx")
            deadline = time.monotonic() + 60
            served_by = None
            while served_by != expected and time.monotonic() < deadline:
                response_id = ask(url)
                found = wait_for_rows(database, "SELECT router FROM requests WHERE id = %s", (response_id,))
                served_by = found[0][0] if found else None
            assert served_by == expected, f"replica {name} still scores with {served_by}"
            metrics = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).text
            assert 'tandem:router_retrains_total{outcome="adopted"} 1.0' in metrics

        stats = CliRunner().invoke(app, ["traffic", "stats", "--path", database])
        assert stats.exit_code == 0 and '"feedback": 2' in stats.output, stats.output
