"""Fixtures of the gRPC service tests: a tiny random-weight engine and real servers on loopback.

The model is the tiny Llama of the engine tests with a longer context (1024 positions), so
a long generation lasts about a second: long enough to cancel it mid-stream or let a
deadline pass while it still holds KV blocks.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from cloud_engine.async_engine import AsyncCloudEngine
from cloud_engine.config import CloudEngineConfig
from sdk.serving.grpc.server import GrpcServerConfig, bound_port, start_grpc_server, stop_grpc_server
from tests.cloud_engine.tiny_models import llama_config, save_byte_tokenizer, save_tiny_llama

MAX_MODEL_LEN = 1024
LONG = 1000  # max_tokens of a generation that is cancelled before it ends (~1 s on the tiny model)


@pytest.fixture(scope="module")
def long_tiny_dir(tmp_path_factory):
    config = llama_config()
    config.max_position_embeddings = MAX_MODEL_LEN
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama-long"), config)


def make_engine(model_dir: str, start: bool = True, **overrides) -> AsyncCloudEngine:
    # float32: the tests compare tokens with the engine's own, which bf16 rounding could blur.
    config = dict(
        model=model_dir,
        model_name="tiny",
        dtype="float32",
        block_size=4,
        kv_cache_gb=0.001,
        max_model_len=MAX_MODEL_LEN,
    )
    config.update(overrides)
    engine = AsyncCloudEngine(CloudEngineConfig(**config))
    if start:
        engine.start().wait_ready(120)
    return engine


@pytest.fixture(scope="module")
def engine(long_tiny_dir):
    engine = make_engine(long_tiny_dir)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def byte_engine(tmp_path_factory):
    """The tiny random-weight Llama with a byte-level vocabulary (it can spell JSON: structured tests)."""
    path = save_tiny_llama(tmp_path_factory.mktemp("tiny-llama-bytes"), save_tokenizer=save_byte_tokenizer)
    engine = make_engine(path, max_model_len=256)
    yield engine
    engine.shutdown()


@pytest.fixture
async def serve():
    """serve(engine, **GrpcServerConfig fields) -> "127.0.0.1:PORT" of a started server (stopped after the test)."""
    servers = []

    async def start(engine, **config) -> str:
        server = await start_grpc_server(engine, GrpcServerConfig(port=0, **config))
        servers.append(server)
        return f"127.0.0.1:{bound_port(server)}"

    yield start
    for server in servers:
        await stop_grpc_server(server, grace_s=0)


async def wait_until(condition, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def wait_drained(engine) -> bool:
    """True once no request runs and no KV block is held (what a cancelled request must leave)."""
    return await wait_until(lambda: engine.stats().num_running == 0 and engine.stats().num_kv_blocks_used == 0)


async def wait_until_serving(client, timeout_s: float = 5.0) -> bool:
    """True once the server's health check says SERVING (the readiness poll runs in the background)."""
    deadline = time.monotonic() + timeout_s
    while await client.health() != "SERVING":
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True
