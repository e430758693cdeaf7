"""The connections that carry one user's name to one upstream server, as a bounded pool: one per
(user, server), opened by the first put, at most `max_links` at once (the least recently used is
closed first, failing its puts in flight), closed after `idle_s` without a put and kept alive
until then. CA circuits (ca_identity.py) and PVA connections (pva_identity.py) share it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

__all__ = ["Address", "Link", "UserLinks"]

Address = tuple[str, int]


class Link(Protocol):
    """One connection under one user's name, as the pool sees it."""

    closed: bool  # by either end: the pool opens another on the next put
    busy: int  # puts in flight: never closed as idle while one is
    last_used: float  # time.monotonic() at the end of the last put

    def close(self) -> None: ...

    def keepalive(self) -> None: ...


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
