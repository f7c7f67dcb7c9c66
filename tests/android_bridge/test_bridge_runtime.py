"""android_bridge end to end on the real runtime: the embedded SmolLM2 on the device tier and
the embedded PyTorch cloud engine, driven the way a Kotlin app drives it through Chaquopy,
with Python objects standing in for the Java callback objects."""

from __future__ import annotations

import json
import threading
import time

import pytest

import android_bridge as bridge
from tests.android_bridge.test_bridge_contract import error_of

pytestmark = pytest.mark.slow

# batch_invariant: the tests compare a stream with the same request answered whole, and
# concurrent streams with each run alone, which only that mode promises (prompt cache off).
LOCAL = {"threads": 1, "max_model_len": 512, "kv_cache_tokens": 2048, "max_num_seqs": 8, "batch_invariant": True}
QUESTION = [{"role": "user", "content": "Name three colors."}]
LONG = [{"role": "user", "content": "Write a long story about a dragon who learns to cook."}]


def request(messages=QUESTION, **fields) -> str:
    return json.dumps({"messages": messages, "temperature": 0, "max_tokens": 12, **fields})


class RecordingCallback:
    """What an app's callback object sees; `block_first_token` holds on_token until released."""

    def __init__(
        self, block_first_token: threading.Event | None = None, on_first_token=None, raise_in_token: bool = False
    ):
        self.events: list[tuple[str, dict]] = []
        self.threads: set[str] = set()
        self.finished = threading.Event()
        self._block, self._on_first, self._raise = block_first_token, on_first_token, raise_in_token

    def on_token(self, payload: str) -> None:
        self._record("token", payload)
        if len(self.events) == 1:
            if self._block is not None:
                self._block.wait(30)
            if self._on_first is not None:
                self._on_first()
        if self._raise:
            raise RuntimeError("the app's callback broke")

    def on_done(self, payload: str) -> None:
        self._record("done", payload)
        self.finished.set()

    def on_error(self, payload: str) -> None:
        self._record("error", payload)
        self.finished.set()

    def _record(self, kind: str, payload: str) -> None:
        assert isinstance(payload, str)
        self.events.append((kind, json.loads(payload)))
        self.threads.add(threading.current_thread().name)

    def wait(self, timeout: float = 60) -> tuple[str, dict]:
        assert self.finished.wait(timeout), f"no terminal callback within {timeout} s: {self.events[-3:]}"
        time.sleep(0.05)  # anything delivered after the terminal call would show up here
        terminal = [e for e in self.events if e[0] != "token"]
        assert len(terminal) == 1 and self.events[-1] is terminal[0], "exactly one terminal callback, and last"
        return terminal[0]

    @property
    def text(self) -> str:
        return "".join(e[1]["choices"][0]["delta"].get("content", "") for e in self.events if e[0] == "token")


def start(config: dict) -> dict:
    reply = json.loads(bridge.start(json.dumps(config)))
    assert reply.get("ok"), reply
    return reply["status"]


def wait_idle(timeout: float = 20) -> dict:
    """The status once nothing runs and no KV block is held (aborts land on the engine's next step)."""
    deadline = time.monotonic() + timeout
    while True:
        status = json.loads(bridge.status())
        if status["engine"] == {"running": 0, "waiting": 0} and status["kv_cache"]["blocks_used"] == 0:
            return status
        assert time.monotonic() < deadline, f"the runtime did not go idle: {status}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def runtime():
    status = start({"local": LOCAL, "cloud": {"url": "embedded", "kv_cache_gb": 0.05, "max_model_len": 512}})
    assert status["state"] == "ready" and status["model_loaded"] and status["kv_cache"]["blocks_used"] == 0
    yield status
    bridge.stop()


def test_start_twice_is_refused(runtime):
    assert error_of(bridge.start("{}"))["code"] == "already_started"


def test_chat_answers_with_openai_shape_and_routing(runtime):
    reply = json.loads(bridge.chat(request(model="local")))
    assert reply["object"] == "chat.completion" and reply["choices"][0]["message"]["content"]
    assert reply["usage"]["completion_tokens"] == reply["tandem"]["cost"]["local"]["completion_tokens"] > 0
    assert (reply["tandem"]["tier"], reply["tandem"]["escalated"]) == ("local", False)


def test_chat_reaches_the_cloud_tier_and_keeps_private_requests_local(runtime):
    cloud = json.loads(bridge.chat(request(model="auto:1")))
    assert (cloud["tandem"]["tier"], cloud["tandem"]["escalated"]) == ("cloud", True)
    private = json.loads(bridge.chat(request(model="auto:1", private=True)))
    assert (private["tandem"]["tier"], private["tandem"]["privacy_reasons"]) == ("local", ["private_flag"])


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 5}, "temperature"),
        ({"max_tokens": "ten"}, "max_tokens"),
        ({"model": "gpt-9"}, "model"),
        ({"n": 2}, "n"),
        ({"messages": []}, "messages"),
        ({"request_id": 5}, "request_id"),
        ({"timeout_s": -1}, "timeout_s"),
    ],
)
def test_invalid_requests_are_400s_naming_the_param(runtime, fields, param):
    error = error_of(bridge.chat(request(**fields)))
    assert (error["status"], error["param"]) == (400, param)
    if param != "timeout_s":  # a chat() option; streams have cancel instead
        callback = RecordingCallback()  # refused by the call itself, as HTTP answers 400 before any event
        assert error_of(bridge.chat_stream(request(**fields), callback)) == error
        time.sleep(0.05)
        assert callback.events == []


def test_a_context_overflow_is_a_400_with_openais_code(runtime):
    error = error_of(bridge.chat(request(messages=[{"role": "user", "content": "word " * 2000}])))
    assert (error["status"], error["code"]) == (400, "context_length_exceeded")


def test_stream_returns_at_once_and_delivers_on_its_own_thread(runtime):
    release = threading.Event()
    callback = RecordingCallback(block_first_token=release)
    reply = json.loads(bridge.chat_stream(request(), callback))  # returns although on_token is blocked
    assert set(reply) == {"id"} and not callback.finished.is_set()
    release.set()
    kind, done = callback.wait()
    assert kind == "done" and done["id"] == reply["id"] and done["object"] == "chat.completion"
    assert callback.text == done["choices"][0]["message"]["content"]
    assert threading.current_thread().name not in callback.threads and len(callback.threads) == 1
    whole = json.loads(bridge.chat(request()))
    assert done["choices"][0]["message"]["content"] == whole["choices"][0]["message"]["content"]  # greedy: the same
    assert done["usage"] == whole["usage"] and done["tandem"]["tier"] == whole["tandem"]["tier"]


def test_concurrent_streams_from_several_threads_each_get_their_own_answer(runtime):
    prompts = [[{"role": "user", "content": f"Count from {i} to {i + 5}."}] for i in range(6)]
    expected = [json.loads(bridge.chat(request(p, model="local")))["choices"][0]["message"]["content"] for p in prompts]
    callbacks = [RecordingCallback() for _ in prompts]
    ids: list[str] = [""] * len(prompts)

    def launch(i: int) -> None:
        ids[i] = json.loads(bridge.chat_stream(request(prompts[i], model="local"), callbacks[i]))["id"]

    threads = [threading.Thread(target=launch, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(ids)) == len(prompts)
    for i, callback in enumerate(callbacks):
        kind, done = callback.wait()
        assert kind == "done" and done["id"] == ids[i]
        assert callback.text == done["choices"][0]["message"]["content"] == expected[i]
    wait_idle()


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
        },
    },
}


def test_tools_and_response_format_pass_through_the_json_api(runtime):
    ask = [{"role": "user", "content": "What's the weather like in Paris?"}]
    body = request(ask, model="local", max_tokens=60, tools=[WEATHER], tool_choice="required")
    whole = json.loads(bridge.chat(body))
    (call,) = whole["choices"][0]["message"]["tool_calls"]
    assert whole["choices"][0]["finish_reason"] == "tool_calls" and call["function"]["name"] == "get_weather"
    callback = RecordingCallback()
    bridge.chat_stream(body, callback)
    kind, done = callback.wait()
    streamed = [e[1]["choices"][0]["delta"]["tool_calls"] for e in callback.events if e[0] == "token"]
    assert kind == "done" and streamed and streamed[0][0]["function"] == call["function"]  # greedy: the same call
    assert done["choices"][0]["message"]["tool_calls"][0]["function"] == call["function"]
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
    answer = json.loads(
        bridge.chat(
            request(
                ask,
                model="local",
                max_tokens=40,
                response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
            )
        )
    )
    assert isinstance(json.loads(answer["choices"][0]["message"]["content"])["city"], str)
    wait_idle()


def test_cancel_mid_stream_ends_it_with_one_cancelled_error_and_frees_its_blocks(runtime):
    holder: dict = {}
    callback = RecordingCallback(on_first_token=lambda: holder.update(reply=json.loads(bridge.cancel(holder["id"]))))
    # model "local": under "auto" the cascade's defaults (restart hand-off, tokens held until the
    # router decides, decide_at every_token) hold a confident answer back to its end, so the first
    # on_token came after the stream had finished and the cancel found nothing in flight (a CI
    # flake). ignore_eos: the story cannot end before the cancel arrives.
    body = request(LONG, model="local", max_tokens=400, temperature=0.8, ignore_eos=True)
    holder["id"] = json.loads(bridge.chat_stream(body, callback))["id"]
    kind, error = callback.wait()
    assert holder["reply"] == {"ok": True, "id": holder["id"]}, (kind, error.get("usage"), len(callback.events))
    assert (kind, error["error"]["code"], error["id"]) == ("error", "cancelled", holder["id"])
    assert len([e for e in callback.events if e[0] == "token"]) < 100
    wait_idle()
    assert error_of(bridge.cancel(holder["id"]))["code"] == "request_not_found"


def test_a_blocking_chat_can_be_cancelled_from_another_thread(runtime):
    replies: list[dict] = []
    worker = threading.Thread(
        target=lambda: replies.append(
            json.loads(
                bridge.chat(request(LONG, max_tokens=400, temperature=0.8, ignore_eos=True, request_id="app-chat-1"))
            )
        )
    )
    worker.start()
    deadline = time.monotonic() + 30
    while "error" in json.loads(bridge.cancel("app-chat-1")):  # until the chat is in flight
        assert time.monotonic() < deadline
        time.sleep(0.02)
    worker.join(30)
    assert replies[0]["error"]["code"] == "cancelled"
    wait_idle()


def test_a_chat_timeout_is_an_error_and_frees_the_request(runtime):
    error = error_of(bridge.chat(request(LONG, max_tokens=400, temperature=0.8, ignore_eos=True, timeout_s=0.3)))
    assert (error["code"], error["status"]) == ("timeout", 504)
    wait_idle()


def test_a_request_id_in_flight_cannot_be_reused(runtime):
    callback = RecordingCallback()
    bridge.chat_stream(request(LONG, max_tokens=400, request_id="same-id"), callback)
    assert error_of(bridge.chat(request(request_id="same-id")))["code"] == "duplicate_request_id"
    assert (
        error_of(bridge.chat_stream(request(request_id="same-id"), RecordingCallback()))["code"]
        == "duplicate_request_id"
    )
    bridge.cancel("same-id")
    assert callback.wait()[1]["error"]["code"] == "cancelled"


def test_a_callback_that_raises_cancels_its_stream_with_a_callback_error(runtime):
    callback = RecordingCallback(raise_in_token=True)
    bridge.chat_stream(request(LONG, max_tokens=400), callback)
    kind, error = callback.wait()
    assert (kind, error["error"]["code"]) == ("error", "callback_error")
    assert [e[0] for e in callback.events] == ["token", "error"]  # no token delivered after the failure
    wait_idle()


def test_a_callback_without_the_methods_is_refused_at_once(runtime):
    class OnlyTokens:
        def on_token(self, payload):
            pass

    error = error_of(bridge.chat_stream(request(), OnlyTokens()))
    assert error["code"] == "invalid_callback" and "on_done" in error["message"]


def test_status_reports_the_model_the_kv_cache_and_a_reachable_cloud(runtime):
    status = json.loads(bridge.status(json.dumps({"check_cloud": True, "timeout_s": 5})))
    assert (status["state"], status["model_loaded"], status["model"]) == ("ready", True, runtime["model"])
    assert status["kv_cache"]["blocks_total"] > 0 and 0 <= status["kv_cache"]["usage"] <= 1
    assert (
        status["cloud"]["configured"]
        and status["cloud"]["reachable"] is True
        and status["cloud"]["breaker"] == "closed"
    )
    assert error_of(bridge.status(json.dumps({"check_cloud": "yes"})))["status"] == 400


def test_stop_ends_streams_in_flight_and_a_restart_serves_with_an_unreachable_cloud(runtime):
    callback = RecordingCallback()
    bridge.chat_stream(request(LONG, max_tokens=400), callback)
    assert json.loads(bridge.stop()) == {"ok": True, "was_running": True}
    assert callback.finished.is_set()  # stop returns after the stream's last callback
    assert callback.wait()[1]["error"]["code"] == "runtime_stopped"
    assert json.loads(bridge.status())["state"] == "stopped"
    assert error_of(bridge.chat(request()))["code"] == "not_started"

    start({"local": LOCAL, "cloud": {"url": "grpc://127.0.0.1:1"}, "cascade": {"cloud_first_token_timeout_s": 2}})
    status = json.loads(bridge.status(json.dumps({"check_cloud": True, "timeout_s": 2})))
    assert status["cloud"]["configured"] and status["cloud"]["reachable"] is False and status["cloud"]["error"]
    reply = json.loads(bridge.chat(request(model="auto:1")))  # escalation fails: the device answers, marked degraded
    assert (reply["tandem"]["tier"], reply["tandem"]["degraded"]) == ("local", True)
    assert reply["tandem"]["degraded_reason"]
