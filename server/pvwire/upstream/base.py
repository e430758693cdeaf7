"""The one small interface every upstream backend implements.

A backend knows how to reach channels of one scheme (`ca`, `pva`, `sim`). The hub opens at most one
`monitor` per channel and shares it among all clients; `get` and `put` serve the control plane.

Threading and cost rules (see DESIGN.md section 2):
- every `ChannelSink` method is called on the event loop thread;
- sink calls are cheap and synchronous: the backend must not create a task, future or coroutine
  per update on pvwire's side (what the upstream library does internally is its own business);
- a monitor reports, in this order where it can: `on_meta` once the metadata is known (and again
  whenever it changes), `on_connection(CONNECTED)`, then `on_update` for every update;
  `on_connection(DISCONNECTED)` when the upstream server goes away, and CONNECTED again
  (followed by a fresh update) when it comes back: upstream libraries reconnect by themselves.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Protocol

from ..model import ConnState, Metadata, Reading, Value

__all__ = ["Backend", "ChannelSink", "Monitor"]


class ChannelSink(Protocol):
    """Where a monitor delivers what it sees. Implemented by the hub's Channel."""

    def on_update(
        self,
        value: Value,
        seconds: int,
        nanoseconds: int,
        severity: int,
        status: int,
        message: str,
        skipped: int = 0,
    ) -> None:
        """A new value with its IOC timestamp (POSIX seconds + ns) and alarm.

        `skipped`: upstream updates the backend dropped before this one without a callback (the
        CA backend does when the event loop falls far behind, past `ca_queue_size`); they count
        in the serial, so clients see them as conflated rather than lost without trace.
        """

    def on_meta(self, meta: Metadata) -> None:
        """The channel's metadata, complete (it replaces the previous one)."""

    def on_connection(self, state: ConnState, reason: str = "") -> None:
        """Connection state changed. `reason` is for people (e.g. 'IOC disconnected')."""


class Monitor(Protocol):
    """A running upstream subscription."""

    def close(self) -> None:
        """Stop the subscription. Idempotent; no sink call happens after it returns."""


class Backend(ABC):
    """Upstream access for one channel-id scheme. `name` excludes the `scheme://` prefix."""

    scheme: str
    # True when `put_as` writes under the user's own name at the upstream server (CA and PVA
    # with --forward-identity): the server's own access security then decides for that user.
    forwards_identity: bool = False
    # Why this backend cannot serve any channel in this process (shown by /readyz), or None.
    unavailable: str | None = None

    @abstractmethod
    def monitor(self, name: str, sink: ChannelSink) -> Monitor:
        """Start one upstream subscription for `name`, delivering to `sink`.

        Returns at once; connection happens in the background and is reported through
        `sink.on_connection`. An id that can never work (e.g. an unknown sim kind) reports
        `ConnState.FAILED` with a reason instead of raising.
        """

    def check(self, name: str) -> None:  # noqa: B027 - optional hook
        """Raise BadChannelId if `name` can never work (a bad sim parameter, a malformed local
        PV), so every path refuses it with the reason before anything opens. Default: no check
        (a CA or PVA name is only known to be wrong when no server answers)."""

    @abstractmethod
    async def get(self, name: str, timeout: float) -> Reading:
        """Read value, time, alarm and metadata. Raises ChannelNotFound / ChannelTimeout."""

    @abstractmethod
    async def put(self, name: str, value: object, wait: bool, timeout: float) -> None:
        """Write `value` (converted to the channel's type; enum by index or label).

        With `wait`, return only when the upstream server reports completion (CA put-callback,
        PVA put). Raises TypeMismatch, ReadOnlyChannel, ChannelNotFound, ChannelTimeout,
        PutRejected.
        """

    async def put_as(self, user: str, name: str, value: object, wait: bool, timeout: float) -> None:
        """`put`, with the upstream server told that `user` writes. Only where
        `forwards_identity` is True."""
        raise NotImplementedError(f"{self.scheme}:// cannot put as a user")

    def channel_counts(self) -> dict[str, int]:
        """Upstream channels this backend holds open, by state (e.g. `searching`, `connected`),
        for `/metrics`. Default: none to report."""
        return {}

    def peer_refusals(self) -> dict[str, int]:
        """What this backend's own protocol clients refused from upstream servers, by reason
        (counts since start), for `/metrics`. Default: none to report."""
        return {}

    def names(self) -> Iterable[str]:
        """Names this backend can list for search (e.g. sim kinds). Default: none."""
        return ()

    async def close(self) -> None:  # noqa: B027 - optional hook, most backends need nothing
        """Release the upstream context. Monitors are closed by the hub before this."""
