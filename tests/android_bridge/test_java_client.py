"""The Java client (android_bridge/java) against a real `tandem serve`.

Compiles the client and its test program at Java 8 level with every lint as an error, runs the
program against a keyed server (`--cloud none`: everything answers on the tiny local model), then
checks from /metrics that the cancelled and timed-out requests left nothing running or held.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO_ROOT, _log_tail, running_server
from tests.sdk.test_openai_server import metric

pytestmark = pytest.mark.slow

JAVA_ROOT = REPO_ROOT / "android_bridge" / "java"
KEY = "sk-java-client-test"
JAVA_TIMEOUT_S = 180


def _jdk_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"`{name}` is not on PATH: the Java client's test needs a JDK (8 or newer); "
            "`bash scripts/ensure-jdk.sh` installs one"
        )
    return path


@pytest.fixture(scope="module")
def java_classes(tmp_path_factory) -> Path:
    """The client and its test program, compiled for Java 8 with -Xlint:all -Werror."""
    javac = _jdk_tool("javac")
    out = tmp_path_factory.mktemp("java-classes")
    sources = sorted(str(p) for p in (JAVA_ROOT / "src").rglob("*.java")) + sorted(
        str(p) for p in (JAVA_ROOT / "test").rglob("*.java")
    )
    assert sources, f"no Java sources under {JAVA_ROOT}"
    # -options: newer javac warns that release 8 is deprecated, which -Werror would turn into a failure.
    command = [
        javac,
        "--release",
        "8",
        "-Xlint:all,-options",
        "-Werror",
        "-encoding",
        "UTF-8",
        "-d",
        str(out),
        *sources,
    ]
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"javac failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return out


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    """(base_url, process, log_path) of a `tandem serve --cloud none` that wants KEY
    (and keeps a traffic record: feedback)."""
    folder = tmp_path_factory.mktemp("java-serve")
    (folder / "keys").write_text(f"# the Java client test's key\n{KEY}\n")
    args = [
        "serve",
        "--cloud",
        "none",
        "--threads",
        "1",
        "--max-model-len",
        "512",
        "--kv-cache-tokens",
        "4096",
        "--log-level",
        "warning",
        "--api-key-file",
        str(folder / "keys"),
        "--batch-invariant",
    ]  # the Java test compares a streamed tool call with the same one whole
    log_path = folder / "server.log"
    record = {
        "TANDEM_TRAFFIC_RECORD": "1",
        "TANDEM_TRAFFIC_PATH": str(folder / "traffic.sqlite3"),
        "TANDEM_TRAFFIC_EMBED": "0",
    }
    with running_server(args, log_path, extra_env=record) as (process, base_url):
        yield base_url, process, log_path


def _wait_until_idle(base_url: str, timeout_s: float = 10.0) -> str:
    """Poll /metrics until no request runs or waits and no KV block is held; fail with the samples if not."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = httpx.get(f"{base_url}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).text
        if (
            metric(text, "tandem:num_requests_running") == 0
            and metric(text, "tandem:num_requests_waiting") == 0
            and metric(text, "tandem:kv_blocks_used") == 0
        ):
            return text
        if time.monotonic() > deadline:
            pytest.fail(
                f"the server was not idle {timeout_s}s after the Java client finished:\n"
                + "\n".join(
                    line for line in text.splitlines() if line.startswith(("tandem:kv_blocks", "tandem:num_requests"))
                )
            )
        time.sleep(0.2)


def test_java_client_against_tandem_serve(java_classes, keyed_server):
    base_url, process, log_path = keyed_server
    java = _jdk_tool("java")
    command = [java, "-cp", str(java_classes), "dev.tandem.client.TandemClientTest", f"{base_url}/v1", KEY]
    try:
        result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=JAVA_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"the Java test program ran past {JAVA_TIMEOUT_S}s:\n{exc.stdout}\n{exc.stderr}\n"
            f"server log:\n{_log_tail(log_path)}"
        )
    assert result.returncode == 0, (
        f"TandemClientTest exited with {result.returncode}:\n{result.stdout}\n{result.stderr}\n"
        f"server log:\n{_log_tail(log_path)}"
    )
    assert "0 failed" in result.stdout, result.stdout
    assert "PASS embeddings" in result.stdout, result.stdout  # the server checks ran, embeddings among them
    assert process.poll() is None, f"the server died:\n{_log_tail(log_path)}"
    # The cancelled streams and the timed-out request must have been stopped and their KV blocks freed.
    _wait_until_idle(base_url)
