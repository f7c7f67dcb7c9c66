"""llama.cpp's C++ `llama-server` (built by scripts/build-llama-server.sh, on the embedded
SmolLM2) as `tandem serve`'s external OpenAI-compatible cloud tier (`--cloud http://.../v1`),
through the real command and the official `openai` client: escalation, streaming, a restart
hand-off after local tokens, and usage equal to the server's own count."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import openai
import pytest

from local_runtime.llama_backend import cpu_reports_amx
from bench.serve_servers import REPO_ROOT, llama_server
from sdk.engine_common.model_files import default_model_path
from tests.conftest import _log_tail, free_port, wait_until_healthy

pytestmark = pytest.mark.slow

ALIAS = "smollm2-on-llama-server"
QUESTION = [{"role": "user", "content": "Name three colours of the rainbow."}]
GREEDY = {"temperature": 0.0, "max_tokens": 24}


@pytest.fixture(scope="module")
def llama_server_url(tmp_path_factory):
    build = subprocess.run(
        ["bash", os.path.join(REPO_ROOT, "scripts", "build-llama-server.sh")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert build.returncode == 0, f"scripts/build-llama-server.sh failed:\n{build.stderr[-3000:]}"
    binary = build.stdout.strip().splitlines()[-1]
    server = llama_server(
        binary,
        default_model_path(),
        threads=1,
        model_alias=ALIAS,
        num_slots=2,
        ctx_per_slot=1024,
        n_batch=512,
        n_ubatch=512,
        # On a CPU reporting AMX, llama-server's repacked default crashed at start here (SIGSEGV; SIGILL on
        # another VM: docs/local-engine.md); this test needs an OpenAI-compatible cloud, not that layout.
        repack=not cpu_reports_amx(),
    )
    server.log_path = str(tmp_path_factory.mktemp("llama-server") / "server.log")
    with server:
        yield server.base_url


@pytest.fixture(scope="module")
def cascade_url(llama_server_url, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tandem-serve")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    command = [
        sys.executable,
        "-m",
        "sdk.cli",
        "serve",
        "--port",
        str(port),
        "--threads",
        "1",
        "--cloud",
        f"{llama_server_url}/v1",
        "--log-level",
        "warning",
    ]
    log_path = folder / "serve.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, base_url, log_path, "tandem serve --cloud llama-server")
        yield base_url, log_path
    finally:
        process.terminate()
        process.wait(60)


def direct(llama_server_url: str, messages=QUESTION, **fields) -> dict:
    body = {"model": ALIAS, "messages": messages, **GREEDY, **fields}
    return httpx.post(f"{llama_server_url}/v1/chat/completions", json=body, timeout=120).json()


def test_escalation_answers_with_the_servers_text_and_usage(llama_server_url, cascade_url):
    base_url, log_path = cascade_url
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused")
    answer = client.chat.completions.create(model="cloud", messages=QUESTION, **GREEDY)
    tandem = answer.model_extra["tandem"]
    assert (tandem["tier"], tandem["degraded"]) == ("cloud", False), (tandem, _log_tail(log_path))
    reference = direct(llama_server_url)
    assert answer.choices[0].message.content == reference["choices"][0]["message"]["content"]
    assert tandem["cost"]["cloud"]["completion_tokens"] == reference["usage"]["completion_tokens"]  # the server's count
    assert answer.usage.completion_tokens == reference["usage"]["completion_tokens"]
    escalated = client.chat.completions.create(model="auto:1", messages=QUESTION, **GREEDY).model_extra["tandem"]
    assert (escalated["tier"], escalated["escalated"]) == ("cloud", True)


def test_streaming_from_the_external_cloud(llama_server_url, cascade_url):
    base_url, _ = cascade_url
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused")
    chunks = list(
        client.chat.completions.create(
            model="cloud", messages=QUESTION, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reference = direct(llama_server_url)
    assert text == reference["choices"][0]["message"]["content"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == reference["usage"]["completion_tokens"]


def test_a_restart_hand_off_to_the_external_cloud(cascade_url):
    """A threshold the local answer fails part-way: the cascade escalates after local tokens and the
    cloud restarts the answer (an OpenAI-compatible cloud cannot continue from token ids)."""
    base_url, log_path = cascade_url
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused")
    question = [{"role": "user", "content": "Write the 14th digit of pi, then the capital of Burkina Faso."}]
    answer = client.chat.completions.create(model="auto:0.999", messages=question, temperature=0.0, max_tokens=32)
    tandem = answer.model_extra["tandem"]
    assert tandem["tier"] == "cloud" and tandem["escalated"] and not tandem["degraded"], (tandem, _log_tail(log_path))
    assert tandem["decided_at_token"] >= 1 and tandem["handoff"] == "restart", tandem
    assert tandem["cost"]["local"]["completion_tokens"] >= 1 and tandem["cost"]["cloud"]["completion_tokens"] >= 1
    assert answer.choices[0].message.content
