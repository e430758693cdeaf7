"""CA channels that pvwire owns: created, read, written, subscribed and cleared one by one.

aioca keeps every channel it ever created in a process-wide cache and can only clear all of them
at once, so a get of a name no IOC serves left a channel searching for the life of the process
(2,000 unknown names: RSS +27 MB, search traffic without end). Here each channel is cleared as
soon as its user is done with it, and a monitor can clear and re-create its channel: libca puts a
disconnected channel on a fixed 10 s "disconnect governor" timer, a new one on the fast search
timer.

This module drives libca through the ctypes bindings of `epicscorelibs.ca` (which aioca uses
too) in the same way aioca does: preemptive callbacks on libca's threads convert the DBR there and
hand the result to the event loop, one loop wake-up per batch. It shares aioca's libca context.

Our callback prototypes pass an integer key as the user pointer instead of a Python object: libca
never calls a get callback whose channel was cleared first, so a Python object handed to it by
reference would leak, and a key that is no longer registered is simply ignored.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from aioca import CANothing, get_channel_infos
from epicscorelibs.ca import cadef, dbr

__all__ = ["CaChannel", "CaSubscription", "GetChannelPool", "channel_counts"]

_libca = cadef.libca


class _EventArgs(ctypes.Structure):
    # event_handler_args of cadef.h, with the user pointer as a plain integer.
    _fields_ = [
        ("usr", ctypes.c_void_p),
        ("chid", ctypes.c_void_p),
        ("type", ctypes.c_long),
        ("count", ctypes.c_long),
        ("raw_dbr", ctypes.c_void_p),
        ("status", ctypes.c_int),
    ]


_EVENT_HANDLER = ctypes.CFUNCTYPE(None, _EventArgs)


def _prototype(name: str, argtypes: list[Any]) -> Any:
    # A fresh function pointer (indexing the library), so aioca's prototypes stay as they are.
    fn = _libca[name]
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    fn.errcheck = cadef.expect_ECA_NORMAL
    return fn


_create_channel = _prototype(
    "ca_create_channel",
    [
        ctypes.c_char_p,
        cadef.connection_handler,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_void_p),
    ],
)
_get_callback = _prototype(
    "ca_array_get_callback",
    [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, _EVENT_HANDLER, ctypes.c_void_p],
)
_put_callback = _prototype(
    "ca_array_put_callback",
    [
        ctypes.c_long,
        ctypes.c_long,
        ctypes.c_void_p,
        ctypes.c_void_p,
        _EVENT_HANDLER,
        ctypes.c_void_p,
    ],
)
_create_subscription = _prototype(
    "ca_create_subscription",
    [
        ctypes.c_long,
        ctypes.c_long,
        ctypes.c_void_p,
        ctypes.c_long,
        _EVENT_HANDLER,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_void_p),
    ],
)
_puser = _libca["ca_puser"]
_puser.argtypes = [ctypes.c_void_p]
_puser.restype = ctypes.c_void_p

_keys = itertools.count(1)
# Every open channel by key, so a connection callback finds its channel and `/metrics` can count.
_channels: dict[int, CaChannel] = {}
# Outstanding gets and puts: key -> (future, DBR converter or None for a put).
_requests: dict[int, tuple[asyncio.Future[Any], Any, str]] = {}
# Open subscriptions by key.
_subscriptions: dict[int, CaSubscription] = {}


def channel_counts() -> dict[str, int]:
    """Open channels by state: `searching` (never or no longer connected) and `connected`."""
    connected = sum(1 for c in _channels.values() if c.connected)
    return {"connected": connected, "searching": len(_channels) - connected}


class _Dispatcher:
    """Hands work from libca's threads to one event loop, waking it once per batch."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: deque[Callable[[], None]] = deque()
        self._idle = True

    def post(self, fn: Callable[[], None]) -> None:  # any thread
        self._queue.append(fn)
        if self._idle:
            self._idle = False
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        # Idle again *before* draining: a post racing with the end of the loop below schedules
        # another drain instead of waiting for the next unrelated post.
        self._idle = True
        queue = self._queue
        while queue:
            queue.popleft()()


_dispatchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Dispatcher] = (
    weakref.WeakKeyDictionary()
)


def _dispatcher() -> _Dispatcher:
    loop = asyncio.get_running_loop()
    d = _dispatchers.get(loop)
    if d is None:
        # aioca creates (or adopts) the process's libca context and attaches this thread to it
        # when it first serves this loop; asking it for its channel list does exactly that.
        get_channel_infos()
        d = _dispatchers[loop] = _Dispatcher(loop)
    return d


def _on_connection(args: Any) -> None:  # libca thread
    channel = _channels.get(_puser(args.chid) or 0)
    if channel is not None:
        up = args.op == cadef.CA_OP_CONN_UP
        channel._dispatcher.post(lambda: channel._on_connection(up))


def _on_request_done(args: Any) -> None:  # libca thread
    entry = _requests.get(args.usr or 0)
    if entry is None:
        return  # timed out or cancelled meanwhile
    future, to_value, name = entry
    result: Any
    if args.status != cadef.ECA_NORMAL:
        result = CANothing(name, args.status)
    elif to_value is None:
        result = None
    else:
        try:
            result = to_value(args.raw_dbr, args.type, args.count)
        except Exception as e:  # a DBR that cannot be converted: the caller sees why
            result = e
    future.get_loop().call_soon_threadsafe(_settle, future, result)


# The C callbacks: module-level, so they live as long as libca may call them.
_c_on_connection = cadef.connection_handler(_on_connection)
_c_on_request_done = _EVENT_HANDLER(_on_request_done)


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    if future.done():
        return
    if isinstance(result, Exception):
        future.set_exception(result)
    else:
        future.set_result(result)


def _on_subscription_event(args: Any) -> None:  # libca thread
    sub = _subscriptions.get(args.usr or 0)
    if sub is None or args.status != cadef.ECA_NORMAL:
        return
    try:
        value = sub._to_value(args.raw_dbr, args.type, args.count)
    except Exception:
        return  # a DBR that cannot be converted; the next one may
    # Keep only the newest value until the loop takes it; count what it replaced. The loop
    # clears `_scheduled` before reading `_latest`, so no value is left behind unseen.
    sub._latest = value
    if sub._scheduled:
        sub.dropped_callbacks += 1
    else:
        sub._scheduled = True
        sub._dispatcher.post(sub._deliver)


_c_on_subscription_event = _EVENT_HANDLER(_on_subscription_event)


class CaChannel:
    """One libca channel. Connection changes go to `on_connection(up)` on the event loop.

    Must be closed: the channel searches (or stays connected) until `close()`.
    """

    __slots__ = (
        "_as_parameter_",
        "_dispatcher",
        "_key",
        "_on_change",
        "_waiters",
        "closed",
        "connected",
        "name",
    )

    def __init__(self, name: str, on_connection: Callable[[bool], None] | None = None) -> None:
        self.name = name
        self.connected = False
        self.closed = False
        self._on_change = on_connection
        self._waiters: list[asyncio.Future[None]] = []
        self._dispatcher = _dispatcher()
        self._key = next(_keys)
        _channels[self._key] = self
        chid = ctypes.c_void_p()
        try:
            _create_channel(name.encode(), _c_on_connection, self._key, 0, ctypes.byref(chid))
        except Exception:
            del _channels[self._key]
            raise
        # ctypes passes the channel as its chid wherever cadef expects one.
        self._as_parameter_ = chid.value
        cadef.ca_flush_io()

    def _on_connection(self, up: bool) -> None:
        if self.closed:
            return
        self.connected = up
        if up:
            waiters, self._waiters = self._waiters, []
            for w in waiters:
                if not w.done():
                    w.set_result(None)
        if self._on_change is not None:
            self._on_change(up)

    async def wait_connected(self, timeout: float) -> bool:
        """True once connected; False if `timeout` passed first."""
        if self.connected:
            return True
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            return False
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        return self.connected

    @property
    def field_type(self) -> int:
        return int(cadef.ca_field_type(self))

    @property
    def element_count(self) -> int:
        return int(cadef.ca_element_count(self))

    @property
    def writable(self) -> bool:
        return bool(cadef.ca_write_access(self))

    async def get(self, datatype: Any, fmt: int, count: int, timeout: float) -> Any:
        """One read as aioca's caget returns it; CANothing on failure or timeout."""
        if count > 0:
            count = min(count, self.element_count)
        dbrcode, to_value = dbr.type_to_dbr(self, datatype, fmt)
        return await self._request(
            lambda key: _get_callback(dbrcode, count, self, _c_on_request_done, key),
            to_value,
            timeout,
        )

    async def put(self, value: Any, datatype: Any, wait: bool, timeout: float) -> None:
        """Write as aioca's caput does; CANothing on failure (ECA_TIMEOUT when too slow)."""
        # `keep` holds the C buffer `dbr_array` points into until libca has copied it.
        dbrcode, count, dbr_array, keep = dbr.value_to_dbr(self, datatype, value)
        if not wait:
            cadef.ca_array_put(dbrcode, count, self, dbr_array)
            cadef.ca_flush_io()
            del keep
            return
        await self._request(
            lambda key: _put_callback(dbrcode, count, self, dbr_array, _c_on_request_done, key),
            None,
            timeout,
        )
        del keep

    async def _request(self, send: Callable[[int], Any], to_value: Any, timeout: float) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        key = next(_keys)
        _requests[key] = (future, to_value, self.name)
        try:
            send(key)
            cadef.ca_flush_io()
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise CANothing(self.name, cadef.ECA_TIMEOUT) from None
        finally:
            del _requests[key]

    def subscribe(
        self, callback: Callable[[Any], None], events: int, fmt: int, count: int
    ) -> CaSubscription:
        """Subscribe (the channel must be connected); `callback` runs on the event loop."""
        return CaSubscription(self, callback, events, fmt, count)

    def close(self) -> None:
        """Clear the channel (and with it its subscriptions). Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.connected = False
        _channels.pop(self._key, None)
        # Waiters wake and see `connected` False (a cancel would cancel their callers instead).
        for w in self._waiters:
            if not w.done():
                w.set_result(None)
        self._waiters.clear()
        cadef.ca_clear_channel(self)
        cadef.ca_flush_io()


class CaSubscription:
    """One libca subscription whose newest value reaches `callback` on the event loop.

    Values that arrive while one is waiting for the loop replace it and are counted in
    `dropped_callbacks`, as aioca does with `all_updates=False`.
    """

    __slots__ = (
        "_as_parameter_",
        "_callback",
        "_dispatcher",
        "_key",
        "_latest",
        "_scheduled",
        "_to_value",
        "channel",
        "closed",
        "dropped_callbacks",
    )

    def __init__(
        self,
        channel: CaChannel,
        callback: Callable[[Any], None],
        events: int,
        fmt: int,
        count: int,
    ) -> None:
        self.channel = channel
        self.closed = False
        self.dropped_callbacks = 0
        self._callback = callback
        self._dispatcher = channel._dispatcher
        self._latest: Any = None
        self._scheduled = False
        dbrcode, self._to_value = dbr.type_to_dbr(channel, None, fmt)
        self._key = next(_keys)
        _subscriptions[self._key] = self
        event_id = ctypes.c_void_p()
        try:
            _create_subscription(
                dbrcode,
                count,
                channel,
                events,
                _c_on_subscription_event,
                self._key,
                ctypes.byref(event_id),
            )
        except Exception:
            del _subscriptions[self._key]
            raise
        self._as_parameter_ = event_id.value
        cadef.ca_flush_io()

    def _deliver(self) -> None:
        self._scheduled = False
        value, self._latest = self._latest, None
        if value is not None and not self.closed:
            self._callback(value)

    def close(self) -> None:
        """Stop the subscription; no callback runs after this returns. Idempotent.

        Clearing its channel clears the subscription inside libca too; then only our side needs
        forgetting (`ca_clear_subscription` on a cleared channel is not allowed).
        """
        if self.closed:
            return
        self.closed = True
        _subscriptions.pop(self._key, None)
        self._latest = None
        if not self.channel.closed:
            cadef.ca_clear_subscription(self)
            cadef.ca_flush_io()


class GetChannelPool:
    """Channels for gets and puts of names nobody monitors, released after use.

    A channel that did not connect is cleared as soon as its last user gives up, so unknown names
    leave nothing searching. A connected one stays for `idle_seconds` (at most `max_idle` of
    them, least recently used cleared first): a UI polling a name, or a put following a get,
    reuses it instead of searching again.
    """

    def __init__(self, max_idle: int = 256, idle_seconds: float = 10.0) -> None:
        self.max_idle = max_idle
        self.idle_seconds = idle_seconds
        self._busy: dict[str, tuple[CaChannel, int]] = {}  # name -> (channel, users)
        self._idle: OrderedDict[str, tuple[CaChannel, float]] = OrderedDict()  # name -> expiry
        self._sweep: asyncio.TimerHandle | None = None

    @asynccontextmanager
    async def borrow(self, name: str) -> AsyncIterator[CaChannel]:
        """A channel for `name` (maybe not connected yet), given back when the block ends."""
        channel = self.acquire(name)
        try:
            yield channel
        finally:
            self.release(channel)

    async def read(self, name: str, fmt: int, timeout: float) -> Any:
        """One whole read of `name`; CANothing (ECA_TIMEOUT) when it does not complete in time."""
        deadline = time.monotonic() + timeout
        async with self.borrow(name) as channel:
            if not await channel.wait_connected(timeout):
                raise CANothing(name, cadef.ECA_TIMEOUT)
            return await channel.get(None, fmt, 0, max(deadline - time.monotonic(), 0.001))

    def acquire(self, name: str) -> CaChannel:
        busy = self._busy.get(name)
        if busy is not None:
            self._busy[name] = (busy[0], busy[1] + 1)
            return busy[0]
        idle = self._idle.pop(name, None)
        if idle is not None and not idle[0].connected:
            # Its server went away: a fresh channel searches at once, this one waits up to 10 s.
            idle[0].close()
            idle = None
        channel = idle[0] if idle is not None else CaChannel(name)
        self._busy[name] = (channel, 1)
        return channel

    def release(self, channel: CaChannel) -> None:
        name = channel.name
        busy = self._busy.get(name)
        if busy is None or busy[0] is not channel:
            channel.close()
            return
        if busy[1] > 1:
            self._busy[name] = (channel, busy[1] - 1)
            return
        del self._busy[name]
        if not channel.connected or channel.closed or self.max_idle <= 0:
            channel.close()
            return
        self._idle[name] = (channel, time.monotonic() + self.idle_seconds)
        while len(self._idle) > self.max_idle:
            self._idle.popitem(last=False)[1][0].close()
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(self.idle_seconds, self._expire)

    def _expire(self) -> None:
        self._sweep = None
        now = time.monotonic()
        while self._idle:
            name, (channel, expiry) = next(iter(self._idle.items()))
            if expiry > now:
                self._sweep = asyncio.get_running_loop().call_later(expiry - now, self._expire)
                return
            del self._idle[name]
            channel.close()

    def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for channel, _ in self._idle.values():
            channel.close()
        self._idle.clear()
        for channel, _ in self._busy.values():
            channel.close()
        self._busy.clear()
