"""The hub: the registry, the tick and the control plane's operations, wired together.

Data flows one way: backend -> channel -> view -> session -> socket. The hub owns the parts and
the housekeeping timer; each part owns its own state (registry.py, tick.py, control.py), and
statistics leave as snapshots (stats.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import itertools
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast

from ..aa.operators import Series
from ..access.audit import AuditLog
from ..access.forwarded import TrustedProxies
from ..access.identity import Identity
from ..access.ratelimit import RateLimiter
from ..access.refusals import RefusalLog
from ..access.rules import Access, RulesFile
from ..config import Settings
from ..errors import PvwireError
from ..model import Reading
from ..upstream.base import Backend
from ..wire.codes import BAD_TOKEN, INTERNAL, TOO_MANY_CHANNELS
from ..wire.session import FORBIDDEN, AttachRefused, Prepared
from ..wire.tokens import Claims, TokenError, TokenExpired, TokenSigner
from .address_channels import AddressChannels
from .archive import Archive, ArchiveMissing, Note, Reach
from .channel import Channel, FailureUnit
from .clients import Client
from .control import Control
from .drain import Drain
from .history import HistorySlice, HistoryStore, NoHistory
from .opener import Opener
from .recorded import Recorded, recorded
from .reduce import Reduction
from .registry import Registry
from .stats import ChannelSnapshot, ClientSnapshot, HubSnapshot
from .subscribe import Registration, StreamOptions, register
from .tick import Ticker
from .view import View, ViewKey

__all__ = ["Hub"]

log = logging.getLogger("pvwire.hub")


class PreparedView:
    """An attachment whose checks passed, its channels opening (`Hub.open_prepared`): it holds
    the address's share of channels from `prepare_view` until it is finished or cancelled."""

    __slots__ = ("address", "held", "key", "taken", "todo")

    def __init__(self, key: ViewKey, address: str, todo: tuple[str, ...]) -> None:
        self.key, self.address = key, address
        self.todo = todo  # the ids to open: none when the view was open already
        self.held: list[Channel] = []  # opened, in `todo`'s order
        self.taken = True  # the address's share is held for it

    @property
    def left(self) -> int:
        """Channels still to open."""
        return len(self.todo) - len(self.held)


class Hub:
    def __init__(
        self, backends: Mapping[str, Backend], settings: Settings, signer: TokenSigner
    ) -> None:
        self.settings = settings
        self.signer = signer
        self.history_store = HistoryStore(
            int(settings.history_mb * (1 << 20)), settings.history_array_max
        )
        self.ticker = Ticker(settings.tick_ms, records=bool(self.history_store.by_slot))
        # The facility's archive behind the history (--archiver; core/archive/).
        self.archive = Archive(settings)
        self.registry = Registry(
            backends, settings, self.ticker, history=self.history_store, archive=self.archive
        )
        # A client known only as a trusted proxy is nobody's address: neither "this machine"
        # for the admin views nor any rule's `hosts`.
        self._proxies = TrustedProxies(settings.trusted_proxies)
        self.rules = RulesFile(settings.access_rules, settings.write_rules, self._proxies)
        self.audit = AuditLog(settings.audit_log)
        # Refused authentications, audited and counted (access/refusals.py): the bearer tokens
        # the authenticator refuses, and the stream tokens refused here.
        self.refusals = RefusalLog(self.audit.refusal)
        puts = RateLimiter(settings.max_puts_per_s, 2 * settings.max_puts_per_s)
        # Distinct upstream channels per client address, over every endpoint and the gets.
        self.address_channels = AddressChannels(settings.max_channels_per_address)
        self.control = Control(self.registry, self.rules, self.audit, puts, self.address_channels)
        self.sessions: set[Client] = set()  # of both endpoints
        # Each open attachment's channels, held for the address its session had at the open.
        self._held: dict[tuple[Client, int], tuple[str, tuple[str, ...]]] = {}
        # Channels of ATTACHes and pvws subscribes open for a time per loop pass (core/opener.py).
        self.opener = Opener()
        self.started = time.time()
        self.loop_lag = 0.0  # seconds, worst in the last window
        self._lag_window: list[float] = []
        self._rates: dict[str, float] = {}  # channel id -> updates/s over the last second
        self._last_counts: dict[str, int] = {}
        self._closed_sessions = ClientSnapshot(0, "", 0, 0, 0, 0, 0, 0, 0.0)  # running sums
        self._closes_by_code: dict[int, int] = {}
        self._housekeeping: asyncio.TimerHandle | None = None
        self._client_numbers = itertools.count(1)
        self._pinned: set[str] = set()  # ids held for --history-channels, acquired once each
        self._drain = Drain(lambda: list(self.sessions), settings.drain_delay_s,
                            settings.drain_window_s)  # fmt: skip

    # --- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._schedule_housekeeping(loop, loop.time())
        self._pin_history()

    def _pin_history(self, at_start: bool = True) -> None:
        """`--history-channels`: monitored from start, held for good, their history never
        reclaimed. A glob is matched against the ids the server knows (catalogue, sim kinds),
        again whenever the catalogue file is read anew: ids it adds are held from then on, and
        ids it drops stay held (a history someone asked to keep is not ended by an edit)."""
        for pattern in self.settings.history_channels:
            ids = self.control.matching(pattern) if any(c in pattern for c in "*?[") else [pattern]
            if not ids and at_start:
                log.warning("--history-channels %r matches no known channel id", pattern)
            for i in ids:
                try:
                    canonical = self.registry.resolve(i)[0]
                    if canonical in self._pinned:
                        continue  # acquired once: another acquire would hold it twice
                    ch = self.registry.acquire(canonical)
                except PvwireError as exc:
                    log.error("--history-channels %r: %s", i, exc)
                    continue
                self._pinned.add(canonical)
                if ch.recorder is not None:
                    ch.recorder.pinned = True

    async def stop(self) -> None:
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        self.ticker.stop()
        self.registry.close_all()
        for backend in self.registry.backends.values():
            await backend.close()
        self.refusals.close()
        self.control.put_refusals.close()
        self.audit.close()
        await self.archive.close()

    # --- the drain (core/drain.py) ------------------------------------------------------------

    @property
    def draining(self) -> bool:
        """SIGTERM came: `/readyz` answers 503 (serving goes on until the drain's closes)."""
        return not self._drain.ready

    @property
    def refusing_connections(self) -> bool:
        """The drain is closing every WebSocket: new ones are refused."""
        return self._drain.refuses_new

    def begin_drain(self) -> bool:
        """SIGTERM: True if a drain starts (then `run_drain`); a second one hurries it."""
        return self._drain.begin()

    async def run_drain(self) -> None:
        """The drain's delay and paced closes; returns when every client was asked to close."""
        await self._drain.run()

    # --- the control plane --------------------------------------------------------------------

    def resolve(self, channel_id: str) -> tuple[str, Backend, str]:
        return self.registry.resolve(channel_id)

    async def get(self, channel_id: str, timeout: float, identity: Identity) -> tuple[str, Reading]:
        return await self.control.get(channel_id, timeout, identity)

    async def put(
        self, channel_id: str, value: Any, wait: bool, timeout: float, identity: Identity
    ) -> str:
        return await self.control.put(channel_id, value, wait, timeout, identity)

    def refused_put(
        self, channel_id: str, value: Any, identity: Identity, reason: str, message: str
    ) -> None:
        """A put an endpoint refused before trying it (refusals.PUT_REASONS): counted and
        audited as pvwire's other refusals are (control.py)."""
        self.control.refused_put(channel_id, value, identity, reason, message)

    def search(self, pattern: str, limit: int, identity: Identity) -> list[str]:
        return self.control.search(pattern, limit, identity)

    def subscribe(
        self, ids: Sequence[str], identity: Identity, options: StreamOptions
    ) -> Registration:
        """Register a stream for `identity` (core/subscribe.py); raises a PvwireError for an id
        that does not resolve or that the identity may not read."""
        canonical = [self.registry.resolve(i)[0] for i in ids]
        return register(
            self.control, self.signer, self.registry.channels, canonical, identity, options
        )

    def may_write(self, identity: Identity, canonical_id: str) -> bool:
        """The access rules let `identity` write the channel (the upstream may still refuse)."""
        return self.control.access(identity, canonical_id) == Access.WRITE

    def may_read(self, identity: Identity, canonical_id: str) -> bool:
        """The access rules let `identity` read the channel."""
        return self.control.access(identity, canonical_id) != Access.NONE

    @property
    def writes_enabled(self) -> bool:
        """Some rule lets someone write something."""
        return self.rules.rules.may_write_somewhere()

    def history(
        self, channel_id: str, since: int, until: int, max_points: int, identity: Identity
    ) -> tuple[str, HistorySlice]:
        """The recorded history of a channel between `since` and `until` (ns, IOC time), at
        most `max_points` rows (core/history/reading.py chooses points or buckets)."""
        cid = self.registry.resolve(channel_id)[0]
        self.control.require_read(identity, [cid])
        return cid, self.history_store.query(cid, since, until, max_points)

    def archive_reach(self, identity: Identity) -> Reach:
        """The bounds of one request's archive reads (core/archive/fetch.py) for `identity`."""
        return self.archive.reach(identity.user or identity.address)

    async def history_spanning(
        self,
        channel_id: str,
        since: int,
        until: int,
        max_points: int,
        identity: Identity,
        reach: Reach,
    ) -> tuple[str, HistorySlice, Note | None]:
        """`history`, reaching past the recent history into the channel's archive (when an
        archiver holds it): the archive's part first, joined at the seam, and what became of
        that part (None: no archiver holds the channel). Raises as `history` does, NoHistory
        only when neither holds anything. Without `since` (0), the server's own history alone:
        the archive is read for a span someone named, not from 1970."""
        cid = self.registry.resolve(channel_id)[0]
        self.control.require_read(identity, [cid])
        if self.archive.route(cid) is None or since <= 0:
            return cid, self.history_store.query(cid, since, until, max_points), None
        try:
            own: HistorySlice | None = self.history_store.query(cid, since, until, max_points)
        except NoHistory:
            own = None
        rows, note = await self.archive.history(cid, own, since, until, max_points, reach)
        assert rows is not None  # an archiver holds it: its rows, or a gap saying why not
        return cid, rows, note

    def archive_holds(self, canonical_id: str) -> bool:
        """An archiver holds the channel's past (--archiver)."""
        return self.archive.route(canonical_id) is not None

    async def read_archive(
        self, canonical_id: str, operator: str, start: int, end: int, reach: Reach
    ) -> Series:
        """The channel's archiver's `getData.raw` from `start` to `end` (ns) through `operator`
        (core/archive/fetch.py); raises ArchiveMissing saying why it cannot be had."""
        archiver = self.archive.route(canonical_id)
        if archiver is None or self.archive.client is None:
            raise ArchiveMissing(f"no archiver holds {canonical_id}")
        return await self.archive.client.read(archiver, canonical_id, operator, start, end, reach)

    def recorded(self, channel_id: str, identity: Identity) -> Recorded:
        """What the Archiver Appliance API reads of a channel (core/recorded.py): its history
        and, while it is open, its state. Raises for an id that does not resolve or that
        `identity` may not read. Opens nothing: a read of the past costs no monitor."""
        cid = self.registry.resolve(channel_id)[0]
        self.control.require_read(identity, [cid])
        return recorded(cid, self.registry.channels.get(cid), self.history_store.get(cid))

    def known_ids(self) -> list[str]:
        """The ids the server knows (catalogue, open channels, sim kinds) and those it holds a
        history of, in no order, whoever may read them: the Archiver Appliance API's PVs (it
        checks READ on those it answers, a slice at a time)."""
        return list(self.control.known() | set(self.history_store.channel_ids()))

    def knows(self, canonical_id: str) -> bool:
        """`canonical_id` is one of `known_ids()`, found without listing them."""
        return self.control.knows(canonical_id) or self.history_store.get(canonical_id) is not None

    def unavailable_schemes(self) -> dict[str, str]:
        """Schemes this process cannot serve (pva:// without its compiled module), with why."""
        return {
            scheme: backend.unavailable
            for scheme, backend in sorted(self.registry.backends.items())
            if backend.unavailable is not None
        }

    def is_admin(self, identity: Identity) -> bool:
        admins = self.settings.admin_groups
        if admins:
            return bool(identity.groups & set(admins))
        return _is_loopback(identity.address) and not self._proxies.lists(identity.address)

    def reload(self) -> None:
        """SIGHUP: read the access rules and the catalogue file again now, even when they look
        unchanged (an edit can keep a file's size and modification time)."""
        self.reload_rules(force=True)
        if self.control.reload_catalogue():
            self._pin_history(at_start=False)

    def reload_rules(self, force: bool = False) -> None:
        """New rules apply to new requests at once and to open attachments here: one whose
        identity may no longer read a channel is ended with 4403 (the rest of its connection
        goes on)."""
        if not self.rules.reload_if_changed(force):
            return
        for session in list(self.sessions):
            # One session's failure is its own: it is closed (1011) and the others are still
            # checked; an exception out of here once left every later session unchecked.
            try:
                for att, claims in list(session.claims.items()):
                    denied = self._denied(claims)
                    if denied:
                        session.end_attachment(att, FORBIDDEN, denied)
            except Exception:
                log.exception("checking session %s against the new rules failed", session.number)
                self.ticker.count_failure("session")
                session.request_close(INTERNAL, "internal error; reconnect to resume")

    def _denied(self, claims: Claims) -> str:
        """Why the identity of `claims` may not read them now, or ""."""
        identity = identity_of(claims)
        rules = self.rules.rules
        for cid in claims.ids:
            if rules.access(identity, cid) == Access.NONE:
                return f"{identity.describe()} may not read {cid}"
        return ""

    # --- sessions (SessionHost) ---------------------------------------------------------------

    def verify_token(self, token: str, address: str = "") -> Claims:
        try:
            return self.signer.verify(token)
        except TokenExpired:
            raise
        except TokenError as exc:
            self.refusals.refused("bad_stream_token", address, "stream attach", str(exc))
            raise

    def open_view(self, claims: Claims, session: Client, att: int) -> View:
        """Open `claims`' view for `session`'s `att` in one step (pvws's one-channel views)."""
        prepared = self.prepare_view(claims, session)
        self.open_prepared(prepared, len(prepared.todo))
        return self.finish_view(prepared, session, att)

    def prepare_view(self, claims: Claims, session: Client) -> PreparedView:
        """The checks of an attachment, before any channel opens: the rules, and the address's
        budget of channels (taken now, so a token still opening holds its share)."""
        identity = identity_of(claims)
        rules = self.rules.rules
        access = [rules.access(identity, cid) for cid in claims.ids]
        if Access.NONE in access:
            cid = claims.ids[access.index(Access.NONE)]
            raise AttachRefused(FORBIDDEN, f"{identity.describe()} may not read {cid}")
        key = ViewKey(
            claims.ids,
            claims.mode,
            claims.max_rate,
            Reduction(claims.max_columns, claims.max_pixels),
            # Metadata's `writable` is the rules' answer for this identity AND the
            # upstream's (PROTOCOL.md section 5): PVA exposes none, so there the rules decide.
            bytes(a == Access.WRITE for a in access),
        )
        address = session.address
        refused = self.address_channels.take(address, claims.ids)
        if refused is not None:
            raise AttachRefused(TOO_MANY_CHANNELS, refused)
        todo = () if key in self.registry.views else claims.ids
        return PreparedView(key, address, todo)

    def open_prepared(self, prepared: Prepared, limit: int) -> int:
        """Open up to `limit` more of `prepared`'s channels; how many were opened."""
        own = cast(PreparedView, prepared)  # only ever one `prepare_view` gave
        todo, held, start = own.todo, own.held, len(own.held)
        with self._given_up_on_failure(own):
            while len(held) < len(todo) and len(held) - start < limit:
                held.append(self.registry.acquire(self.registry.resolve(todo[len(held)])[0]))
        return len(held) - start

    def finish_view(self, prepared: Prepared, session: Client, att: int) -> View:
        """Attach `session`'s `att` to the view whose channels `prepared` opened."""
        own = cast(PreparedView, prepared)
        held, own.held = own.held, []
        with self._given_up_on_failure(own):
            view = self.registry.open_view_of(own.key, held, session, att)
        own.taken = False  # the attachment holds the address's share now
        self._held[(session, att)] = (own.address, own.key.ids)
        return view

    @contextmanager
    def _given_up_on_failure(self, own: PreparedView) -> Iterator[None]:
        try:
            yield
        except PvwireError as exc:
            self.cancel_view(own)
            # A channel this server cannot open (an id its backends refuse, one gone from its
            # catalogue, a scheme it lacks): a refused token, answered for that ATTACH only; the
            # client registers again and `subscribe` names the cause (PROTOCOL.md section 6).
            raise AttachRefused(BAD_TOKEN, f"{exc.code}: {exc}") from exc
        except BaseException:
            self.cancel_view(own)
            raise

    def cancel_view(self, prepared: Prepared) -> None:
        """`prepared` will not be finished (its connection went, a channel failed)."""
        own = cast(PreparedView, prepared)
        held, own.held = own.held, []
        for ch in held:
            self.registry.release(ch)
        if own.taken:
            own.taken = False
            self.address_channels.give_back(own.address, own.key.ids)

    def close_view(self, view: object, session: Client, att: int) -> None:
        """Detach `view`, which `open_view` gave `session` for `att`: each endpoint holds it as
        what its protocol reads of a view (wire/session.py's Source, pvws/pv.py's PvSource)."""
        own = cast(View, view)  # a session only ever holds the views `open_view` gave it
        if (held := self._held.pop((session, att), None)) is not None:
            self.address_channels.give_back(*held)
        if self.registry.close_view(own, session, att):
            self.ticker.forget(own)

    def client_number(self) -> int:
        """A number for a new client of any endpoint, unique in this process (the `server`
        query and the status page key clients by it)."""
        return next(self._client_numbers)

    def add_session(self, session: Client) -> None:
        self.sessions.add(session)

    def remove_session(self, session: Client) -> None:
        if session not in self.sessions:
            return
        self.sessions.discard(session)
        try:
            session.close()
        except Exception:
            log.exception("releasing session %s failed", session.number)
            self.ticker.count_failure("session")
        c = self._closed_sessions
        self._closed_sessions = dataclasses.replace(
            c,
            frames_sent=c.frames_sent + session.frames_sent,
            bytes_sent=c.bytes_sent + session.bytes_sent,
            conflated=c.conflated + session.conflated,
            deliveries=c.deliveries + session.deliveries,
        )

    def count_failure(self, unit: FailureUnit) -> None:
        """A contained failure outside the tick (e.g. a connection's writer), counted with the
        tick's own in `failures_total`."""
        self.ticker.count_failure(unit)

    def count_close(self, code: int) -> None:
        self._closes_by_code[code] = self._closes_by_code.get(code, 0) + 1

    # --- housekeeping: heartbeats, stalls, not-found, rates, loop lag -------------------------

    def _schedule_housekeeping(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        self._housekeeping = loop.call_at(when, self._run_housekeeping, loop, when)

    def _run_housekeeping(self, loop: asyncio.AbstractEventLoop, expected: float) -> None:
        now = loop.time()
        try:
            # How late this timer ran is how long the event loop was busy: DESIGN.md section 9
            # (aioca overload made timers seconds late and HTTP stop answering).
            self._lag_window = [*self._lag_window[-9:], max(0.0, now - expected)]
            self.loop_lag = max(self._lag_window)
            mono = time.monotonic()
            for session in list(self.sessions):
                try:
                    session.housekeeping(mono)
                except Exception:
                    log.exception("housekeeping of session %s failed", session.number)
                    self.ticker.count_failure("session")
                    session.request_close(INTERNAL, "internal error; reconnect to resume")
            self.registry.check_not_found(now)
            self.reload_rules()
            if self.control.poll_catalogue():
                self._pin_history(at_start=False)
            counts = {cid: ch.updates for cid, ch in self.registry.channels.items()}
            self._rates = {cid: n - self._last_counts.get(cid, n) for cid, n in counts.items()}
            self._last_counts = counts
        except Exception:
            log.exception("housekeeping failed")
        finally:
            self._schedule_housekeeping(loop, now + 1.0)

    # --- statistics ---------------------------------------------------------------------------

    @property
    def channel_count(self) -> int:
        """Open upstream channels (`/readyz`), without the cost of a whole snapshot."""
        return len(self.registry.channels)

    def snapshot(self, detail: bool = True) -> HubSnapshot:
        """Everything `/metrics` and the `server` query show, copied out of the live state."""
        channels = self.registry.channels
        sessions = self.sessions
        mono = time.monotonic()
        # Per client and per channel only in detail: /metrics and the status PVs (once a
        # second) read totals, and these cost ~14 us per client and ~10 us per channel.
        clients = tuple(
            ClientSnapshot(
                number=s.number,
                address=s.address,
                attachments=len(s.attachments),
                channels=s.channel_count,
                queued_bytes=s.queued_bytes,
                conflated=s.conflated,
                frames_sent=s.frames_sent,
                bytes_sent=s.bytes_sent,
                connected_seconds=mono - s.connected_at,
                endpoint=s.endpoint,
                identity=", ".join(sorted({identity_of(c).describe() for c in s.claims.values()})),
                deliveries=s.deliveries,
            )
            for s in (sorted(sessions, key=lambda s: s.number) if detail else ())
        )
        upstream = tuple(
            ChannelSnapshot(
                id=cid,
                subscribers=sum(v.subscribers() for v, _ in ch.views),
                updates=ch.updates,
                update_rate=float(self._rates.get(cid, 0)),
                state=ch.state,
                last_update=ch.seconds + ch.nanoseconds * 1e-9 if ch.seconds else None,
            )
            for cid, ch in (sorted(channels.items()) if detail else ())
        )
        closed = self._closed_sessions
        tick = self.ticker.stats
        return HubSnapshot(
            uptime=time.time() - self.started,
            loop_lag=self.loop_lag,
            views=len(self.registry.views),
            ticks=tick.ticks,
            tick_seconds=tick.tick_seconds,
            tick_buckets=tuple(tick.tick_buckets),
            failures=dict(tick.failures),
            closes_by_code=dict(self._closes_by_code),
            control=dataclasses.replace(self.control.stats),
            updates_in=self.registry.updates_closed + sum(ch.updates for ch in channels.values()),
            frames_out=closed.frames_sent + sum(s.frames_sent for s in sessions),
            bytes_out=closed.bytes_sent + sum(s.bytes_sent for s in sessions),
            conflated=closed.conflated + sum(s.conflated for s in sessions),
            deliveries=closed.deliveries + sum(s.deliveries for s in sessions),
            dropped=tick.dropped,
            queued_bytes=sum(s.queued_bytes for s in sessions),
            clients=clients,
            channels=upstream,
            client_count=len(sessions),
            channel_count=len(channels),
            history=self.history_store.stats(),
            auth_refusals=dict(self.refusals.counts),
            put_refusals=dict(self.control.put_refusals.counts),
            upstream_channels={
                scheme: backend.channel_counts()
                for scheme, backend in sorted(self.registry.backends.items())
            },
            peer_refusals={
                scheme: counts
                for scheme, backend in sorted(self.registry.backends.items())
                if (counts := backend.peer_refusals())
            },
            archive_reads=dict(client.outcomes) if (client := self.archive.client) else {},
            archive_cache_bytes=client.cache.used if client else 0,
        )


def identity_of(claims: Claims) -> Identity:
    """The identity a stream token was registered by."""
    return Identity(claims.user, frozenset(claims.groups), claims.auth, claims.address)


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
