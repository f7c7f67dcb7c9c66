"""A TCP proxy in front of the throwaway PostgreSQL, to make the state database's faults real for one client
(the other replicas of a test keep talking to the server directly):

    with DatabaseProxy(postgres_server.port) as proxy:
        url = proxy.url_for(state_db_url)      # the same database, through the proxy
        proxy.lose_reply_to(b"tandem_settle_batch")  # the next such call reaches the server; its reply is lost
        proxy.freeze()                         # nothing passes either way (a silent network, a frozen server)
        proxy.thaw()

It runs its own event loop on a thread, so tests may use it from sync and async code alike.
"""

from __future__ import annotations

import asyncio
import threading
from urllib.parse import urlsplit, urlunsplit

CHUNK = 65536


class DatabaseProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.num_replies_lost = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="db-proxy", daemon=True)
        self._flowing: asyncio.Event | None = None
        self._lose_after: bytes | None = None  # the next client message holding these bytes loses its reply
        self._server: asyncio.base_events.Server | None = None

    def __enter__(self) -> DatabaseProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def url_for(self, url: str) -> str:
        """`url` (a database on the upstream server) through this proxy."""
        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)
        user = netloc[0] + "@" if len(netloc) == 2 else ""
        return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}"))

    def lose_reply_to(self, marker: bytes) -> None:
        """The next client message containing `marker` is delivered, and the connection that sent it is cut as
        soon as the server answers, the answer dropped: the call ran, its caller never hears so."""
        self._loop.call_soon_threadsafe(setattr, self, "_lose_after", marker)

    def freeze(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def thaw(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.set)

    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        self._server.close()
        for task in asyncio.all_tasks(self._loop):
            if task is not asyncio.current_task():
                task.cancel()

    async def _serve(self, client_reader, client_writer) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_writer.close()
            return
        losing = asyncio.Event()  # this connection's next reply is to be lost
        up = asyncio.create_task(self._pump(client_reader, server_writer, losing, from_client=True))
        down = asyncio.create_task(self._pump(server_reader, client_writer, losing, from_client=False))
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass  # the proxy stops
        for task in (up, down):
            task.cancel()
        for writer in (client_writer, server_writer):
            writer.close()

    async def _pump(self, reader, writer, losing: asyncio.Event, from_client: bool) -> None:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                return
            await self._flowing.wait()  # frozen: held here, neither side hears from the other
            if from_client and self._lose_after is not None and self._lose_after in data:
                self._lose_after = None
                losing.set()
            elif not from_client and losing.is_set():
                self.num_replies_lost += 1
                return  # the reply is dropped and the connection cut
            writer.write(data)
            await writer.drain()
