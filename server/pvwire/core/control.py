"""The control plane's operations on channels: get, put (audited), search; each for an identity,
under the access rules (access/rules.py).

Gets on a monitored channel are answered from the cache, without an upstream round trip (the
Reflective Servers result: a cached get costs nothing upstream).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..access.audit import AuditLog
from ..access.identity import Identity
from ..access.ratelimit import RateLimiter
from ..access.refusals import PUT_REASONS, RefusalLog
from ..access.rules import Access, RulesFile, split_field
from ..config import CatalogueFile
from ..errors import (
    Forbidden,
    PutRejected,
    PvwireError,
    RateLimited,
    TooManyChannels,
    WriteDenied,
)
from ..model import ConnState, Reading
from ..upstream.ca_identity import check_user_name
from .address_channels import AddressChannels
from .registry import Registry

__all__ = ["Control", "ControlStats"]

log = logging.getLogger("pvwire.control")


@dataclass
class ControlStats:
    cache_gets: int = 0
    upstream_gets: int = 0
    puts: int = 0
    put_errors: int = 0


class Control:
    def __init__(
        self,
        registry: Registry,
        rules: RulesFile,
        audit: AuditLog,
        puts: RateLimiter,
        held: AddressChannels | None = None,
    ) -> None:
        self._registry = registry
        # A get of a channel not monitored holds an upstream channel of its own while it runs.
        self._held = held
        self.rules = rules
        self._audit = audit
        self._puts = puts
        # Puts refused by pvwire (rate limit, rules): each counted, their audit lines bounded.
        self.put_refusals = RefusalLog(audit.refusal, reasons=PUT_REASONS, event="put_refused")
        self.stats = ControlStats()
        path = registry.settings.catalogue_file
        self.catalogue_file = CatalogueFile(Path(path)) if path else None
        self._file_ids: frozenset[str] = frozenset()  # the file's ids, resolved once per load
        self._catalogue_ids: frozenset[str] | None = None  # the settings' ids, once resolved
        self.poll_catalogue()

    def poll_catalogue(self) -> bool:
        """Take in the catalogue file's new contents, if it changed (called every second);
        whether it did."""
        if self.catalogue_file is None or not self.catalogue_file.poll():
            return False
        resolved, bad = set(), []
        for cid in self.catalogue_file.ids:
            try:
                resolved.add(self._registry.resolve(cid)[0])
            except PvwireError:
                bad.append(cid)
        if bad:
            log.warning(
                "catalogue file %s: left out %d entries that are not valid channel ids: %s",
                self.catalogue_file.path,
                len(bad),
                ", ".join(repr(b) for b in bad[:5]) + (" ..." if len(bad) > 5 else ""),
            )
        self._file_ids = frozenset(resolved)
        return True

    def reload_catalogue(self) -> bool:
        """Read the catalogue file again now, changed or not (SIGHUP); whether it was read."""
        if self.catalogue_file is None:
            return False
        self.catalogue_file.request_reload()
        return self.poll_catalogue()

    def access(self, identity: Identity, canonical_id: str) -> Access:
        return self.rules.rules.access(identity, canonical_id)

    def require_read(self, identity: Identity, ids: list[str]) -> None:
        """Raise Forbidden naming the channels `identity` may not read (canonical ids)."""
        denied = [i for i in ids if self.access(identity, i) == Access.NONE]
        if denied:
            shown = ", ".join(denied[:5]) + (
                f" and {len(denied) - 5} more" if len(denied) > 5 else ""
            )
            raise Forbidden(f"{identity.describe()} may not read {shown}")

    async def get(self, channel_id: str, timeout: float, identity: Identity) -> tuple[str, Reading]:
        registry = self._registry
        canonical, backend, name = registry.resolve(channel_id)
        access = self.access(identity, canonical)
        if access == Access.NONE:
            raise Forbidden(f"{identity.describe()} may not read {canonical}")
        ch = registry.channels.get(canonical)
        reading = ch.reading() if ch is not None else None
        if reading is not None:
            self.stats.cache_gets += 1
        else:
            held, address = self._held, identity.address
            if held is not None and (refused := held.take(address, (canonical,))) is not None:
                raise TooManyChannels(refused)
            self.stats.upstream_gets += 1
            try:
                reading = await backend.get(name, timeout)
            finally:
                if held is not None:
                    held.give_back(address, (canonical,))
        reading.meta = reading.meta.for_client(access == Access.WRITE)
        return canonical, reading

    async def put(
        self, channel_id: str, value: Any, wait: bool, timeout: float, identity: Identity
    ) -> str:
        registry = self._registry
        self.stats.puts += 1
        started = time.perf_counter()
        # Every way out is audited with what really happened, an id that names no channel
        # included, and anything but success counts as an error: the audit file is the record
        # of who asked for what.
        canonical, old, result, code, refused_by = channel_id, None, "cancelled", "", ""
        try:
            canonical, backend, name = registry.resolve(channel_id)
            ch = registry.channels.get(canonical)
            old = ch.value if ch is not None and ch.state == ConnState.CONNECTED else None
            if not self._puts.take(identity.rate_key):
                raise RateLimited(
                    f"{identity.describe()} sent more than {self._puts.rate:g} puts per second"
                )
            self._check_write(identity, canonical)
            if backend.forwards_identity:
                user = self._user_at_ioc(identity, canonical)
                await backend.put_as(user, name, value, wait, timeout)
            else:
                await backend.put(name, value, wait, timeout)
            result = "ok"
        except PvwireError as exc:
            result, code, refused_by = str(exc), exc.code, exc.refused_by
            raise
        except asyncio.CancelledError:
            # The caller went away (the HTTP client closed, the server stops); whether the
            # upstream applied the value is unknown. Stays "cancelled" and propagates.
            raise
        except Exception as exc:
            # A fault, not an answer: logged once with its trace, and the caller gets a plain
            # PUT_FAILED (putMany's other puts go on) rather than an internal error.
            log.exception("put to %s failed", canonical)
            result, code = f"error: {type(exc).__name__}", PutRejected.code
            raise PutRejected(
                f"put to {canonical} failed: internal error ({type(exc).__name__})"
            ) from exc
        finally:
            if result != "ok":
                self.stats.put_errors += 1
            # A refusal by pvwire is what a flood of writes makes (the rate limiter refuses
            # all but a few): its line is written only while its kind is not flooding.
            bounded = refused_by == "pvwire" and code.lower() in self.put_refusals.counts
            if not bounded or self.put_refusals.admit(code.lower(), identity.rate_key):
                self._audit.put(
                    identity,
                    canonical,
                    old,
                    value,
                    result,
                    code,
                    time.perf_counter() - started,
                    wait,
                    refused_by=refused_by,
                )
        return canonical

    def refused_put(
        self, channel_id: str, value: Any, identity: Identity, reason: str, message: str
    ) -> None:
        """A put refused before it was tried (one of refusals.PUT_REASONS): counted, and audited
        as the others pvwire refuses, bounded under a flood."""
        if self.put_refusals.admit(reason, identity.rate_key):
            with contextlib.suppress(PvwireError):  # else audited under the id as given
                channel_id = self._registry.resolve(channel_id)[0]
            self._audit.put(
                identity, channel_id, None, value, message, reason.upper(), 0.0, False, "pvwire"
            )

    @staticmethod
    def _user_at_ioc(identity: Identity, canonical: str) -> str:
        """The name a forwarded put carries to the IOC: the user's (JWT or trusted proxy alike).
        Anonymous puts are refused: the IOC would see pvwire's own account for a writer nobody
        knows, which is what forwarding exists to end (docs/ACCESS.md)."""
        if identity.anonymous:
            raise WriteDenied(
                f"anonymous writes to {canonical} are refused: writes carry the writer's name "
                "to the IOC (--forward-identity); sign in"
            )
        # Before the backend's work for the put (a get for the type, a PVA search), not after.
        check_user_name(identity.user)
        return identity.user

    def _check_write(self, identity: Identity, canonical: str) -> None:
        access = self.access(identity, canonical)
        if access == Access.WRITE:
            return
        who = identity.describe()
        if not self.rules.rules.may_write_somewhere():
            raise WriteDenied(f"writes to {canonical} are not allowed (writes are disabled)")
        _, field = split_field(canonical)
        if field and self.access(identity, split_field(canonical)[0]) == Access.WRITE:
            raise WriteDenied(
                f"{who} may write {split_field(canonical)[0]} but not its field .{field}: "
                "field writes need a rule that names the field"
            )
        raise WriteDenied(f"{who} may not write {canonical} (access rules grant {access.name})")

    def search(self, pattern: str, limit: int, identity: Identity) -> list[str]:
        """Glob over the catalogue, active channels and sim kinds, minus what `identity` may not
        read; a pattern without a scheme also matches names under any scheme."""
        found = [cid for cid in self.matching(pattern) if self.access(identity, cid) != Access.NONE]
        return found[: max(0, limit)]

    def matching(self, pattern: str) -> list[str]:
        """The known ids `pattern` matches (catalogue, active channels, sim kinds), sorted."""
        has_scheme = "://" in pattern
        return sorted(
            cid
            for cid in self.known()
            if fnmatch.fnmatchcase(cid, pattern)
            or (not has_scheme and fnmatch.fnmatchcase(cid.partition("://")[2], pattern))
        )

    def known(self) -> set[str]:
        """Every id the server knows: the catalogue (settings and file), active channels and
        the backends' own names (sim kinds)."""
        registry = self._registry
        candidates: set[str] = set(registry.channels) | self._file_ids | self._catalogued()
        for scheme, backend in registry.backends.items():
            candidates.update(f"{scheme}://{name}" for name in backend.names())
        return candidates

    def knows(self, canonical_id: str) -> bool:
        """`canonical_id` is one of `known()`, found without listing them."""
        registry = self._registry
        if canonical_id in registry.channels or canonical_id in self._file_ids:
            return True
        if canonical_id in self._catalogued():
            return True
        scheme, _, name = canonical_id.partition("://")
        backend = registry.backends.get(scheme)
        return backend is not None and name in backend.names()

    def _catalogued(self) -> frozenset[str]:
        """The settings' catalogue, resolved once (the settings do not change while serving)."""
        if self._catalogue_ids is None:
            resolved = set()
            for cid in self._registry.settings.catalogue:
                try:
                    resolved.add(self._registry.resolve(cid)[0])
                except PvwireError:
                    log.warning("catalogue entry %r is not a valid channel id", cid)
            self._catalogue_ids = frozenset(resolved)
        return self._catalogue_ids
