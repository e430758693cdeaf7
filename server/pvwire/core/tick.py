"""The tick: every change since the last tick, encoded once and handed to each session.

- Upstream callbacks only mark a channel dirty (channel.py). The first dirty channel after a tick
  schedules the next tick: at once when idle, `tick_ms` after the previous tick under load.
- At the tick, first, each dirty channel's last update goes into the history journal, in one
  compiled call for all of them (channel.py, `write_all_pending`). Then each is encoded once;
  each view splices its entries once; each session prefixes a frame header (view.py,
  wire/session.py). No per-client work per update.
- A view limited by `maxRate` that is not due keeps its changes merged and asks for a tick at
  its due time; that timer never delays anyone else's tick (a 0.5 Hz client once cut an
  unrelated 50 Hz client to ~1 frame/s, because the next tick waited for the slow view).
- Exception-safe by construction: a failure is contained to one channel (FAILED, channel.py),
  one view or one session (closed with 1011 so the client resumes from a fresh snapshot); it is
  counted and logged once, and the tick always completes and always schedules the next one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..limits import integer
from ..wire.codes import INTERNAL
from . import fanout
from . import view as view_module
from .channel import Channel, FailureUnit, write_all_pending
from .clients import Client
from .view import View, ViewFailed

__all__ = ["TICK_BUCKETS_MS", "TickStats", "Ticker"]

log = logging.getLogger("pvwire.tick")

LOGGED_ONCE = integer("failures_logged_once")
TICK_BUCKETS_MS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 500.0)


@dataclass
class TickStats:
    ticks: int = 0
    tick_seconds: float = 0.0
    tick_buckets: list[int] = field(default_factory=lambda: [0] * (len(TICK_BUCKETS_MS) + 1))
    failures: dict[str, int] = field(default_factory=dict)  # FailureUnit -> n
    dropped: int = 0  # `ALL` mode updates dropped at its bounds (channel.py, view.py)


class Ticker:
    """The hub's one timer. Implements the channels' `DirtyListener`."""

    def __init__(
        self, tick_ms: float, loop: asyncio.AbstractEventLoop | None = None, records: bool = True
    ) -> None:
        self._interval = tick_ms / 1000.0
        self._loop = loop
        # Whether channels may record history (a budget of 0 gives none): only then does the
        # tick look for their pending updates (~12 ns per dirty channel).
        self.records = records
        self.stats = TickStats()
        self._dirty: list[Channel] = []
        self._waiting: dict[View, None] = {}  # views with changes held back by maxRate
        self._handle: asyncio.TimerHandle | None = None
        self._at = 0.0  # loop time the scheduled tick fires
        self._last_tick = 0.0
        self._logged: set[object] = set()  # what a failure was already logged for

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def forget(self, view: View) -> None:
        """A view is gone: drop what it held back."""
        self._waiting.pop(view, None)

    # --- DirtyListener ------------------------------------------------------------------------

    def mark_dirty(self, channel: Channel) -> None:
        self._dirty.append(channel)
        self._schedule(self._last_tick + self._interval)

    def count_failure(self, unit: FailureUnit) -> None:
        failures = self.stats.failures
        failures[unit] = failures.get(unit, 0) + 1

    def count_dropped(self, n: int) -> None:
        self.stats.dropped += n

    # --- scheduling ---------------------------------------------------------------------------

    def _schedule(self, when: float) -> None:
        """Tick at `when` (or at once if past), unless a tick is already due no later."""
        if self._handle is not None:
            if self._at <= when:
                return
            self._handle.cancel()  # a held-back view's later due time must not delay this
        # `_at` is `when` itself, even when past (the loop runs a past timer at once): storing
        # `max(when, now)` made every later `mark_dirty` of a late tick cancel and re-arm the
        # timer at a later `now` (py-spy: ~6 % of the server at 1,000 PVA PVs), pushing the
        # overdue tick back while the loop drained updates.
        self._at = when
        self._handle = self.loop.call_at(when, self.tick)

    # --- the tick -----------------------------------------------------------------------------

    def tick(self) -> None:
        """Process every change since the last tick (scheduled by `mark_dirty`)."""
        self._handle = None
        started = time.perf_counter()
        now = self.loop.time()
        self._last_tick = now
        dirty, self._dirty = self._dirty, []
        active, self._waiting = self._waiting, {}
        try:
            # The updates recording left in the channels, before anything of them is sent: a
            # client that asks for history after this frame finds them there.
            if self.records:
                self._write_history(dirty)
            self._route_all(dirty, active)
            touched: list[Client] = []
            for view in active:
                self._emit(view, now, touched)
            for session in touched:
                self._guard(session, session.flush_tick)
        finally:
            if view_module.ROUTER is not None:
                # A splice after the tick reads the channels' current state.
                view_module.ROUTER.forget()
            if self._waiting:
                self._schedule(min(v.next_due for v in self._waiting))
            self._record(time.perf_counter() - started)

    def _write_history(self, dirty: list[Channel]) -> None:
        """A failure here (each channel's own is contained by the channel) costs no client its
        frame: it is counted, and the updates not written wait for the next write."""
        try:
            write_all_pending(dirty)
        except Exception as exc:
            self._once("history", "writing the tick's updates into the history failed: %r", exc)
            self.count_failure("history")

    def _route_all(self, dirty: list[Channel], active: dict[View, None]) -> None:
        """Hand each dirty channel's change to each of its views: compiled where built
        (core/_tick.c: each changed LATEST view reads its channels' masks in one pass, and
        ALL-mode views go through `_add_change`), else channel by channel in Python."""
        router = view_module.ROUTER  # read at each tick: a test may run both paths
        if router is None:
            for ch in dirty:
                self._route(ch, active)
            return
        handed: list[tuple[View, int]] = []  # ALL-mode views the compiled route handed
        try:
            router.route(dirty, active, self._add_change, object(), handed)
        except Exception as exc:
            # Not a view's own failure (those are contained in `_add_change`): memory, or a
            # channel or view the compiled path does not take. A channel stays dirty until it
            # is routed; Python routes those (a mask merged twice is the same mask), but not
            # again to the ALL-mode views already handed the change: they append each update.
            self._once("route", "routing the tick's changes failed: %r", exc)
            self.count_failure("view")
            done = set(handed)
            for view, _ in handed:
                if view.pending:
                    active[view] = None
            for ch in dirty:
                if ch.dirty:
                    self._route(ch, active, done)

    def _route(
        self, ch: Channel, active: dict[View, None], done: set[tuple[View, int]] | None = None
    ) -> None:
        """Hand one dirty channel's change to each of its views (but those in `done`)."""
        mask, ch.dirty = ch.dirty, 0
        view: View
        for view, sid in ch.views:  # type: ignore[assignment]  # views are its only sinks
            if done and (view, sid) in done:
                continue
            if self._add_change(view, sid, mask, ch):
                active[view] = None
        if ch.history:
            ch.history.clear()

    def _add_change(self, view: View, sid: int, mask: int, ch: Channel) -> bool:
        """`view.add_change`, its failure contained to the view."""
        try:
            return view.add_change(sid, mask, ch)
        except Exception as exc:
            self._fail_view(view, exc)
            return False

    def _emit(self, view: View, now: float, touched: list[Client]) -> None:
        if not view.pending or not view.attachments:
            return
        if not view.due(now):
            self._waiting[view] = None
            return
        try:
            view.emit(now)
        except Exception as exc:
            self._fail_view(view, exc)
            return
        collect = fanout.COLLECT  # read at each tick: a test may run both paths
        if collect is not None:
            # Compiled: a pvws session is handed the att with no Python call (core/fanout.py).
            try:
                collect(view.attachments, touched, view, self._collect)
            except Exception as exc:  # memory: the clients not handed it miss this change
                self._once("collect", "handing a view's change to its clients failed: %r", exc)
                self.count_failure("session")
            return
        for session, att in view.attachments:
            if self._collect(session, att, view):
                touched.append(session)

    def _collect(self, session: Client, att: int, view: View) -> bool:
        """Per attachment and tick: `collect` called here, not through `_guard` (one call less
        for each PV of each pvws client), with the same containment."""
        try:
            return session.collect(att, view)
        except Exception as exc:
            self._session_failed(session, exc)
            return False

    def _guard(self, session: Client, call: Callable[..., bool | None], *args: object) -> bool:
        """Run one session's part of the tick; a failure closes that session only."""
        try:
            return bool(call(*args))
        except ViewFailed as exc:
            # Entries are encoded when a session first reads them: the failure is its view's.
            self._fail_view(exc.view, exc.__cause__ or exc)
            return False
        except Exception as exc:
            self._session_failed(session, exc)
            return False

    def _session_failed(self, session: Client, exc: Exception) -> None:
        self._once(session, "session %s failed at the tick: %r", session.number, exc)
        self.count_failure("session")
        session.request_close(INTERNAL, "internal error; reconnect to resume")

    def _fail_view(self, view: View, exc: BaseException) -> None:
        """A view that cannot emit: its clients resume from a fresh snapshot on reconnect."""
        self._once(view.key, "subscription of %d channels failed: %r", len(view.key.ids), exc)
        self.count_failure("view")
        view.reset()
        for session, _ in view.attachments:
            session.request_close(INTERNAL, "internal error; reconnect to resume")

    def _once(self, what: object, message: str, *args: object) -> None:
        if what not in self._logged:
            if len(self._logged) < LOGGED_ONCE:  # bounded: a flood of failures logs each once
                self._logged.add(what)
            log.error(message, *args)

    def _record(self, seconds: float) -> None:
        stats = self.stats
        stats.ticks += 1
        stats.tick_seconds += seconds
        ms = seconds * 1000.0
        for i, bound in enumerate(TICK_BUCKETS_MS):
            if ms <= bound:
                stats.tick_buckets[i] += 1
                return
        stats.tick_buckets[-1] += 1
