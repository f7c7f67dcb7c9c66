"""`tandem cloud serve` end to end: one process, gRPC and the OpenAI HTTP API over one engine, keys on both.

Runs the real command in a subprocess on the tiny random-weight checkpoint, then talks to
it with the official `openai` client and tandem's gRPC client, and stops it with SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import openai
import pytest

from sdk.cloud.grpc_client import CloudClient, CloudUnauthenticatedError
from sdk.protocol.engine import SamplingParams
from tests.cloud_engine.test_cloud_engine_edges import tiny_dir  # noqa: F401  (fixture)
from tests.conftest import REPO_ROOT, _log_tail, free_port, wait_until_healthy

pytestmark = pytest.mark.slow
KEY = "sk-test-cloud"


@pytest.fixture(scope="module")
def cloud_server(tiny_dir, tmp_path_factory):  # noqa: F811
    folder = tmp_path_factory.mktemp("cloud-serve")
    (folder / "keys").write_text(f"# test key\n{KEY}\n")
    http_port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    env["TANDEM_DATA_DIR"] = str(folder / "data")  # its stored responses, never in the user's data directory
    command = [
        sys.executable,
        "-m",
        "sdk.cli",
        "cloud",
        "serve",
        "--model",
        tiny_dir,
        "--model-name",
        "tiny",
        "--dtype",
        "float32",
        "--kv-cache-gb",
        "0.001",
        "--max-model-len",
        "64",
        "--port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--api-key-file",
        str(folder / "keys"),
        "--log-level",
        "warning",
    ]
    log_path = folder / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    base_url = f"http://127.0.0.1:{http_port}"
    wait_until_healthy(process, base_url, log_path, "tandem cloud serve")
    yield process, base_url, f"127.0.0.1:{grpc_port}", log_path
    if process.poll() is None:
        process.kill()
        process.wait()


def test_http_needs_the_key_and_answers_with_it(cloud_server):
    _, base_url, _, _ = cloud_server
    assert httpx.get(f"{base_url}/v1/models").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base_url}/v1", api_key="sk-wrong").completions.create(
            model="tiny", prompt="w1 w2", max_tokens=2
        )
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=KEY)
    out = client.completions.create(model="tiny", prompt="w1 w2 w3", max_tokens=4, temperature=0)
    assert out.usage.completion_tokens == 4 and out.choices[0].finish_reason == "length"


def test_the_responses_api_is_behind_the_same_key(cloud_server):
    """/v1/responses is mounted and keyed; the tiny checkpoint has no chat template, so it is a clean 400."""
    _, base_url, _, _ = cloud_server
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base_url}/v1", api_key="sk-wrong").responses.create(model="tiny", input="w1")
    with pytest.raises(openai.BadRequestError) as refused:
        openai.OpenAI(base_url=f"{base_url}/v1", api_key=KEY).responses.create(model="tiny", input="w1")
    assert "no chat template" in refused.value.body["message"] and refused.value.body["param"] == "input"


async def test_grpc_serves_the_same_engine_with_the_same_key(cloud_server):
    _, base_url, grpc_target, _ = cloud_server
    async with CloudClient(grpc_target, api_key=KEY) as client:
        assert await client.health() == "SERVING"
        assert [m.id for m in await client.list_models()] == ["tiny"]
        events = [
            e async for e in client.generate("w1 w2 w3", SamplingParams(max_tokens=4, temperature=0.0), model="tiny")
        ]
    assert len(events) == 4 and events[-1].finish_reason == "length"
    http = openai.OpenAI(base_url=f"{base_url}/v1", api_key=KEY)
    same = http.completions.create(model="tiny", prompt="w1 w2 w3", max_tokens=4, temperature=0)
    assert "".join(e.text for e in events) == same.choices[0].text  # one engine behind both APIs
    async with CloudClient(grpc_target, api_key="sk-wrong") as client:
        with pytest.raises(CloudUnauthenticatedError):
            [e async for e in client.generate("w1", SamplingParams(max_tokens=1), model="tiny")]


def test_sigterm_stops_both_servers(cloud_server):
    process, _, _, log_path = cloud_server
    process.send_signal(signal.SIGTERM)
    try:
        assert process.wait(timeout=30) == 0, _log_tail(log_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tandem cloud serve ignored SIGTERM for 30 s:\n{_log_tail(log_path)}")
