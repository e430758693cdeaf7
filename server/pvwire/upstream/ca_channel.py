"""CA channels that pvwire owns: created, read, written, subscribed and cleared one by one.

aioca keeps every channel it ever created in a process-wide cache and can only clear all of them
at once, so a get of a name no IOC serves left a channel searching for the life of the process
(2,000 unknown names: RSS +27 MB, search traffic without end). Here each channel is cleared as
soon as its user is done with it, and a monitor can clear and re-create its channel: libca puts a
disconnected channel on a fixed 10 s "disconnect governor" timer, a new one on the fast search
timer.

This module drives libca through the ctypes bindings of `epicscorelibs.ca` (which aioca uses too;
aioca itself only lends its constants, DBR conversion and errors). The event loop's thread gets
a libca context of its own with preemptive callbacks DISABLED: libca's receive threads then run
our callbacks only while the loop thread is inside `ca_pend_event`, which it calls when libca's
wake-up socket (learnt from `ca_add_fd_registration`) turns readable. So a whole batch of updates
is handed over with no cross-thread wake-up of the loop and no contention for the GIL: pvwire's
whole CA ingest costs about a sixth of aioca's camonitor per update (bench/ca_ingest.py; the
figures in bench/JOURNAL.md). A thread that already has a preemptive context (aioca made it
first) keeps it, and results reach the loop with one `call_soon_threadsafe` per batch.

Most of aioca's cost per update was not the DBR conversion but ctypes creating and deleting a
Python thread state for every callback on a libca thread (~13 us here): the first callback on
each libca thread keeps one GIL-state reference, given back by an `epicsAtThreadExit` hook when
that thread ends. Scalar DBR_TIME values are unpacked with one `struct` call instead of aioca's
`type_to_dbr` objects.

Our callback prototypes pass an integer key as the user pointer instead of a Python object: libca
never calls a get callback whose channel was cleared first, so a Python object handed to it by
reference would leak, and a key that is no longer registered is simply ignored.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import struct
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from aioca import FORMAT_TIME, CANothing
from epicscorelibs.ca import cadef, dbr

from ..limits import integer

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


class _AccessRightsArgs(ctypes.Structure):
    # access_rights_handler_args of cadef.h: the channel, then caar's bit field (read = bit 0,
    # write = bit 1) in one unsigned int.
    _fields_ = [("chid", ctypes.c_void_p), ("ar", ctypes.c_uint)]


_ACCESS_HANDLER = ctypes.CFUNCTYPE(None, _AccessRightsArgs)


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
_replace_access_rights_event = _prototype(
    "ca_replace_access_rights_event", [ctypes.c_void_p, _ACCESS_HANDLER]
)
_puser = _libca["ca_puser"]
_puser.argtypes = [ctypes.c_void_p]
_puser.restype = ctypes.c_void_p
_current_context = _libca["ca_current_context"]
_current_context.argtypes = []
_current_context.restype = ctypes.c_void_p
_is_preemptive = _libca["ca_preemtive_callback_is_enabled"]  # sic: libca's spelling
_is_preemptive.argtypes = []
_is_preemptive.restype = ctypes.c_int
_host_name = _libca["ca_host_name"]
_host_name.argtypes = [ctypes.c_void_p]
_host_name.restype = ctypes.c_char_p
_pend_event = _libca["ca_pend_event"]
_pend_event.argtypes = [ctypes.c_double]
_pend_event.restype = ctypes.c_int
_FD_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)
_add_fd_registration = _prototype("ca_add_fd_registration", [_FD_HANDLER, ctypes.c_void_p])
# libCom's, found through libca's dependencies.
_THREAD_EXIT_FUNC = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_at_thread_exit = _libca["epicsAtThreadExit"]
_at_thread_exit.argtypes = [_THREAD_EXIT_FUNC, ctypes.c_void_p]
_at_thread_exit.restype = ctypes.c_int
_gil_ensure = ctypes.pythonapi.PyGILState_Ensure
_gil_ensure.restype = ctypes.c_int
_gil_release = ctypes.pythonapi.PyGILState_Release
_gil_release.argtypes = [ctypes.c_int]
_PYGILSTATE_LOCKED = 0

# A safety-net poll of a polled context: every callback of libca's threads also writes to the
# wake-up socket the loop watches, so this only bounds the delay of one that did not.
POLL_PERIOD = 0.5

# Updates of one subscription held while the loop is behind, and the bytes they may take (an
# array's values hold their elements: a 1 MB waveform keeps 16, an 8 MB one 2).
QUEUE_SIZE = integer("ca_queue_size")
QUEUE_BYTES = integer("ca_queue_bytes")
# Bytes of one element by DBF type (db_access.h: string, short, float, enum, char, long, double).
_ELEMENT_BYTES = {0: 40, 1: 2, 2: 4, 3: 2, 4: 1, 5: 4, 6: 8}

_keys = itertools.count(1)
# Every open channel by key, so a connection callback finds its channel and `/metrics` can count.
_channels: dict[int, CaChannel] = {}
# Outstanding gets and puts: key -> (future, DBR converter or None for a put, name, driver).
_requests: dict[int, tuple[asyncio.Future[Any], Any, str, _Driver]] = {}
# Open subscriptions by key.
_subscriptions: dict[int, CaSubscription] = {}


def channel_counts() -> dict[str, int]:
    """Open channels by state: `searching` (never or no longer connected) and `connected`."""
    connected = sum(1 for c in _channels.values() if c.connected)
    return {"connected": connected, "searching": len(_channels) - connected}


# -- Python thread states of libca's threads ----------------------------------------------------

_get_ident = threading.get_ident
# libca threads holding a kept thread state, and the threads that must never keep one (those
# that run an event loop: Python made their thread state and deletes it).
_pinned: set[int] = set()
_not_pinned: set[int] = set()


def _pin_thread() -> None:  # a libca thread, inside one of our callbacks
    ident = _get_ident()
    if ident in _pinned or ident in _not_pinned:
        return
    # ctypes takes the GIL for a callback with PyGILState_Ensure and, on a thread Python did not
    # create, deletes the thread state again on the way out. One reference kept here makes the
    # next callbacks reuse it; the thread gives it back when it ends.
    _gil_ensure()
    _pinned.add(ident)
    _at_thread_exit(_c_unpin_thread, None)


def _unpin_thread(_arg: Any) -> None:  # a libca thread that is ending
    _pinned.discard(_get_ident())
    # Drops the kept reference only (LOCKED: the GIL stays held); ctypes' own release after
    # this callback then deletes the thread state.
    _gil_release(_PYGILSTATE_LOCKED)


_c_unpin_thread = _THREAD_EXIT_FUNC(_unpin_thread)


# -- this thread's libca context and the event loops that serve it ------------------------------

_local = threading.local()  # `fds`: the wake-up sockets of this thread's polled context
# The driver inside `ca_pend_event` right now: its callbacks need no wake-up of the loop.
_polling: _Driver | None = None


def _attach_context() -> bool:
    """Give this thread a libca context; True if it is pvwire's polled one."""
    if getattr(_local, "fds", None) is not None:
        return True
    if _current_context():
        if _is_preemptive():
            return False  # made by aioca (or another user) first: its callbacks come by themselves
        raise RuntimeError("this thread's libca context is not preemptive and not pvwire's")
    cadef.ca_context_create(0)  # ca_disable_preemptive_callback
    _local.fds = set()
    _not_pinned.add(_get_ident())
    _add_fd_registration(_c_on_fd, None)  # names the wake-up socket at once
    return True


def _on_fd(_arg: Any, fd: int, opened: int) -> None:  # the thread that owns the context
    fds: set[int] | None = getattr(_local, "fds", None)
    if fds is None:
        return
    if opened:
        fds.add(fd)
    else:
        fds.discard(fd)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return  # no loop yet: the first driver watches every fd in `fds`
    driver = _drivers.get(loop)
    if driver is not None:
        driver.watch(fd, bool(opened))


_c_on_fd = _FD_HANDLER(_on_fd)


class _Driver:
    """Runs the results of libca's callbacks on one event loop, and polls a polled context."""

    def __init__(self, loop: asyncio.AbstractEventLoop, polled: bool) -> None:
        self._loop = loop
        self._queue: deque[Callable[[], None]] = deque()
        self._idle = True
        self._flush_due = False
        self.polled = polled
        self._timer: asyncio.TimerHandle | None = None
        if polled:
            for fd in _local.fds:
                self.watch(fd, True)
            self._timer = loop.call_later(POLL_PERIOD, self._tick)

    def watch(self, fd: int, opened: bool) -> None:
        if opened:
            self._loop.add_reader(fd, self.poll)
        else:
            self._loop.remove_reader(fd)

    def post(self, fn: Callable[[], None]) -> None:  # a libca thread, or the loop's
        self._queue.append(fn)
        if self._idle:
            self._idle = False
            # Inside our own poll the loop drains right after it; otherwise wake it up once.
            if _polling is not self and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._drain)

    def flush_soon(self) -> None:
        """Send what libca holds for its servers once this loop pass is done: one flush for
        every channel, request and subscription the pass made. A flush per call was two thirds
        of the CPU of 2,000 monitors opening at once (~9 a monitor, bench/JOURNAL.md)."""
        if self._flush_due:
            return
        self._flush_due = True
        try:
            self._loop.call_soon(self._flush)
        except RuntimeError:  # the loop is closed: no later pass would send it
            self._flush()

    def _flush(self) -> None:
        self._flush_due = False
        cadef.ca_flush_io()

    def poll(self) -> None:
        """Let libca's threads run the callbacks they hold, then deliver their results."""
        global _polling
        _polling = self
        try:
            _pend_event(1e-12)  # ca_poll
        finally:
            _polling = None
        if not self._idle:
            self._drain()

    def _tick(self) -> None:
        self._timer = self._loop.call_later(POLL_PERIOD, self._tick)
        self.poll()

    def _drain(self) -> None:
        # Idle again *before* draining: a post racing with the end of the loop below schedules
        # another drain instead of waiting for the next unrelated post.
        self._idle = True
        queue = self._queue
        while queue:
            queue.popleft()()


_drivers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Driver] = (
    weakref.WeakKeyDictionary()
)


def _driver() -> _Driver:
    loop = asyncio.get_running_loop()
    d = _drivers.get(loop)
    if d is None:
        d = _drivers[loop] = _Driver(loop, _attach_context())
    return d


# -- libca's callbacks (libca threads) ---------------------------------------------------------


def _on_connection(args: Any) -> None:  # libca thread
    _pin_thread()
    channel = _channels.get(_puser(args.chid) or 0)
    if channel is not None:
        channel._driver.post(partial(channel._on_connection, args.op == cadef.CA_OP_CONN_UP))


def _on_request_done(args: Any) -> None:  # libca thread
    _pin_thread()
    entry = _requests.get(args.usr or 0)
    if entry is None:
        return  # timed out or cancelled meanwhile
    future, to_value, name, driver = entry
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
    driver.post(partial(_settle, future, result))


def _on_access_rights(args: Any) -> None:  # libca thread
    _pin_thread()
    channel = _channels.get(_puser(args.chid) or 0)
    if channel is not None:
        channel._driver.post(partial(channel._on_access, bool(args.ar & 2)))


# The C callbacks: module-level, so they live as long as libca may call them.
_c_on_connection = cadef.connection_handler(_on_connection)
_c_on_request_done = _EVENT_HANDLER(_on_request_done)
_c_on_access_rights = _ACCESS_HANDLER(_on_access_rights)


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    if future.done():
        return
    if isinstance(result, Exception):
        future.set_exception(result)
    else:
        future.set_result(result)


def _on_subscription_event(args: Any) -> None:  # libca thread
    _pin_thread()
    sub = _subscriptions.get(args.usr or 0)
    if sub is None or args.status != cadef.ECA_NORMAL:
        return
    try:
        value = sub._to_value(args.raw_dbr, args.type, args.count)
    except Exception:
        return  # a DBR that cannot be converted; the next one may
    # Every value is kept until the loop takes it, up to the queue's bound: past it the oldest
    # goes (the deque drops it), counted. The loop clears `_scheduled` before it empties the
    # queue, so no value is left behind unseen.
    queue = sub._queue
    if len(queue) == queue.maxlen:
        sub.dropped_callbacks += 1
    queue.append(value)
    if not sub._scheduled:
        sub._scheduled = True
        sub._driver.post(sub._deliver)


_c_on_subscription_event = _EVENT_HANDLER(_on_subscription_event)


# -- DBR_TIME values as (value, seconds, nanoseconds, severity, status) --------------------------

# Scalar dbr_time_* layouts (db_access.h): status, severity, stamp seconds and nanoseconds since
# 1990, padding, value; host byte order. One unpack instead of aioca's ctypes structure and
# attribute copies.
_SCALAR_TIME = {
    dbr.DBR_TIME_SHORT: struct.Struct("=hhII2xh"),
    dbr.DBR_TIME_FLOAT: struct.Struct("=hhIIf"),
    dbr.DBR_TIME_ENUM: struct.Struct("=hhII2xH"),
    dbr.DBR_TIME_CHAR: struct.Struct("=hhII3xB"),
    dbr.DBR_TIME_LONG: struct.Struct("=hhIIi"),
    dbr.DBR_TIME_DOUBLE: struct.Struct("=hhII4xd"),
}
_EPICS_EPOCH = dbr.EPICS_epoch


def _time_converter(channel: CaChannel, fmt: int) -> tuple[int, Callable[[Any, int, int], Any]]:
    """The DBR code and converter of a subscription; FORMAT_TIME ones give time tuples."""
    dbrcode, to_value = dbr.type_to_dbr(channel, None, fmt)
    if fmt != FORMAT_TIME:
        return dbrcode, to_value
    layout = _SCALAR_TIME.get(dbrcode)
    # A count-1 channel is a scalar to aioca too; `NAME.VAL$` is text (aioca's DBR_CHAR_STR).
    if layout is not None and channel.element_count == 1 and not channel.name.endswith("$"):
        unpack, size, string_at = layout.unpack, layout.size, ctypes.string_at

        def scalar(raw_dbr: Any, _dbrcode: int, _count: int) -> Any:
            status, severity, secs, nsec, value = unpack(string_at(raw_dbr, size))
            return value, secs + _EPICS_EPOCH, nsec, severity, status

        return dbrcode, scalar

    def other(raw_dbr: Any, dbrcode: int, count: int) -> Any:
        value = to_value(raw_dbr, dbrcode, count)
        secs, nsec = value.raw_stamp
        return value, secs, nsec, value.severity, value.status

    return dbrcode, other


class CaChannel:
    """One libca channel. Connection changes go to `on_connection(up)` on the event loop.

    Must be closed: the channel searches (or stays connected) until `close()`.
    """

    __slots__ = (
        "_as_parameter_",
        "_driver",
        "_key",
        "_on_change",
        "_on_write_access",
        "_waiters",
        "closed",
        "connected",
        "name",
    )

    def __init__(
        self,
        name: str,
        on_connection: Callable[[bool], None] | None = None,
        on_write_access: Callable[[bool], None] | None = None,
    ) -> None:
        """`on_write_access(writable)`: the IOC changed this client's write access to the
        channel (an ACF reloaded with asInit, the record's ASG changed), on the event loop."""
        self.name = name
        self.connected = False
        self.closed = False
        self._on_change = on_connection
        self._on_write_access = on_write_access
        self._waiters: list[asyncio.Future[None]] = []
        self._driver = _driver()
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
        if on_write_access is not None:
            # libca calls it at every connection and whenever the server sends new rights.
            _replace_access_rights_event(self, _c_on_access_rights)
        self._driver.flush_soon()

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

    def _on_access(self, writable: bool) -> None:
        if not self.closed and self._on_write_access is not None:
            self._on_write_access(writable)

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

    @property
    def server(self) -> str:
        """The server of a connected channel as libca names it: `HOST:PORT`, HOST a dotted
        address or, once libca's reverse lookup answered, a host name (`localhost:5064`)."""
        if not self.connected:
            raise cadef.Disconnected(self)
        return (_host_name(self._as_parameter_) or b"").decode(errors="replace")

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
            self._driver.flush_soon()
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
        _requests[key] = (future, to_value, self.name, self._driver)
        try:
            send(key)
            self._driver.flush_soon()
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise CANothing(self.name, cadef.ECA_TIMEOUT) from None
        finally:
            del _requests[key]

    def subscribe(
        self, callback: Callable[[Any], None], events: int, fmt: int, count: int
    ) -> CaSubscription:
        """Subscribe (the channel must be connected); `callback` runs on the event loop.

        FORMAT_TIME values reach it as `(value, seconds, nanoseconds, severity, status)` (seconds
        since 1970; `value` a plain int or float for scalars, else as aioca converts it); other
        formats as aioca's values.
        """
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
        self._driver.flush_soon()


class CaSubscription:
    """One libca subscription whose values reach `callback` on the event loop, in order.

    While the loop is behind, libca hands a subscription's updates over several at a time: all
    of them are kept, up to `QUEUE_SIZE` (fewer for a large array, `QUEUE_BYTES` in all), and
    past that the oldest are dropped and counted in `dropped_callbacks`. aioca's default
    (`all_updates=False`), kept here before, passed on only the newest of those a late loop
    found waiting: lost to `ALL` subscriptions and to the history alike (bench/drain.py).
    """

    __slots__ = (
        "_as_parameter_",
        "_callback",
        "_driver",
        "_key",
        "_queue",
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
        self._driver = channel._driver
        self._scheduled = False
        dbrcode, self._to_value = _time_converter(channel, fmt)
        size = (count or channel.element_count) * _ELEMENT_BYTES.get(channel.field_type, 40)
        self._queue: deque[Any] = deque(maxlen=max(1, min(QUEUE_SIZE, QUEUE_BYTES // size)))
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
        self._driver.flush_soon()

    def _deliver(self) -> None:
        self._scheduled = False
        queue = self._queue
        while queue and not self.closed:
            self._callback(queue.popleft())

    def close(self) -> None:
        """Stop the subscription; no callback runs after this returns. Idempotent.

        Clearing its channel clears the subscription inside libca too; then only our side needs
        forgetting (`ca_clear_subscription` on a cleared channel is not allowed).
        """
        if self.closed:
            return
        self.closed = True
        _subscriptions.pop(self._key, None)
        self._queue.clear()
        if not self.channel.closed:
            cadef.ca_clear_subscription(self)
            self._driver.flush_soon()


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
