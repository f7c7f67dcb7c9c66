"""feedback() of the SDK client (in-process over a runner with a traffic record) and of the
Android bridge: the same answers as POST /v1/feedback. Real local model (SmolLM2)."""

from __future__ import annotations

import json

import pytest

from local_runtime.async_engine import AsyncLocalEngine
from local_runtime.config import LocalEngineConfig
from sdk import AsyncClient
from sdk.cascade.runner import CascadeConfig, CascadeRunner
from sdk.protocol.engine import InvalidRequestError
from sdk.traffic.record import FeedbackError
from tests.traffic.helpers import open_record

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def local_engine():
    engine = AsyncLocalEngine(
        LocalEngineConfig(kv_cache_tokens=1024, max_num_seqs=2, max_model_len=512, n_threads=1)
    ).start()
    engine.wait_ready(180)
    yield engine
    engine.shutdown()


async def test_in_process_feedback(tmp_path, local_engine):
    runner = CascadeRunner(local_engine, None, CascadeConfig())
    client = AsyncClient(runner)
    reply = await client.chat.completions.create(model="auto", messages=QUESTION, max_tokens=6, temperature=0)
    with pytest.raises(FeedbackError) as off:
        await client.feedback(reply.id, score=1.0)
    assert off.value.status == 404 and "traffic record" in str(off.value)
    record = open_record(tmp_path / "t.sqlite3")
    runner = CascadeRunner(local_engine, None, CascadeConfig(), traffic=record)  # the same engine, now recording
    client = AsyncClient(runner)
    reply = await client.chat.completions.create(model="auto", messages=QUESTION, max_tokens=6, temperature=0)
    answer = await client.feedback(reply.id, thumbs="up")
    assert (answer.recorded, answer.tier, answer.score) == (True, "local", 1.0)
    with pytest.raises(FeedbackError) as unknown:
        await client.feedback("chatcmpl-never", score=0.5)
    assert unknown.value.status == 404
    with pytest.raises(InvalidRequestError) as bad:
        await client.feedback(reply.id, score=1.5)
    assert "score" in str(bad.value)
    with pytest.raises(InvalidRequestError):
        await client.feedback(reply.id, score=1.0, thumbs="up")
    record.flush()
    assert record.num_label_rows() == 1
    record.close()


def test_bridge_feedback(tmp_path):
    import android_bridge

    config = {
        "cloud": {"url": "none"},
        "local": {"kv_cache_tokens": 1024, "max_num_seqs": 2, "threads": 1},
        "traffic": {"record": True, "path": str(tmp_path / "bridge.sqlite3"), "embed": False},
    }
    started = json.loads(android_bridge.start(json.dumps(config)))
    assert started.get("ok"), started
    try:
        reply = json.loads(android_bridge.chat(json.dumps({"messages": QUESTION, "max_tokens": 6, "temperature": 0})))
        answer = json.loads(android_bridge.feedback(json.dumps({"id": reply["id"], "thumbs": "down"})))
        assert answer == {"object": "feedback", "id": reply["id"], "score": 0.0, "recorded": True, "tier": "local"}
        unknown = json.loads(android_bridge.feedback(json.dumps({"id": "chatcmpl-never", "score": 1})))
        assert unknown["error"]["code"] == "response_not_found" and unknown["error"]["status"] == 404
        bad = json.loads(android_bridge.feedback(json.dumps({"id": reply["id"], "score": 1, "note": "x"})))
        assert bad["error"]["status"] == 400 and bad["error"]["param"] == "note"
    finally:
        android_bridge.stop()
    assert json.loads(android_bridge.feedback("{}"))["error"]["code"] == "not_started"
