"""The connections that carry one user's name to one upstream server, as a bounded pool: one per
(user, server), opened by the first put, at most `max_links` at once (the least recently used is
closed first, failing its puts in flight), closed after `idle_s` without a put and kept alive
until then. CA circuits (ca_identity.py) and PVA connections (pva_identity.py) share it, and
LinkBase: what the two do alike around their own protocol (the TCP stream, waiting for answers
until a deadline, failing what waits when the link ends)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from ..errors import ChannelTimeout, PutRejected

__all__ = ["Address", "Link", "LinkBase", "UserLinks"]

Address = tuple[str, int]


class Link(Protocol):
    """One connection under one user's name, as the pool sees it."""

    closed: bool  # by either end: the pool opens another on the next put
    busy: int  # puts in flight: never closed as idle while one is
    last_used: float  # time.monotonic() at the end of the last put

    def close(self) -> None: ...

    def keepalive(self) -> None: ...


class LinkBase:
    """A TCP stream to one server under one user's name; a subclass speaks the protocol over it
    (`_talk`) and says which futures wait on it (`_waiting`)."""

    ended = "link closed"  # the cause a put is told when the link ended without another

    def __init__(self, user: str, address: Address) -> None:
        self.user = user
        self.address = address
        self.last_used = time.monotonic()
        self.busy = 0  # puts in flight
        self.closed = False
        self._writer: asyncio.StreamWriter | None = None
        self._failure: Exception | None = None
        self._task: asyncio.Future[None] | None = None

    def _start(self) -> None:
        """Open the stream; called last in a subclass's __init__, once its state is set."""
        self._task = asyncio.ensure_future(self._run())

    async def _talk(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def _waiting(self) -> Iterable[asyncio.Future[Any]]:
        raise NotImplementedError

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._fail_all(ConnectionError(self.ended))
        if self._writer is not None:
            self._writer.close()
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def _where(self) -> str:
        return f"{self.address[0]}:{self.address[1]} as {self.user}"

    async def _wait(self, future: asyncio.Future[Any], deadline: float, what: str) -> Any:
        left = deadline - time.monotonic()
        try:
            return await asyncio.wait_for(asyncio.shield(future), max(left, 0.001))
        except TimeoutError:
            if self._failure is not None:
                raise self._error(what) from None
            raise ChannelTimeout(f"{what} in time") from None
        except ConnectionError:
            raise self._error(what) from None

    def _error(self, what: str) -> PutRejected:
        return PutRejected(f"{what}: {self._failure or self.ended}")

    async def _run(self) -> None:
        try:
            reader, self._writer = await asyncio.open_connection(*self.address)
            await self._talk(reader, self._writer)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # a refused connection, a protocol violation: this link only
            # Logged under the subclass's module, as before it shared this code.
            logging.getLogger(type(self).__module__).info("%r ends: %s", self, exc)
            self._failure = exc
        finally:
            self.closed = True
            self._fail_all(ConnectionError(str(self._failure or self.ended)))
            if self._writer is not None:
                self._writer.close()

    def _fail_all(self, exc: Exception) -> None:
        for future in self._waiting():
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: nobody may be waiting any more


L = TypeVar("L", bound=Link)


class UserLinks(Generic[L]):
    def __init__(
        self, open_link: Callable[[str, Address], L], max_links: int, idle_s: float
    ) -> None:
        self._open_link = open_link
        self.max_links = max_links
        self.idle_s = idle_s
        self._links: OrderedDict[tuple[str, Address], L] = OrderedDict()
        self._sweep: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        """Links open (one the server closed is dropped at the next sweep)."""
        return sum(1 for link in self._links.values() if not link.closed)

    def links(self) -> list[L]:
        return list(self._links.values())

    @contextlib.contextmanager
    def using(self, user: str, address: Address) -> Iterator[L]:
        """`user`'s link to `address` (opened if need be), busy while the block runs."""
        link = self._link(user, address)
        link.busy += 1
        try:
            yield link
        finally:
            link.busy -= 1
            link.last_used = time.monotonic()

    def _link(self, user: str, address: Address) -> L:
        key = (user, address)
        link = self._links.get(key)
        if link is not None and not link.closed:
            self._links.move_to_end(key)
            return link
        link = self._links[key] = self._open_link(user, address)
        self._links.move_to_end(key)
        while len(self._links) > self.max_links:
            self._links.popitem(last=False)[1].close()
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(self.idle_s / 2, self._expire)
        return link

    def _expire(self) -> None:
        self._sweep = None
        now = time.monotonic()
        for key, link in list(self._links.items()):
            if link.closed or (link.busy == 0 and now - link.last_used > self.idle_s):
                del self._links[key]
                link.close()
            else:
                link.keepalive()
        if self._links:
            self._sweep = asyncio.get_running_loop().call_later(self.idle_s / 2, self._expire)

    def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for link in self._links.values():
            link.close()
        self._links.clear()
