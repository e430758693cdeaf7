"""Refused authentications: each one a security event, written to the audit file and counted.

A forged, expired or misaddressed token, or a proxy's user header from an address that is not a
trusted proxy, is what an attacker's probing looks like; it must leave a trace. But whoever can
reach the server can send bad tokens as fast as it answers them, so what is written is
bounded: a token bucket per reason and source (the client's address, an IPv6 client's /64 by
access/bound_key.py, or the user for puts)
lets `burst` lines through, then `rate` per second; past that, refusals are only counted, and
one summary line per reason and `interval` says how many were left out. A bucket per source, so
that one client's flood does not hide another's refusals; at most `refusal_log_sources` of them
(the least recently refused forgotten first). Beside them a bucket per reason, whatever the
source (`reason_burst`, then `reason_rate` per second, above one source's rate): sources that
rotate (a new address for each request: the whole of 127.0.0.0/8 is one machine's, and an IPv6
client has a /64) each come with a fresh source bucket, so only this bounds what they write, to
`reason_burst + reason_rate x seconds` lines per reason. A line is written when both buckets
have room. The counters (`/metrics`) see every refusal.

Reasons come from a fixed allow-list (`REASONS`), so neither the audit file nor the metrics can
be grown by what a client sends; the free text of a refusal (the client is told it) stays out.

The same bound serves the puts pvwire refuses (`PUT_REASONS`: its rate limit and its rules,
control.py): each one's audit line goes through `admit`, so a client sending thousands of writes
that the rate limiter refuses leaves a few lines and a summary, with every one counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..limits import integer, number
from .bound_key import bound_key

__all__ = ["PUT_REASONS", "REASONS", "RefusalLog"]

REASONS = (
    "malformed_header",  # not `Authorization: Bearer <token>`
    "no_keys",  # a bearer token, and the server accepts none
    "malformed_token",  # not a JWT at all, or a required claim missing
    "bad_algorithm",  # `alg: none` or an algorithm not configured
    "unknown_key",  # a key id the JWKS does not hold
    "bad_signature",
    "expired",
    "not_yet_valid",  # nbf in the future
    "wrong_audience",
    "wrong_issuer",
    "no_user",  # valid, but names nobody
    "untrusted_proxy_header",  # a user header from an address not listed as a trusted proxy
    # A stream token (ATTACH) that is malformed, forged or of a key the server does not hold.
    # One that expired is not counted: clients renew those in the ordinary course.
    "bad_stream_token",
)

# Puts refused by pvwire itself (errors.py, `refused_by = "pvwire"`), by their error code in
# lower case; refusals by the IOC are each audited (they pass the rate limit first).
PUT_REASONS = (
    "rate_limited",  # past max_puts_per_s for the identity
    "write_denied",  # the access rules do not let the identity write the channel
    "forbidden",  # the access rules do not let the identity read the channel
    "too_many_writes",  # past pvws_writes_in_flight on one `/pvws/pv` connection
)

Write = Callable[[dict[str, Any]], None]

SOURCES = integer("refusal_log_sources")


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float  # when `tokens` was last brought up to date (monotonic seconds)

    def take(self, now: float, rate: float, burst: float) -> bool:
        """Bring the bucket up to date; whether it holds a line (not taken yet)."""
        self.tokens = min(burst, self.tokens + (now - self.at) * rate)
        self.at = now
        return self.tokens >= 1.0


class RefusalLog:
    """Counts every refusal by reason and hands a bounded number of them to `write`."""

    def __init__(
        self,
        write: Write | None = None,
        rate: float = number("refusal_log_rate"),
        burst: int = integer("refusal_log_burst"),
        interval: float = number("refusal_log_interval_s"),
        clock: Callable[[], float] = time.monotonic,
        reasons: tuple[str, ...] = REASONS,
        event: str = "auth_refused",
        reason_rate: float = number("refusal_log_reason_rate"),
        reason_burst: int = integer("refusal_log_reason_burst"),
    ) -> None:
        self._write = write
        self.rate, self.burst, self.interval = rate, burst, interval
        self.reason_rate, self.reason_burst = reason_rate, reason_burst
        self._clock = clock
        self.reasons, self.event = reasons, event
        self.counts: dict[str, int] = dict.fromkeys(reasons, 0)
        self._buckets: OrderedDict[tuple[str, str], _Bucket] = OrderedDict()  # (reason, source)
        self._by_reason: dict[str, _Bucket] = {}
        self._suppressed: dict[str, int] = {}  # reason -> refusals left out since the summary
        self._summary_due: float | None = None  # when the pending summary is to be written
        self._timer: asyncio.TimerHandle | None = None

    def refused(
        self, reason: str, address: str, operation: str, detail: str = "", user: str = ""
    ) -> None:
        if self.admit(reason, bound_key(address)):
            self._emit(
                {"event": self.event, "reason": reason, "address": address,
                 "operation": operation, "user": user or None, "detail": detail[:200]}
            )  # fmt: skip

    def admit(self, reason: str, source: str = "") -> bool:
        """Count a refusal for `reason` by `source`; whether its line may be written now (else
        it is left out and counted in the next summary)."""
        if reason not in self.counts:
            raise ValueError(f"refusal reason {reason!r} is not one of {self.reasons}")
        self.counts[reason] += 1
        now = self._clock()
        if self._summary_due is not None and now >= self._summary_due:
            self.flush()  # no event loop to do it on time (or it is late): do it now
        key = (reason, source)
        b = self._buckets.get(key)
        if b is None:
            if len(self._buckets) >= SOURCES:
                self._buckets.popitem(last=False)
            b = self._buckets[key] = _Bucket(float(self.burst), now)
        else:
            self._buckets.move_to_end(key)
        r = self._by_reason.get(reason)
        if r is None:
            r = self._by_reason[reason] = _Bucket(float(self.reason_burst), now)
        # Both brought up to date, whichever says no; a line takes from both.
        source_room = b.take(now, self.rate, self.burst)
        if r.take(now, self.reason_rate, self.reason_burst) and source_room:
            b.tokens -= 1.0
            r.tokens -= 1.0
            return True
        self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
        if self._summary_due is None:
            self._summary_due = now + self.interval
            with contextlib.suppress(RuntimeError):  # no running loop: the next refusal flushes
                loop = asyncio.get_running_loop()
                self._timer = loop.call_later(self.interval, self.flush)
        return False

    def flush(self) -> None:
        """One summary line for each reason with refusals left out since the last one."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._summary_due = None
        suppressed, self._suppressed = self._suppressed, {}
        for reason, n in suppressed.items():
            self._emit(
                {"event": f"{self.event}_summary", "reason": reason,
                 "suppressed": n, "interval_s": self.interval}
            )  # fmt: skip

    def close(self) -> None:
        self.flush()

    def _emit(self, record: dict[str, Any]) -> None:
        if self._write is not None:
            now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
            self._write({"time": now, **record})
