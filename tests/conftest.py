"""Shared fixtures: a real `tandem serve` on loopback with the embedded default model."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.allowed_skips import SkipGuard

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVER_START_TIMEOUT_S = 180


def pytest_configure(config):
    """A skip whose reason names no machine condition fails the run (tests/allowed_skips.py)."""
    config.pluginmanager.register(SkipGuard(), "tandem-skip-guard")


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def served_in_thread(app, name: str = "test-uvicorn"):
    """An ASGI app served by uvicorn on a free loopback port in a daemon thread; yields its root URL
    (http://127.0.0.1:PORT) once it accepts connections, and stops it when the block ends."""
    import threading

    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def _log_tail(path: Path, num_lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])
    except OSError:
        return "(no log)"


def wait_until_healthy(process: subprocess.Popen, base_url: str, log_path: Path, name: str) -> None:
    """Poll GET /health until 200 and, under tandem serve, the embedded cloud engine loaded (the
    body stops saying "cloud": "loading"); fail the test with the server's log if it exits or stays unhealthy."""
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            pytest.fail(f"{name} exited with {process.returncode}:\n{_log_tail(log_path)}")
        try:
            reply = httpx.get(f"{base_url}/health", timeout=2)
            if reply.status_code == 200 and reply.json().get("cloud") != "loading":
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"{name} was not healthy after {SERVER_START_TIMEOUT_S}s:\n{_log_tail(log_path)}")
        time.sleep(0.2)


def clean_env() -> dict[str, str]:
    """This environment without TANDEM_* variables: they must not reconfigure a server under test."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}


@contextlib.contextmanager
def running_server(
    args: list[str],
    log_path: Path,
    name: str = "tandem serve",
    port: int | None = None,
    extra_env: dict[str, str] | None = None,
):
    """`python -m sdk.cli ARGS --port PORT` as a subprocess: yields (process, base_url) once
    /health says 200; terminates it (kill after 30 s) on the way out."""
    port = port or free_port()
    command = [sys.executable, "-m", "sdk.cli", *args, "--port", str(port)]
    # Its files (stored responses, spend, the traffic record) beside its log, never in the user's data directory.
    env = clean_env() | {"TANDEM_DATA_DIR": str(log_path.parent / "data")} | (extra_env or {})
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, base_url, log_path, name)
        yield process, base_url
    finally:
        stop_process(process)


def stop_process(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it has not exited after 30 s."""
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def server_url(tmp_path_factory) -> str:
    """Base URL (http://127.0.0.1:PORT) of a `tandem serve` subprocess shared by the session."""
    log_path = tmp_path_factory.mktemp("tandem-serve") / "server.log"
    args = [
        "serve",
        "--max-model-len",
        "512",
        "--kv-cache-tokens",
        "4096",
        # One llama.cpp thread: the CI machines have 2 shared cores, and llama.cpp's
        # spinning worker threads stall for seconds when another process takes a core.
        "--threads",
        "1",
        "--log-level",
        "warning",
        # Tests on this server compare a stream with the same greedy request answered whole;
        # only batch invariance promises that (the default's prompt cache changes the numbers).
        "--batch-invariant",
    ]
    with running_server(args, log_path) as (_, base_url):
        yield base_url


# --- The state database replicas share (sdk.state): a throwaway PostgreSQL server for the session.


@pytest.fixture(scope="session")
def postgres_server():
    """One throwaway PostgreSQL server (bench.postgres_server) for the whole run; skips where the
    machine has none (a condition of the machine: tests/allowed_skips.py)."""
    from bench.postgres_server import ThrowawayPostgres, postgres_unavailable

    reason = postgres_unavailable()
    if reason:
        pytest.skip(reason)
    server = ThrowawayPostgres().start()
    yield server
    server.close()


@pytest.fixture
def state_db_url(postgres_server) -> str:
    """The URL of a fresh, empty database on the session's server (one per test: no test sees another's rows)."""
    return postgres_server.new_database()


@pytest.fixture
async def state_db(state_db_url):
    """An open sdk.state.database.StateDatabase on a fresh database (a 3 s lease, so expiry tests are short)."""
    from sdk.state.database import StateDatabase

    db = await StateDatabase(state_db_url, lease_s=3.0).open()
    yield db
    await db.close()
