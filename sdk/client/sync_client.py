"""Client: the synchronous twin of sdk.client.AsyncClient, for apps without an event loop.

It runs its own event loop on a background thread, so the runner's cloud channel (opened on
first use in the loop that uses it) lives in that loop; close() closes that channel with it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

from sdk.cascade.runner import CascadeRunner
from sdk.client.async_client import AsyncClient


class _SyncStream:
    """Chunks of one streamed completion; close() (or leaving a with-block) cancels it."""

    def __init__(self, client: "Client", chunks):
        self._client, self._chunks = client, chunks

    def __iter__(self) -> Iterator:
        return self

    def __next__(self):
        try:
            return self._client._run(anext(self._chunks))
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        self._client._run(self._chunks.aclose())

    def __enter__(self) -> "_SyncStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Completions:
    def __init__(self, client: "Client"):
        self._client = client

    def create(self, **kwargs):
        """Same arguments and results as AsyncClient's; stream=True gives a plain iterator."""
        result = self._client._run(self._client._async.chat.completions.create(**kwargs))
        return _SyncStream(self._client, result) if kwargs.get("stream") else result


class _Embeddings:
    def __init__(self, client: "Client"):
        self._client = client

    def create(self, **kwargs):
        """AsyncClient.embeddings.create, blocking."""
        return self._client._run(self._client._async.embeddings.create(**kwargs))


class _Chat:
    def __init__(self, client: "Client"):
        self.completions = _Completions(client)


class Client:
    """client.chat.completions.create(...) from synchronous code; use as a context manager or close()."""

    def __init__(self, runner: CascadeRunner | None = None, **http_options):
        """Client(runner) in-process, or Client(base_url=..., api_key=...) over HTTP."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tandem-client", daemon=True)
        self._thread.start()
        self._closed = False

        async def make() -> AsyncClient:  # in the client's loop: httpx binds to it
            return AsyncClient(runner, **http_options)

        try:
            self._async = self._run(make())
        except BaseException:
            self.close()
            raise
        self.runner = runner
        self.chat = _Chat(self)
        self.embeddings = _Embeddings(self)

    def _run(self, coroutine):
        if self._closed:
            coroutine.close()
            raise RuntimeError("this Client is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def feedback(self, response_id: str, *, score: float | None = None, thumbs: str | None = None):
        """AsyncClient.feedback, blocking: how right the answer `response_id` was."""
        return self._run(self._async.feedback(response_id, score=score, thumbs=thumbs))

    def close(self) -> None:
        """Close the cloud channel (bound to this client's loop), then stop the loop thread."""
        if self._closed:
            return
        if getattr(self, "_async", None) is not None:
            self._run(self._async.close())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
