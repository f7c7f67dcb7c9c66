"""The learning loop through a real `tandem serve` (embedded SmolLM2 on the device, the embedded
cloud engine behind it, two API keys): routed answers land in the traffic record with their
key and without their text, POST /v1/feedback answers 404 / 403 / 429 as documented and
replaces a repeated verdict, privacy-flagged requests leave only a counter, and shadow
sampling labels local answers in the background, with /metrics counting all of it."""

from __future__ import annotations

import sqlite3
import time

import httpx
import openai
import pytest

from sdk.serving.api_keys import key_fingerprint
from tests.conftest import running_server

pytestmark = pytest.mark.slow

KEY_A, KEY_B, KEY_C = (
    "sk-tandem-traffic-a-0123456789",
    "sk-tandem-traffic-b-0123456789",
    "sk-tandem-traffic-c-0123456789",
)
QUESTION = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("traffic-serve")
    keys = scratch / "keys.txt"
    keys.write_text(f"{KEY_A}\n{KEY_B}\n{KEY_C}\n")
    db = scratch / "traffic.sqlite3"
    env = {
        "TANDEM_TRAFFIC_RECORD": "1",
        "TANDEM_TRAFFIC_PATH": str(db),
        "TANDEM_TRAFFIC_EMBED": "0",
        "TANDEM_TRAFFIC_SHADOW_FRACTION": "1",
        "TANDEM_TRAFFIC_FEEDBACK_PER_MINUTE": "6",
        "TANDEM_CASCADE_PROMPT_ROUTER": "default",
    }
    with running_server(["serve", "--api-key-file", str(keys)], scratch / "server.log", extra_env=env) as (_, url):
        yield url, db


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


def feedback(url: str, key: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/feedback", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def wait_for(db, query: str, args=(), timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        conn = sqlite3.connect(db)
        try:
            rows = conn.execute(query, args).fetchall()
        except sqlite3.OperationalError:
            rows = []
        finally:
            conn.close()
        if rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def test_answers_are_recorded_with_their_key_and_no_text(served):
    url, db = served
    reply = client(url, KEY_A).chat.completions.create(model="auto:0", messages=QUESTION, max_tokens=8, temperature=0)
    rows = wait_for(
        db,
        "SELECT key_fingerprint, tier, model, router_score, prompt_text, shape IS NOT NULL, signals "
        "FROM requests WHERE id = ?",
        (reply.id,),
    )
    assert rows, "the answer was never recorded"
    fingerprint, tier, model, router_score, text, has_shape, signals = rows[0]
    assert (fingerprint, tier, model, text, has_shape) == (key_fingerprint(KEY_A), "local", "auto:0", None, 1)
    assert 0.0 <= router_score <= 1.0 and '"mean_prob"' in signals  # the prompt router ran; the local answer's signals


def test_feedback_is_owned_idempotent_and_rate_limited(served):
    url, db = served
    reply = client(url, KEY_A).chat.completions.create(model="local", messages=QUESTION, max_tokens=6, temperature=0)
    ok = feedback(url, KEY_A, {"id": reply.id, "thumbs": "down"})
    assert ok.status_code == 200, ok.text
    assert ok.json() == {"object": "feedback", "id": reply.id, "score": 0.0, "recorded": True, "tier": "local"}
    assert (
        feedback(url, KEY_A, {"id": reply.id, "score": 0.75}).status_code == 200
    )  # a second verdict replaces the first
    labels = wait_for(
        db, "SELECT weak FROM labels WHERE response_id = ? AND source = 'feedback' AND weak = 0.75", (reply.id,)
    )
    assert (
        labels == [(0.75,)]
        and len(wait_for(db, "SELECT 1 FROM labels WHERE response_id = ? AND source = 'feedback'", (reply.id,))) == 1
    )
    other = feedback(url, KEY_B, {"id": reply.id, "score": 1})
    assert (
        other.status_code == 403
        and other.json()["error"]["code"] == "permission_denied"
        and other.json()["error"]["param"] == "id"
    )
    unknown = feedback(url, KEY_A, {"id": "chatcmpl-never", "score": 1})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "response_not_found"
    for bad, param in (
        ({"id": reply.id}, None),
        ({"id": reply.id, "score": 2}, None),
        ({"id": reply.id, "score": 1, "tag": 1}, "tag"),
    ):
        refused = feedback(url, KEY_A, bad)
        assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error"
        if param:
            assert refused.json()["error"]["param"] == param
    statuses = [feedback(url, KEY_B, {"id": "chatcmpl-never", "score": 1}).status_code for _ in range(10)]
    assert statuses[-1] == 429 and set(statuses) == {404, 429}  # 6 a minute per key (the 403 above took one)
    limited = feedback(url, KEY_B, {"id": reply.id, "score": 1})
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
    assert feedback(url, KEY_A, {"id": reply.id, "score": 1}).status_code == 200  # another key's budget is its own


def test_privacy_flagged_requests_leave_only_a_counter(served):
    url, db = served
    email = [{"role": "user", "content": "Draft a note to jane.doe@example.com about the merger."}]
    flagged = client(url, KEY_A).chat.completions.create(model="auto", messages=email, max_tokens=4)
    private = client(url, KEY_A).chat.completions.create(
        model="auto", messages=QUESTION, max_tokens=4, extra_body={"private": True}
    )
    assert wait_for(db, "SELECT value FROM counters WHERE name = 'privacy_flagged' AND value >= 2")
    assert not wait_for(db, "SELECT 1 FROM requests WHERE id IN (?, ?)", (flagged.id, private.id), timeout_s=2)
    answer = feedback(url, KEY_A, {"id": private.id, "thumbs": "up"})
    assert answer.status_code == 200 and answer.json()["recorded"] is False and answer.json()["reason"] == "privacy"
    assert b"jane.doe" not in db.read_bytes()


def test_shadow_samples_label_local_answers(served):
    url, db = served
    reply = client(url, KEY_A).chat.completions.create(
        model="local", messages=[{"role": "user", "content": "What is 3+4?"}], max_tokens=12, temperature=0
    )
    labels = wait_for(
        db,
        "SELECT weak, strong, detail FROM labels WHERE response_id = ? AND source = 'shadow'",
        (reply.id,),
        timeout_s=120,
    )
    assert labels, "no shadow judgment arrived"
    weak, strong, detail = labels[0]
    assert weak in (0.0, 1.0) and strong is None and detail == "exact_match"
    metrics = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY_A}"}).text
    assert 'tandem:shadow_samples_total{outcome="judged"}' in metrics and "tandem:traffic_rows_total" in metrics
    assert 'tandem:traffic_rows_total{outcome="privacy_flagged"}' in metrics


def test_the_sdk_client_sends_feedback_over_http(served):
    from sdk import Client
    from sdk.traffic.record import FeedbackError

    url, _ = served
    with Client(base_url=f"{url}/v1", api_key=KEY_C) as sdk_client:
        reply = sdk_client.chat.completions.create(model="local", messages=QUESTION, max_tokens=4)
        answer = sdk_client.feedback(reply.id, thumbs="up")
        assert (answer.recorded, answer.tier, answer.score) == (True, "local", 1.0)
        with pytest.raises(FeedbackError) as unknown:
            sdk_client.feedback("chatcmpl-never", score=1.0)
        assert unknown.value.status == 404


def test_a_responses_answer_is_recorded_takes_feedback_and_is_its_keys_alone(served):
    """POST /v1/responses on a routed model: the record keeps it under its resp_ id, feedback takes that id,
    and its stored response is a 404 for another key."""
    url, db = served
    reply = client(url, KEY_C).responses.create(model="auto:0", input="What is 2+2?", max_output_tokens=8)
    assert reply.id.startswith("resp_") and reply.store and reply.model_extra["tandem"]["tier"] == "local"
    assert wait_for(db, "SELECT tier FROM requests WHERE id = ?", (reply.id,)) == [("local",)]
    ok = feedback(url, KEY_C, {"id": reply.id, "score": 1})
    assert ok.status_code == 200 and ok.json()["recorded"], ok.text
    with pytest.raises(openai.NotFoundError):
        client(url, KEY_A).responses.retrieve(reply.id)
    with pytest.raises(openai.NotFoundError):
        client(url, KEY_A).responses.create(model="auto", input="And?", previous_response_id=reply.id)
    assert client(url, KEY_C).responses.retrieve(reply.id).output_text == reply.output_text


def test_router_train_reads_the_record_the_server_wrote(served, tmp_path):
    """`tandem router train --from-traffic` on this server's own file (written live, still open)."""
    from typer.testing import CliRunner

    from sdk.cli.app import app

    url, db = served
    out = tmp_path / "from-traffic.onnx"
    result = CliRunner().invoke(app, ["router", "train", "--from-traffic", str(db), "--out", str(out)])
    assert result.exit_code == 0, result.output
    # embed = 0 here and exact-match shadows judge the local tier only: the head keeps the shipped
    # statistics and there is no topic correction, and saying so is the point.
    assert "0 with both tiers judged" in result.output and "too few embedded prompts" in result.output
    from router.prompt_router.scorer import load_scorer

    assert load_scorer(out).metadata["topic_correction"] is None
