"""android_bridge's contract before any model loads: the import is cheap, and every bad call
(malformed JSON, a call before start, a bad config, a model that cannot load) comes back as
a JSON error object with a code and a message, never an exception."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import android_bridge as bridge
from tests.conftest import REPO_ROOT

HEAVY_MODULES = ("torch", "llama_cpp", "fastapi", "pydantic", "onnxruntime", "transformers", "grpc", "numpy", "sdk")


def error_of(reply: str) -> dict:
    error = json.loads(reply)["error"]
    assert isinstance(error["code"], str) and error["code"] and isinstance(error["message"], str) and error["message"]
    assert isinstance(error["status"], int) and set(error) == {"code", "message", "type", "param", "status"}
    return error


def test_importing_the_bridge_loads_none_of_the_runtime():
    code = f"import sys, android_bridge; print([m for m in {HEAVY_MODULES!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("text", ["{", "[]", "42", '"text"', "null", b"\xff\xfe", '{"a": NaN', 7, ["x"]])
@pytest.mark.parametrize("call", ["start", "chat", "status"])
def test_malformed_json_in_gets_a_json_error_out(call, text):
    reply = getattr(bridge, call)(text)
    assert isinstance(reply, str)
    error = error_of(reply)
    assert (error["code"], error["status"]) == ("invalid_json", 400)


def test_deeply_nested_json_is_refused_not_a_crash():
    error = error_of(bridge.chat("[" * 100_000 + "]" * 100_000))
    assert error["code"] == "invalid_json"


def test_calls_before_start_say_not_started():
    request = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    for reply in (bridge.chat(request), bridge.chat_stream(request, object()), bridge.cancel("chatcmpl-1")):
        assert error_of(reply)["code"] == "not_started"
    assert json.loads(bridge.status()) == {"state": "stopped", "model_loaded": False}
    assert json.loads(bridge.stop()) == {"ok": True, "was_running": False}


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"nonsense": {}}, "unknown sections"),
        ({"local": {"threads": "two"}}, "local.threads"),
        ({"local": {"max_num_seqs": 0}}, "local.max_num_seqs"),
        ({"cloud": {"url": "ftp://x"}}, "cloud.url"),
        ({"cascade": {"threshold": 3}}, "threshold"),
        ({"bridge": {"wait": "yes"}}, "bridge.wait"),
        ({"bridge": {"nope": 1}}, "bridge"),
    ],
)
def test_a_bad_config_is_named_and_starts_nothing(config, words):
    error = error_of(bridge.start(json.dumps(config)))
    assert error["code"] == "invalid_config" and words in error["message"]
    assert json.loads(bridge.status())["state"] == "stopped"


def test_a_model_that_cannot_load_is_a_start_failure_and_leaves_the_bridge_stopped(tmp_path):
    not_a_model = tmp_path / "broken.gguf"
    not_a_model.write_bytes(b"GGUF but not really")
    error = error_of(bridge.start(json.dumps({"local": {"model": str(not_a_model), "threads": 1}})))
    assert (error["code"], error["status"]) == ("start_failed", 500)
    assert json.loads(bridge.status())["state"] == "stopped"


def test_version_names_the_api():
    assert json.loads(bridge.version())["api_version"] == bridge.API_VERSION
