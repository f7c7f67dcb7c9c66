"""A TCP proxy on loopback that delays every byte by a fixed time each way: a network round trip
injected between a client and a server on one machine (bench.spec_cascade's 20 and 50 ms).

The delay is latency, not bandwidth: each chunk read is written `one_way_s` after it arrived, in
order, while later chunks keep arriving, so a stream of small messages (gRPC over HTTP/2) is
pipelined as over a real link."""

from __future__ import annotations

import asyncio
import contextlib
import time


class DelayProxy:
    """Listens on 127.0.0.1 (its `port` once started) and forwards to 127.0.0.1:`upstream_port`."""

    def __init__(self, upstream_port: int, one_way_s: float = 0.0):
        self.upstream_port = upstream_port
        self.one_way_s = one_way_s  # read at each chunk: change it between runs
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> "DelayProxy":
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _accept(self, client_reader, client_writer) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_writer.close()
            return
        for reader, writer in ((client_reader, upstream_writer), (upstream_reader, client_writer)):
            task = asyncio.create_task(self._pump(reader, writer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy reader to writer, each chunk `one_way_s` after it was read."""
        due: asyncio.Queue = asyncio.Queue()

        async def deliver():
            while (item := await due.get()) is not None:
                at, data = item
                wait = at - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            writer.close()

        delivering = asyncio.create_task(deliver())
        try:
            while data := await reader.read(65536):
                due.put_nowait((time.monotonic() + self.one_way_s, data))
        except (ConnectionError, OSError):
            pass
        finally:
            due.put_nowait(None)
            with contextlib.suppress(Exception):
                await delivering
