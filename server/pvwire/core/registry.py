"""The registry: which channels and views exist, and who holds them.

- Channels are refcounted by the views that hold them; the first view opens the upstream monitor,
  the last one to go lets it linger `linger_s` before closing (a page reload does not reconnect).
- Views are shared by every attachment of the same channel list and options (the fan-out case).
- Every monitored channel records its history (core/history/) from its first holder on, while
  the store's budget allows; a closed channel's history stays there until the budget needs it.
- A channel that no server answers for `not_found_s` turns NOT_FOUND and keeps searching, so a
  script or a page can tell a typo from a quiet PV.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from ..config import Settings
from ..ids import parse_id
from ..model import ConnState
from ..upstream.base import Backend
from .archive import Archive
from .channel import Channel, DirtyListener
from .clients import Client
from .history import HistoryStore
from .view import View, ViewKey

__all__ = ["Registry"]

log = logging.getLogger("pvwire.registry")


class Registry:
    def __init__(
        self,
        backends: Mapping[str, Backend],
        settings: Settings,
        listener: DirtyListener,
        loop: asyncio.AbstractEventLoop | None = None,
        history: HistoryStore | None = None,
        archive: Archive | None = None,
    ) -> None:
        self.backends = dict(backends)
        self.archive = archive  # behind the history: views' backfills reach into it
        self.settings = settings
        self._listener = listener
        self._loop = loop
        self.channels: dict[str, Channel] = {}
        self.views: dict[ViewKey, View] = {}
        self._lingering: dict[str, asyncio.TimerHandle] = {}
        self._searching: dict[Channel, float] = {}  # opened, not connected yet -> opened at
        self.updates_closed = 0  # updates of channels already closed, so totals never go down
        self.history = history or HistoryStore(
            int(settings.history_mb * (1 << 20)), settings.history_array_max
        )

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    # --- ids ---------------------------------------------------------------------------------

    def resolve(self, channel_id: str) -> tuple[str, Backend, str]:
        """(canonical id, backend, name); raises BadChannelId, also for a name its backend
        knows can never work, so GraphQL, `/stream` and pvws all refuse it the same way."""
        scheme, name = parse_id(channel_id, self.settings.default_scheme, self.backends)
        backend = self.backends[scheme]
        backend.check(name)
        return f"{scheme}://{name}", backend, name

    # --- channels -----------------------------------------------------------------------------

    def acquire(self, canonical_id: str) -> Channel:
        ch = self.channels.get(canonical_id)
        if ch is None:
            _, backend, name = self.resolve(canonical_id)
            ch = Channel(canonical_id, backend, name, self._listener)
            self.channels[canonical_id] = ch
            self._searching[ch] = self.loop.time()
            try:
                ch.record_into(self.history.attach(canonical_id))
                ch.monitor = backend.monitor(name, ch)
            except BaseException:
                self._close_channel(ch)  # no ref taken: nothing of it stays behind
                raise
        else:
            if handle := self._lingering.pop(canonical_id, None):
                handle.cancel()
            if ch.recorder is None:  # refused before: the budget may have room now
                ch.record_into(self.history.attach(canonical_id))
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
        ch.retire()
        self._searching.pop(ch, None)
        self.updates_closed += ch.updates
        if ch.recorder is not None:
            recorder = ch.recorder
            ch.record_into(None)
            self.history.detach(recorder)
        if ch.monitor is not None:
            monitor, ch.monitor = ch.monitor, None
            try:
                monitor.close()
            except Exception:
                log.exception("closing the upstream monitor of %s failed", ch.id)

    def check_not_found(self, now: float) -> None:
        """Once a second: channels still searching after `not_found_s` turn NOT_FOUND."""
        limit = self.settings.not_found_s
        for ch, opened in list(self._searching.items()):
            if ch.state != ConnState.CONNECTING:
                del self._searching[ch]
            elif now - opened >= limit:
                del self._searching[ch]
                ch.on_connection(
                    ConnState.NOT_FOUND, f"not found (no IOC answered for {limit:g} s)"
                )

    def close_all(self) -> None:
        for handle in self._lingering.values():
            handle.cancel()
        for ch in list(self.channels.values()):
            ch.refs = 0
            self._close_channel(ch)

    # --- views --------------------------------------------------------------------------------

    def open_view(self, key: ViewKey, session: Client, att: int) -> View:
        """Attach `session`'s `att` to the view of `key`, made on first use; raises the
        PvwireError of a channel that cannot be opened, holding nothing then."""
        return self.open_view_of(key, [], session, att)

    def open_view_of(self, key: ViewKey, held: list[Channel], session: Client, att: int) -> View:
        """As `open_view`, with `held` the channels of `key.ids` acquired already (one
        reference each, which the view takes over, or gives back if it is open already)."""
        view = self.views.get(key)
        if view is not None:
            for ch in held:
                self.release(ch)
        else:
            channels = held
            try:
                # All of them, or the rest (the view was open when the attachment began and
                # closed while it waited for its turn).
                for i in key.ids[len(channels) :]:
                    channels.append(self.acquire(self.resolve(i)[0]))
            except BaseException:
                # The channels acquired before the one that failed are let go again: kept, their
                # monitors never closed, and each retry of the client held them once more.
                for ch in channels:
                    self.release(ch)
                raise
            view = View(key, channels)
            view.archive = self.archive
            view.link()
            self.views[key] = view
        view.attachments[(session, att)] = None
        return view

    def close_view(self, view: View, session: Client, att: int) -> bool:
        """Detach; True if that was the view's last attachment and it is gone."""
        del view.attachments[(session, att)]
        if view.attachments:
            return False
        del self.views[view.key]
        view.unlink()
        for ch in view.channels:
            self.release(ch)
        return True
