"""Test doubles for in-memory hub tests: a backend whose updates the test pushes, and a client
that drives a `Session` the way the socket pump does. Only for unit tests of the hub."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgpack
import numpy as np
from pvwire.core.hub import Hub
from pvwire.model import ConnState, Metadata, Reading
from pvwire.upstream.base import Backend, ChannelSink
from pvwire.wire.session import Session, SessionLimits

KEYS = {"k1": b"secret"}


class FakeMonitor:
    def __init__(self, backend: FakeBackend, name: str) -> None:
        self.backend, self.name, self.closed = backend, name, False

    def close(self) -> None:
        self.closed = True
        self.backend.sinks.pop(self.name, None)


class FakeBackend(Backend):
    """Records monitors; tests push updates through `update`."""

    scheme = "fake"

    def __init__(self) -> None:
        self.sinks: dict[str, ChannelSink] = {}
        self.opened: list[str] = []
        self.monitors: list[FakeMonitor] = []
        self.silent: set[str] = set()  # names no server answers for (until `connect`)
        self.meta = Metadata(type="float64", units="mm", precision=2, writable=True)

    def monitor(self, name: str, sink: ChannelSink) -> FakeMonitor:
        self.opened.append(name)
        self.sinks[name] = sink
        if name not in self.silent:
            self.connect(name)
        mon = FakeMonitor(self, name)
        self.monitors.append(mon)
        return mon

    def connect(self, name: str) -> None:
        self.sinks[name].on_meta(self.meta)
        self.sinks[name].on_connection(ConnState.CONNECTED)

    def update(self, name: str, value: Any, severity: int = 0, t: int = 1700000000) -> None:
        self.sinks[name].on_update(value, t, 0, severity, 0, "")

    async def get(self, name: str, timeout: float) -> Reading:
        return Reading(value=0.0, seconds=1, nanoseconds=0, meta=self.meta)

    async def put(self, name: str, value: object, wait: bool, timeout: float) -> None:
        return None

    def names(self) -> Iterable[str]:
        return ["a", "b"]


def decode(frame: bytes) -> Any:
    def ext(code: int, data: bytes) -> Any:
        dt = ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f4", "f8"][data[0]]
        ndim = data[1]
        dims = [int.from_bytes(data[2 + 4 * i : 6 + 4 * i], "little") for i in range(ndim)]
        return np.frombuffer(data[2 + 4 * ndim :], dtype="<" + dt).reshape(dims)

    msg = msgpack.unpackb(frame, ext_hook=ext, raw=False, strict_map_key=False)
    # Drop the nil items that pad ndarray entries (PROTOCOL.md section 3), as receivers do; the
    # padding itself is tested in test_codec_align.py.
    if msg[0] == 2:
        msg[3] = [e for e in msg[3] if e is not None]
    elif msg[0] == 3:
        for group in msg[2]:
            group[1] = [e for e in group[1] if e is not None]
    return msg


class Client:
    """A session plus the frames it produced, as a socket pump would see them."""

    def __init__(
        self,
        hub: Hub,
        limits: SessionLimits | None = None,
        clock: Any = None,
        opener: Callable[[Session], None] | None = None,
    ) -> None:
        """`opener`: where ATTACHes open their channels (core/opener.py); none, at once."""
        kwargs = {"clock": clock} if clock else {}
        self.session = Session(
            len(hub.sessions) + 1, "test", hub, b"\x91\x00", limits or SessionLimits(),
            lambda: None, opener=opener, **kwargs,
        )  # fmt: skip
        hub.add_session(self.session)
        self.received: list[Any] = []

    def send(self, *msg: Any) -> None:
        self.session.receive(msgpack.packb(list(msg)))

    def drain(self) -> list[Any]:
        """Send everything queued (the client reads it all)."""
        out = []
        while (frame := self.session.next_frame()) is not None:
            self.session.sent(len(frame))
            out.append(decode(frame))
        self.received += out
        return out

    def pop_unsent(self) -> list[Any]:
        out = []
        while (frame := self.session.next_frame()) is not None:
            out.append(decode(frame))
        return out


def attach(client: Client, hub: Hub, ids: list[str], **options: Any) -> int:
    client.send(16, 1, hub.signer.issue(ids, **options).token)
    msgs = client.drain()
    attached = [m for m in msgs if m[0] == 1]
    assert attached, msgs
    # The monitor just opened: its metadata and connection are in the snapshot and are also
    # sent once as a delta at the next tick (to other attachments of the view). Flush that.
    hub.ticker.tick()
    client.drain()
    return int(attached[-1][2])
