"""Reading archivers: `getData.raw` over HTTP, async, each answer parsed as it arrives by the
bounded PB reader (aa/pb.py), as untrusted as any network input (DESIGN.md section 7e).

Every read belongs to a `Reach`: one request's deadline (`archive_timeout_s`, waiting for a
turn included, so a trickling archiver costs that at most), its bytes (`archive_request_bytes`
over all its reads) and its identity, whose reads take turns (`archive_fetches_per_identity`)
as each archiver's do (`archive_fetches_per_archiver`, over every client). What goes wrong is an
`ArchiveMissing` with the reason, never an exception of another kind and never a wait past the
deadline: the caller answers the recent part and says why the archive part is missing.

An archiver that failed (no connection, no answer in time, an HTTP error) is left alone for
`archive_retry_s`: reads meanwhile are missing at once, with the reason, rather than each
waiting its deadline. A malformed or oversized answer is that read's failure only.

Answers are cached by what was asked (archiver, PV, operator, range; `archive_cache_mb`), and
a read that is already under way is shared, not repeated: a hundred browsers opening the same
plot cost the archiver one read."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass

import httpx
import numpy as np

from ...aa.operators import Series
from ...aa.pb import PbError, PbReader
from ...aa.times import iso
from ...limits import integer, number
from .cache import ByteCache
from .routes import Archiver, pv_name
from .series import ArchiveRefused, Collected

__all__ = ["OUTCOMES", "ArchiveClient", "ArchiveMissing", "Reach"]

log = logging.getLogger("pvwire.archive")

NS = 1_000_000_000
REQUEST_BYTES = integer("archive_request_bytes")
SAMPLES = integer("archive_samples")
PER_ARCHIVER = integer("archive_fetches_per_archiver")
PER_IDENTITY = integer("archive_fetches_per_identity")
RETRY_S = number("archive_retry_s")
RECENT_CACHE_S = number("archive_recent_cache_s")
# An answer whose range ends this close to its read may still lack samples the archive has not
# received: cached for RECENT_CACHE_S only.
_RECENT_NS = 60 * NS
# An error answer's text, read for its reason.
_ERROR_TEXT = 512
# A reader waits this much past the deadline for the read to say itself why it missed it.
_GRACE_S = 0.05
# A read that misses its deadline blames the archiver (left alone for RETRY_S, for every
# reader) only when it had this much of the deadline left once its turns came: one left less
# by the turns or its request's earlier reads misses alone.
_BLAME_SHARE = 0.5


# What became of reads (/metrics): answered by the archiver, from the cache, shared with a read
# under way, a PV it lacks (404); or missed: past the deadline, no connection, an HTTP error, a
# malformed answer, one past the bounds, values pvwire cannot use, no turn in time, skipped
# while the archiver is left alone, anything else.
OUTCOMES = ("read", "cached", "shared", "unknown", "timeout", "down", "http_error", "malformed",
            "too_large", "refused", "busy", "skipped", "failed")  # fmt: skip


class ArchiveMissing(Exception):
    """The archive part cannot be had; `str()` says why, for the user."""


class Reach:
    """One request's reads of archivers: its deadline, its bytes left, whose they are."""

    def __init__(self, who: str, timeout: float, clock: Callable[[], float] = time.monotonic):
        self.who = who
        self.timeout = timeout
        self._clock = clock
        self.deadline = clock() + timeout
        self.bytes_left = REQUEST_BYTES
        self.samples_left = SAMPLES  # over its reads, as its bytes

    def left(self) -> float:
        return self.deadline - self._clock()

    def expired(self) -> bool:
        return self.left() <= 0


@dataclass(eq=False, slots=True)
class _Flight:
    """A read under way and how many readers wait for it: the last to leave ends it."""

    task: asyncio.Task[Series]
    readers: int = 0


@dataclass(slots=True)
class _Turns:
    """One identity's turns: its semaphore and how many reads hold or wait for it."""

    sem: asyncio.Semaphore
    users: int = 0


class ArchiveClient:
    def __init__(
        self,
        cache_bytes: int,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._http = httpx.AsyncClient(
            transport=transport,
            timeout=None,  # each read's Reach bounds it, connecting included
            follow_redirects=False,
            trust_env=False,  # an archiver is on the control network, never behind a proxy
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=32),
        )
        self._clock = clock
        self.cache: ByteCache[Series] = ByteCache(cache_bytes, clock)
        self._flights: dict[Hashable, _Flight] = {}
        self._archivers: dict[str, asyncio.Semaphore] = {}
        self._identities: dict[str, _Turns] = {}
        self._failing: dict[str, tuple[float, str]] = {}  # url -> (until, why)
        # Reads by outcome, for /metrics: read, cached, shared, and each way of failing.
        self.outcomes: dict[str, int] = {}

    async def close(self) -> None:
        for flight in list(self._flights.values()):
            flight.task.cancel()
        await self._http.aclose()

    def _count(self, outcome: str) -> None:
        assert outcome in OUTCOMES
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    async def read(self, archiver: Archiver, cid: str, operator: str, start: int, end: int,
                   reach: Reach, max_samples: int = SAMPLES) -> Series:  # fmt: skip
        """The archiver's `getData.raw` of channel `cid` from `start` to `end` (ns), through
        `operator` ("" for none): its samples, or none when it does not know the PV. Raises
        ArchiveMissing saying why, within the reach's deadline."""
        max_samples = max(0, min(max_samples, SAMPLES, reach.samples_left))
        key = (archiver.url, pv_name(cid), operator, start, end, max_samples)
        cached = self.cache.get(key)
        if cached is not None:
            self._count("cached")
            reach.samples_left -= len(cached)
            return cached
        failing = self._failing.get(archiver.url)
        if failing is not None:
            if failing[0] > self._clock():
                self._count("skipped")
                raise ArchiveMissing(f"{failing[1]}; it is asked again {RETRY_S:g} s after "
                                     "(archive_retry_s)")  # fmt: skip
            del self._failing[archiver.url]
        if reach.expired():
            self._count("timeout")
            raise ArchiveMissing(self._late(archiver, reach))
        flight = self._flights.get(key)
        if flight is None:
            task = asyncio.ensure_future(
                self._fetch(archiver, cid, operator, start, end, reach, max_samples)
            )
            flight = self._flights[key] = _Flight(task)
            task.add_done_callback(lambda _: self._landed(key, flight))
        else:
            self._count("shared")
        flight.readers += 1
        try:
            async with asyncio.timeout(reach.left() + _GRACE_S):
                got = await asyncio.shield(flight.task)
            reach.samples_left -= len(got)
            return got
        except TimeoutError:
            self._count("timeout")
            raise ArchiveMissing(self._late(archiver, reach)) from None
        except ArchiveMissing:
            raise
        except Exception as exc:  # contained: the read fails, nothing else does
            self._count("failed")
            log.exception("reading %s from the archiver %s failed", cid, archiver.name)
            raise ArchiveMissing(f"reading the archiver {archiver.name} failed ({exc})") from None
        finally:
            flight.readers -= 1
            if not flight.readers and not flight.task.done():
                # Nobody waits for it any more (a detached backfill, a request gone): its turns
                # go back now, not at its deadline, and a later read of the same starts anew.
                self._landed(key, flight)
                flight.task.cancel()

    def _landed(self, key: Hashable, flight: _Flight) -> None:
        """A read is over: no longer shared; its failure is its readers' (looked at here, so
        that one nobody waits for any more is not reported as never retrieved)."""
        if self._flights.get(key) is flight:
            del self._flights[key]
        task = flight.task
        if task.done() and not task.cancelled():
            task.exception()

    def _late(self, archiver: Archiver, reach: Reach) -> str:
        return f"the archiver {archiver.name} did not answer within {reach.timeout:g} s " + (
            "(archive_timeout_s)"
        )

    def _fail(self, archiver: Archiver, outcome: str, why: str) -> ArchiveMissing:
        """A failure of the archiver itself: it is left alone for RETRY_S."""
        self._count(outcome)
        reason = f"the archiver {archiver.name} {why}"
        if archiver.url not in self._failing:
            log.warning("%s; not asked again for %g s", reason, RETRY_S)
        self._failing[archiver.url] = (self._clock() + RETRY_S, reason)
        return ArchiveMissing(reason)

    async def _fetch(self, archiver: Archiver, cid: str, operator: str, start: int, end: int,
                     reach: Reach, max_samples: int) -> Series:  # fmt: skip
        pv = pv_name(cid)
        params = {"pv": f"{operator}({pv})" if operator else pv, "from": iso(start),
                  "to": iso(end)}  # fmt: skip
        async with self._turns(archiver, reach):
            given = reach.left()
            try:
                async with asyncio.timeout(given):
                    got = await self._get(archiver, params, reach, max_samples)
            except TimeoutError:
                if given < reach.timeout * _BLAME_SHARE:
                    self._count("timeout")
                    raise ArchiveMissing(self._late(archiver, reach)) from None
                late = f"did not answer within {reach.timeout:g} s (archive_timeout_s)"
                raise self._fail(archiver, "timeout", late) from None
            except httpx.HTTPError as exc:
                raise self._fail(archiver, "down", f"cannot be reached ({_said(exc)})") from None
        self._count("read")
        ttl = RECENT_CACHE_S if end > time.time_ns() - _RECENT_NS else float("inf")
        self.cache.put(
            (archiver.url, pv, operator, start, end, max_samples), got, _nbytes(got), ttl
        )
        return got

    async def _get(self, archiver: Archiver, params: dict[str, str], reach: Reach,
                   max_samples: int) -> Series:  # fmt: skip
        url = f"{archiver.url}/data/getData.raw"
        # Uncompressed only: a compressed answer would be inflated before the reader bounds it.
        headers = {"Accept-Encoding": "identity"}
        async with self._http.stream("GET", url, params=params, headers=headers) as response:
            if response.status_code == 404:  # the Archiver Appliance's answer for a PV it lacks
                self._count("unknown")
                return Collected(PbReader()).series()
            if response.status_code != 200:
                text = await _head(response.aiter_bytes())
                if response.status_code >= 500:
                    raise self._fail(archiver, "http_error",
                                     f"answered HTTP {response.status_code}: {text}")  # fmt: skip
                self._count("http_error")
                raise ArchiveMissing(f"the archiver {archiver.name} answered HTTP "
                                     f"{response.status_code}: {text}")  # fmt: skip
            reader = PbReader(max_samples=max_samples, max_bytes=max(reach.bytes_left, 0))
            collected = Collected(reader)
            try:
                async for data in response.aiter_raw():
                    reach.bytes_left -= len(data)
                    collected.feed(data)
                collected.close()
            except PbError as exc:
                bound = "longer than" in str(exc) or "more than" in str(exc)
                self._count("too_large" if bound else "malformed")
                what = "an answer past pvwire's bounds" if bound else "a malformed answer"
                raise ArchiveMissing(f"the archiver {archiver.name} sent {what} ({exc})") from None
            except ArchiveRefused as exc:
                self._count("refused")
                raise ArchiveMissing(str(exc)) from None
            return collected.series()

    @contextlib.asynccontextmanager
    async def _turns(self, archiver: Archiver, reach: Reach) -> AsyncIterator[None]:
        """A turn of the identity's, then of the archiver's, waited for within the deadline:
        not had in time is this read's miss, not the archiver's failure."""
        turns = self._identities.get(reach.who)
        if turns is None:
            turns = self._identities[reach.who] = _Turns(asyncio.Semaphore(PER_IDENTITY))
        sem = self._archivers.get(archiver.url)
        if sem is None:
            sem = self._archivers[archiver.url] = asyncio.Semaphore(PER_ARCHIVER)
        turns.users += 1
        try:
            await self._wait(
                turns.sem,
                reach,
                f"{PER_IDENTITY} archive reads of this identity "
                "were under way (archive_fetches_per_identity)",
            )
            try:
                await self._wait(sem, reach, f"{PER_ARCHIVER} reads of the archiver "
                                             f"{archiver.name} were under way "
                                             "(archive_fetches_per_archiver)")  # fmt: skip
                try:
                    yield
                finally:
                    sem.release()
            finally:
                turns.sem.release()
        finally:
            turns.users -= 1
            if not turns.users:
                del self._identities[reach.who]

    async def _wait(self, sem: asyncio.Semaphore, reach: Reach, busy: str) -> None:
        try:
            async with asyncio.timeout(reach.left()):
                await sem.acquire()
        except TimeoutError:
            self._count("busy")
            raise ArchiveMissing(f"no turn within {reach.timeout:g} s: {busy}") from None


async def _head(chunks: AsyncIterator[bytes]) -> str:
    """The start of an error answer, as text for a reason."""
    got = b""
    async for data in chunks:
        got += data
        if len(got) >= _ERROR_TEXT:
            break
    lines = got[:_ERROR_TEXT].decode("utf-8", "replace").strip().splitlines()
    first = lines[0] if lines else "(no text)"
    return "".join(c if c.isprintable() else "?" for c in first)[:200]


def _said(exc: httpx.HTTPError) -> str:
    return str(exc) or type(exc).__name__


def _nbytes(s: Series) -> int:
    value = s.value.nbytes if isinstance(s.value, np.ndarray) else 64 * len(s)
    return int(s.t.nbytes + s.severity.nbytes + s.status.nbytes + value + 200 * len(s.fields))
