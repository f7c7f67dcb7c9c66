"""TLS on every listener: `tandem cloud serve --tls-cert/--tls-key` encrypts its HTTP port as well as
its gRPC port, `tandem serve` takes the same flags, and keys configured on a plaintext listener
beyond loopback are warned about at start-up. The certificate is self-signed, made by the test."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time

import httpx
import pytest

from sdk.cloud.grpc_client import CloudClient
from sdk.protocol.engine import SamplingParams
from tests.cloud_engine.test_cloud_engine_edges import tiny_dir  # noqa: F401  (fixture)
from tests.conftest import REPO_ROOT, _log_tail, clean_env, free_port, stop_process as stop

pytestmark = pytest.mark.slow
KEY = "sk-tls-test"


@pytest.fixture(scope="module")
def cert(tmp_path_factory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp("tls")
    cert_path, key_path = str(folder / "cert.pem"), str(folder / "key.pem")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            key_path,
            "-out",
            cert_path,
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    (folder / "keys").write_text(f"{KEY}\n")
    return cert_path, key_path


def trusting(cert_path: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cert_path)


def start(args: list[str], log_path, base_url: str, verify) -> subprocess.Popen:
    """The command as a subprocess, once GET /health answers 200 at base_url."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "sdk.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=clean_env(),
            cwd=REPO_ROOT,
        )
    deadline = time.monotonic() + 180
    while True:
        if process.poll() is not None:
            pytest.fail(f"{args[0]} exited with {process.returncode}:\n{_log_tail(log_path)}")
        try:
            if httpx.get(f"{base_url}/health", verify=verify, timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"not healthy at {base_url}:\n{_log_tail(log_path)}")
        time.sleep(0.2)


async def test_cloud_serve_encrypts_its_http_and_grpc_ports(cert, tiny_dir, tmp_path):  # noqa: F811
    cert_path, key_path = cert
    http_port, grpc_port = free_port(), free_port()
    keys = os.path.join(os.path.dirname(cert_path), "keys")
    process = start(
        [
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
            keys,
            "--tls-cert",
            cert_path,
            "--tls-key",
            key_path,
            "--log-level",
            "warning",
        ],
        tmp_path / "cloud.log",
        f"https://127.0.0.1:{http_port}",
        trusting(cert_path),
    )
    try:
        reply = httpx.post(
            f"https://127.0.0.1:{http_port}/v1/completions",
            verify=trusting(cert_path),
            timeout=60,
            headers={"Authorization": f"Bearer {KEY}"},
            json={"model": "tiny", "prompt": "w1 w2", "max_tokens": 2},
        )
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2
        with pytest.raises(httpx.HTTPError):  # plaintext to the TLS port gets nowhere
            httpx.get(f"http://127.0.0.1:{http_port}/health", timeout=5)
        async with CloudClient(f"127.0.0.1:{grpc_port}", api_key=KEY, tls_root_cert=cert_path) as client:
            events = [e async for e in client.generate("w1 w2", SamplingParams(max_tokens=2, temperature=0.0))]
        assert len(events) == 2
    finally:
        stop(process)


def test_tandem_serve_speaks_https_and_warns_about_keys_in_plaintext(cert, tmp_path):
    cert_path, key_path = cert
    base = [
        "serve",
        "--cloud",
        "none",
        "--threads",
        "1",
        "--max-model-len",
        "256",
        "--kv-cache-tokens",
        "1024",
        "--log-level",
        "warning",
    ]
    port = free_port()
    process = start(
        [*base, "--port", str(port), "--tls-cert", cert_path, "--tls-key", key_path],
        tmp_path / "tls.log",
        f"https://127.0.0.1:{port}",
        trusting(cert_path),
    )
    try:
        reply = httpx.post(
            f"https://127.0.0.1:{port}/v1/chat/completions",
            verify=trusting(cert_path),
            timeout=60,
            json={"model": "local", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        )
        assert reply.status_code == 200
    finally:
        stop(process)
    port = free_port()
    keys = os.path.join(os.path.dirname(cert_path), "keys")
    process = start(
        [*base, "--host", "0.0.0.0", "--port", str(port), "--api-key-file", keys],
        tmp_path / "plain.log",
        f"http://127.0.0.1:{port}",
        True,
    )
    stop(process)
    assert "travel in plaintext HTTP" in (tmp_path / "plain.log").read_text()
    loopback = free_port()
    process = start(
        [*base, "--port", str(loopback), "--api-key-file", keys],
        tmp_path / "loopback.log",
        f"http://127.0.0.1:{loopback}",
        True,
    )
    stop(process)
    assert "plaintext" not in (tmp_path / "loopback.log").read_text()  # keys on loopback need no TLS


def test_one_tls_file_alone_is_refused_before_anything_loads(cert):
    result = subprocess.run(
        [sys.executable, "-m", "sdk.cli", "serve", "--tls-cert", cert[0]],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert result.returncode != 0 and "--tls-key" in result.stderr
