"""Writing to a stream whose client has gone: no `socket.send() raised exception` burst (asyncio
logs one per write once a transport has lost its connection, 58 in one soak run)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import threading
import time

import pytest
import uvicorn

from tests.app_helpers import make_app
from tests.conftest import free_port
from tests.sdk.test_openai_server import FakeEngine


class BurstEngine(FakeEngine):
    """One token, a pause (the client leaves meanwhile), then the rest at once, without yielding
    to the loop: how the cascade releases held-back tokens, or a step delivers a batch."""

    async def generate(self, request):
        events = super().generate(request)
        try:
            yield await anext(events)
            await asyncio.sleep(0.3)
            burst = []
            async for event in events:
                burst.append(event)
            for event in burst:
                yield event
        finally:
            await events.aclose()


@pytest.fixture
def served():
    engine = BurstEngine(words=[f"w{i} " for i in range(3000)])
    engine.max_model_len = 10_000
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(make_app(engine), host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.02)
    yield engine, port
    server.should_exit = True
    thread.join(30)


def reset_mid_stream(port: int) -> None:
    """Start a stream, read its first bytes, then vanish with a TCP reset (no FIN, no goodbye)."""
    body = json.dumps({"model": "fake", "prompt": "x", "max_tokens": 3000, "stream": True}).encode()
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(request)
    received = sock.recv(4096)
    assert received.startswith(b"HTTP/1.1 200")
    while received.count(b"data:") < 20:  # into the burst: the server is still writing it
        received += sock.recv(4096)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
    sock.close()
    time.sleep(0.5)  # past the burst


def test_a_reset_client_costs_no_send_warnings_and_ends_its_request(served, caplog):
    engine, port = served
    caplog.set_level(logging.WARNING, logger="asyncio")
    for _ in range(5):
        reset_mid_stream(port)
    deadline = time.monotonic() + 10
    while len(engine.closed_ids) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # writes the server might still attempt
    assert len(engine.closed_ids) == 5
    warnings = [r.getMessage() for r in caplog.records if "socket.send() raised exception" in r.getMessage()]
    assert warnings == [], f"{len(warnings)} send warnings"
