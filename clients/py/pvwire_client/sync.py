"""A synchronous facade for scripts: the asyncio Client on an event loop in a background thread.

Example::

    from pvwire_client import SyncClient

    with SyncClient("http://127.0.0.1:8080") as c:
        print(c.get("ca://X:TEMP").format())
        for u in c.monitor(["sim://sine"], count=10):
            print(u.channel.value)
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

from .client import DEFAULT_URL, Client, TokenSource, Update
from .graphql import PutResult
from .history import HistoryRows
from .state import ChannelState

__all__ = ["SyncClient"]

T = TypeVar("T")
_END = object()


class SyncClient:
    """Blocking versions of the Client's calls; one background event loop per SyncClient.

    ``token`` is the Client's (default ``PVWIRE_TOKEN``); a callable is called on the
    background thread. ``ca_file`` as the Client's: the CA (PEM) an ``https://`` server's
    certificate is verified against, else the system's trusted certificates.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: TokenSource = None,
        ca_file: str | None = None,
        **options: Any,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pvwire", daemon=True)
        self._thread.start()
        self._client = self._call(self._make(url, {**options, "token": token, "ca_file": ca_file}))

    @staticmethod
    async def _make(url: str, options: dict[str, Any]) -> Client:
        return Client(url, **options)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    @overload
    def get(self, id: str, /, *, timeout: float | None = None) -> ChannelState: ...
    @overload
    def get(
        self, id: str, id2: str, /, *ids: str, timeout: float | None = None
    ) -> list[ChannelState]: ...
    def get(self, *ids: str, timeout: float | None = None) -> ChannelState | list[ChannelState]:
        """One id gives one ChannelState, several a list; raises PvwireError subclasses."""
        states = self._call(self._client.get_many(ids, timeout=timeout))
        for s in states:
            if isinstance(s, Exception):
                raise s
        out = [s for s in states if isinstance(s, ChannelState)]
        return out[0] if len(ids) == 1 else out

    def put(self, id: str, value: Any, *, wait: bool = False, timeout: float = 5.0) -> PutResult:
        return self._call(self._client.put(id, value, wait=wait, timeout=timeout))

    def put_many(
        self, puts: Mapping[str, Any] | Sequence[tuple[str, Any]], *, wait: bool = False
    ) -> list[PutResult]:
        return self._call(self._client.put_many(puts, wait=wait))

    def search(self, pattern: str, limit: int = 100) -> list[str]:
        return self._call(self._client.search(pattern, limit))

    def info(self, id: str) -> dict[str, Any]:
        return self._call(self._client.info(id))

    def server_info(self) -> dict[str, Any]:
        return self._call(self._client.server_info())

    def history(
        self,
        id: str,
        since: float | None = None,
        until: float | None = None,
        *,
        max_points: int = 1000,
    ) -> HistoryRows:
        """Client.history: the server's recent past and, behind it, the archive's."""
        return self._call(self._client.history(id, since, until, max_points=max_points))

    def monitor(
        self,
        ids: str | Iterable[str],
        *,
        count: int | None = None,
        duration: float | None = None,
        max_rate: float = 0,
        mode: Literal["LATEST", "ALL"] = "LATEST",
        max_columns: int = 0,
        max_pixels: int = 0,
    ) -> Iterator[Update]:
        """Yield updates until ``count`` of them or ``duration`` seconds (or forever). The
        options are :meth:`Client.monitor`'s (``max_columns``/``max_pixels``: big arrays
        reduced for display by the server, PROTOCOL.md section 4.6)."""
        q: queue.Queue[Any] = queue.Queue(maxsize=1024)
        ids = ids if isinstance(ids, str) else list(ids)

        async def pump() -> None:
            try:
                async for u in self._client.monitor(
                    ids,
                    max_rate=max_rate,
                    mode=mode,
                    max_columns=max_columns,
                    max_pixels=max_pixels,
                ):
                    await _put(q, u)
                await _put(q, _END)
            except Exception as e:
                await _put(q, e)

        task = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        deadline = None if duration is None else time.monotonic() + duration
        n = 0
        try:
            while count is None or n < count:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return
                try:
                    item = q.get(timeout=left)
                except queue.Empty:
                    return
                if item is _END:
                    return
                if isinstance(item, Exception):
                    raise item
                n += 1
                yield item
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                task.result(timeout=5)


async def _put(q: queue.Queue[Any], item: Any) -> None:
    # A bounded queue between threads: wait (without blocking the loop) while the script is slow.
    while True:
        try:
            q.put_nowait(item)
            return
        except queue.Full:
            await asyncio.sleep(0.01)
