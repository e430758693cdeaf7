"""The hub: one upstream monitor per channel shared by every client, and the tick.

- Channels are refcounted by the views that hold them; the first view opens the upstream monitor,
  the last one to go lets it linger `linger_s` before closing (a page reload does not reconnect).
- Upstream callbacks only mark a channel dirty (channel.py). The first dirty channel after a tick
  schedules the next tick: at once when idle, `tick_ms` after the previous tick under load.
- At the tick each dirty channel is encoded once; each view splices its entries once; each
  session prefixes a frame header (view.py, session.py). No per-client work per update.
- Gets on a monitored channel are answered from the cache, without an upstream round trip.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .backends.base import Backend
from .channel import Channel, DirtyListener
from .config import Settings
from .errors import PvwireError, WriteDenied
from .ids import parse_id
from .model import ConnState, Reading
from .session import Session
from .tokens import Claims, TokenSigner
from .view import View, ViewKey

__all__ = ["Hub", "HubStats"]

log = logging.getLogger("pvwire.hub")
audit = logging.getLogger("pvwire.audit")

TICK_BUCKETS_MS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 500.0)


@dataclass
class HubStats:
    ticks: int = 0
    tick_seconds: float = 0.0
    tick_buckets: list[int] = field(default_factory=lambda: [0] * (len(TICK_BUCKETS_MS) + 1))
    cache_gets: int = 0
    upstream_gets: int = 0
    puts: int = 0
    put_errors: int = 0
    updates_closed: int = 0  # updates of channels already closed, so totals never go down
    frames_closed: int = 0
    bytes_closed: int = 0
    conflated_closed: int = 0
    loop_lag: float = 0.0  # seconds, worst in the last window
    closes_by_code: dict[int, int] = field(default_factory=dict)


class Hub(DirtyListener):
    def __init__(
        self, backends: Mapping[str, Backend], settings: Settings, signer: TokenSigner
    ) -> None:
        self.backends = dict(backends)
        self.settings = settings
        self.signer = signer
        self.channels: dict[str, Channel] = {}
        self.views: dict[ViewKey, View] = {}
        self.sessions: set[Session] = set()
        self.stats = HubStats()
        self.rates: dict[str, float] = {}  # channel id -> updates/s over the last second
        self.started = time.time()
        self._interval = settings.tick_ms / 1000.0
        self._dirty: list[Channel] = []
        self._waiting: dict[View, None] = {}  # views with changes held back by maxRate
        self._tick_handle: asyncio.TimerHandle | None = None
        self._last_tick = 0.0
        self._lingering: dict[str, asyncio.TimerHandle] = {}
        self._housekeeping: asyncio.TimerHandle | None = None
        self._last_counts: dict[str, int] = {}
        self._lag_window: list[float] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._schedule_housekeeping(self._loop.time())

    async def stop(self) -> None:
        for handle in (self._tick_handle, self._housekeeping, *self._lingering.values()):
            if handle:
                handle.cancel()
        for ch in list(self.channels.values()):
            self._close_channel(ch)
        for backend in self.backends.values():
            await backend.close()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    # --- ids, channels ------------------------------------------------------------------------

    def resolve(self, channel_id: str) -> tuple[str, Backend, str]:
        """(canonical id, backend, name); raises BadChannelId."""
        scheme, name = parse_id(channel_id, self.settings.default_scheme, self.backends)
        return f"{scheme}://{name}", self.backends[scheme], name

    def writes_allowed(self, canonical_id: str) -> bool:
        return any(fnmatch.fnmatchcase(canonical_id, rule) for rule in self.settings.write_rules)

    def acquire(self, canonical_id: str) -> Channel:
        ch = self.channels.get(canonical_id)
        if ch is None:
            _, backend, name = self.resolve(canonical_id)
            ch = Channel(canonical_id, backend, name, self, self.writes_allowed(canonical_id))
            self.channels[canonical_id] = ch
            ch.monitor = backend.monitor(name, ch)
        elif handle := self._lingering.pop(canonical_id, None):
            handle.cancel()
        ch.refs += 1
        return ch

    def release(self, ch: Channel) -> None:
        ch.refs -= 1
        if ch.refs <= 0 and ch.id not in self._lingering:
            self._lingering[ch.id] = self.loop.call_later(
                self.settings.linger_s, self._close_channel, ch
            )

    def _close_channel(self, ch: Channel) -> None:
        self._lingering.pop(ch.id, None)
        if ch.refs > 0 or self.channels.get(ch.id) is not ch:
            return
        del self.channels[ch.id]
        self.stats.updates_closed += ch.updates
        self._last_counts.pop(ch.id, None)
        self.rates.pop(ch.id, None)
        if ch.monitor is not None:
            ch.monitor.close()
            ch.monitor = None

    # --- views (SessionHost) ------------------------------------------------------------------

    def verify_token(self, token: str) -> Claims:
        return self.signer.verify(token)

    def open_view(self, claims: Claims, session: Session, att: int) -> View:
        key = ViewKey(claims.ids, claims.mode, claims.max_rate)
        view = self.views.get(key)
        if view is None:
            channels = [self.acquire(self.resolve(i)[0]) for i in claims.ids]
            view = View(key, channels)
            for sid, ch in enumerate(channels):
                ch.views.append((view, sid))
                if view.all_mode:
                    ch.all_views += 1
            self.views[key] = view
        view.attachments.append((session, att))
        return view

    def close_view(self, view: View, session: Session, att: int) -> None:
        view.attachments.remove((session, att))
        if view.attachments:
            return
        del self.views[view.key]
        self._waiting.pop(view, None)
        for sid, ch in enumerate(view.channels):
            ch.views.remove((view, sid))
            if view.all_mode:
                ch.all_views -= 1
            self.release(ch)

    # --- sessions -----------------------------------------------------------------------------

    def add_session(self, session: Session) -> None:
        self.sessions.add(session)

    def remove_session(self, session: Session) -> None:
        if session in self.sessions:
            self.sessions.discard(session)
            session.close()
            self.stats.frames_closed += session.frames_sent
            self.stats.bytes_closed += session.bytes_sent
            self.stats.conflated_closed += session.conflated

    def count_close(self, code: int) -> None:
        self.stats.closes_by_code[code] = self.stats.closes_by_code.get(code, 0) + 1

    # --- the tick -----------------------------------------------------------------------------

    def mark_dirty(self, channel: Channel) -> None:
        self._dirty.append(channel)
        if self._tick_handle is None:
            self._schedule_tick(self._last_tick + self._interval)

    def _schedule_tick(self, when: float) -> None:
        loop = self.loop
        self._tick_handle = loop.call_at(max(when, loop.time()), self.tick)

    def tick(self) -> None:
        """Process every change since the last tick (scheduled by `mark_dirty`)."""
        self._tick_handle = None
        started = time.perf_counter()
        now = self.loop.time()
        self._last_tick = now
        dirty, self._dirty = self._dirty, []
        active, self._waiting = self._waiting, {}
        for ch in dirty:
            mask, ch.dirty = ch.dirty, 0
            for view, sid in ch.views:
                if view.add_change(sid, mask, ch):
                    active[view] = None
            if ch.history:
                ch.history.clear()
        touched: list[Session] = []
        for view in active:
            if not view.pending:
                continue
            if not view.due(now):
                self._waiting[view] = None
                continue
            view.emit(now)
            for session, att in view.attachments:
                if session.collect(att, view):
                    touched.append(session)
        for session in touched:
            session.flush_tick()
        if self._waiting and self._tick_handle is None:
            self._schedule_tick(min(v.next_due for v in self._waiting))
        self._record_tick(time.perf_counter() - started)

    def _record_tick(self, seconds: float) -> None:
        stats = self.stats
        stats.ticks += 1
        stats.tick_seconds += seconds
        ms = seconds * 1000.0
        for i, bound in enumerate(TICK_BUCKETS_MS):
            if ms <= bound:
                stats.tick_buckets[i] += 1
                return
        stats.tick_buckets[-1] += 1

    # --- housekeeping: heartbeats, stalls, rates, loop lag ------------------------------------

    def _schedule_housekeeping(self, when: float) -> None:
        self._housekeeping = self.loop.call_at(when, self._run_housekeeping, when)

    def _run_housekeeping(self, expected: float) -> None:
        loop = self.loop
        now = loop.time()
        # How late this timer ran is how long the event loop was busy: DESIGN.md section 9
        # (aioca overload made timers seconds late and HTTP stop answering).
        self._lag_window = [*self._lag_window[-9:], max(0.0, now - expected)]
        self.stats.loop_lag = max(self._lag_window)
        mono = time.monotonic()
        for session in list(self.sessions):
            session.housekeeping(mono)
        counts = {cid: ch.updates for cid, ch in self.channels.items()}
        self.rates = {cid: n - self._last_counts.get(cid, n) for cid, n in counts.items()}
        self._last_counts = counts
        self._schedule_housekeeping(now + 1.0)

    # --- control plane ------------------------------------------------------------------------

    async def get(self, channel_id: str, timeout: float) -> tuple[str, Reading]:
        canonical, backend, name = self.resolve(channel_id)
        ch = self.channels.get(canonical)
        reading = ch.reading() if ch is not None else None
        if reading is not None:
            self.stats.cache_gets += 1
        else:
            self.stats.upstream_gets += 1
            reading = await backend.get(name, timeout)
        if reading.meta.writable and not self.writes_allowed(canonical):
            reading.meta = reading.meta.replace(writable=False)
        return canonical, reading

    async def put(self, channel_id: str, value: Any, wait: bool, timeout: float, who: str) -> str:
        canonical, backend, name = self.resolve(channel_id)
        ch = self.channels.get(canonical)
        old = ch.value if ch is not None and ch.state == ConnState.CONNECTED else "<not cached>"
        self.stats.puts += 1
        result = "ok"
        try:
            if not self.writes_allowed(canonical):
                raise WriteDenied(
                    f"writes to {canonical} are not allowed by this server's write rules"
                    + ("" if self.settings.write_rules else " (writes are disabled)")
                )
            await backend.put(name, value, wait, timeout)
        except PvwireError as exc:
            self.stats.put_errors += 1
            result = f"{exc.code}: {exc}"
            raise
        finally:
            audit.info(
                "put who=%s channel=%s old=%s new=%s wait=%s result=%s",
                who,
                canonical,
                _short(old),
                _short(value),
                wait,
                result,
            )
        return canonical

    def search(self, pattern: str, limit: int) -> list[str]:
        """Glob over the catalogue, active channels and sim kinds; a pattern without a scheme
        also matches names under any scheme."""
        candidates: set[str] = set(self.channels)
        for cid in self.settings.catalogue:
            try:
                candidates.add(self.resolve(cid)[0])
            except PvwireError:
                log.warning("catalogue entry %r is not a valid channel id", cid)
        for scheme, backend in self.backends.items():
            candidates.update(f"{scheme}://{name}" for name in backend.names())
        has_scheme = "://" in pattern
        found = sorted(
            cid
            for cid in candidates
            if fnmatch.fnmatchcase(cid, pattern)
            or (not has_scheme and fnmatch.fnmatchcase(cid.partition("://")[2], pattern))
        )
        return found[: max(0, limit)]

    def totals(self) -> dict[str, float]:
        """Counters for /metrics: never decreasing over the process's life."""
        s = self.stats
        sessions: Iterable[Session] = self.sessions
        return {
            "updates_in": s.updates_closed + sum(ch.updates for ch in self.channels.values()),
            "frames_out": s.frames_closed + sum(x.frames_sent for x in sessions),
            "bytes_out": s.bytes_closed + sum(x.bytes_sent for x in sessions),
            "conflated": s.conflated_closed + sum(x.conflated for x in sessions),
        }


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
