"""Times as the Archiver Appliance reads them: `from`, `to` and `at` are ISO 8601 date-times with
their offset (Java's `Instant.parse`: `2026-12-02T10:00:00.000Z`, `...-07:00`; seconds and
1 to 9 decimals optional as `OffsetDateTime.parse` has them), defaults `to` = now + 1 h and
`from` = `to` - 1 day; and times as it writes them. An instant outside the years 1 to 9999
(UTC, once its offset is applied) is refused: nothing here or in PB (a chunk's year) holds it."""

from __future__ import annotations

import datetime
import re
import time

from .pb import year_start

__all__ = ["BadTime", "human", "iso", "parse_instant", "request_range"]

NS = 1_000_000_000

# [0-9], not \d: Python's \d takes every Unicode digit, Java's parser ASCII ones only.
_ISO = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2})"
    r"(?::([0-9]{2})(?:\.([0-9]{1,9}))?)?(Z|[+-][0-9]{2}:[0-9]{2}(?::[0-9]{2})?)"
)
# The instants every reader and writer here can hold: from year 1 to the end of year 9999, UTC.
EARLIEST = year_start(1) * NS
LATEST = year_start(10_000) * NS - 1
_MOST_OFFSET = datetime.timedelta(hours=18)  # Java's ZoneOffset


class BadTime(ValueError):
    pass


def parse_instant(text: str) -> int:
    """POSIX nanoseconds of an ISO 8601 date-time with its offset; BadTime saying why."""
    found = _ISO.fullmatch(text)
    if found is None:
        hint = ""
        if " " in text:
            # A `+02:00` not written as %2B02:00 arrives as ` 02:00` (a form's `+` is a space).
            hint = "; a `+` offset must be written %2B in a URL"
        raise BadTime(
            f"cannot parse time {text[:80]!r}: ISO 8601 with an offset, such as "
            f"2026-12-02T10:00:00.000Z{hint}"
        )
    year, month, day, hour, minute = (int(found.group(i)) for i in range(1, 6))
    second = int(found.group(6) or 0)
    fraction = found.group(7) or ""
    offset = found.group(8)
    try:
        if offset == "Z":
            tz = datetime.UTC
        else:
            sign = -1 if offset[0] == "-" else 1
            parts = [int(p) for p in offset[1:].split(":")]
            delta = datetime.timedelta(hours=parts[0], minutes=parts[1],
                                       seconds=parts[2] if len(parts) > 2 else 0)  # fmt: skip
            if max(parts[1:]) > 59 or delta > _MOST_OFFSET:
                raise ValueError(f"the offset {offset} is not one from -18:00 to +18:00")
            tz = datetime.timezone(sign * delta)
        at = datetime.datetime(year, month, day, hour, minute, second, tzinfo=tz)
    except ValueError as exc:
        raise BadTime(f"cannot parse time {text[:80]!r}: {exc}") from None
    ns = int(at.timestamp()) * NS + int(fraction.ljust(9, "0") if fraction else 0)
    _in_range(ns, text)
    return ns


def _in_range(ns: int, text: str) -> None:
    if not EARLIEST <= ns <= LATEST:
        raise BadTime(f"cannot parse time {text[:80]!r}: it is not in the years 1 to 9999 (UTC)")


def request_range(start: str | None, end: str | None, now_ns: int | None = None) -> tuple[int, int]:
    """(from, to) in POSIX ns of a request's `from` and `to`, with the Archiver Appliance's
    defaults for a missing or empty one; BadTime if `to` is before `from`."""
    now = time.time_ns() if now_ns is None else now_ns
    to = parse_instant(end) if end else now + 3600 * NS
    since = parse_instant(start) if start else to - 86_400 * NS
    if since < EARLIEST:  # the default `from` of a `to` in the first day of year 1
        raise BadTime("the default `from`, a day before `to`, is before year 1: give `from`")
    if to < since:
        raise BadTime(f"for request, end {iso(to)} is before start {iso(since)}")
    return since, to


def iso(ns: int) -> str:
    """The Archiver Appliance's form, to the millisecond: 2026-12-02T10:00:00.000Z."""
    at = datetime.datetime.fromtimestamp(ns // NS, datetime.UTC)
    return f"{at.year:04d}" + at.strftime("-%m-%dT%H:%M:%S.") + f"{ns % NS // 1_000_000:03d}Z"


def human(seconds: int) -> str:
    """`getPVStatus`' form (`Dec/02/2026 10:00:00 UTC`), `Never` for 0."""
    if not seconds:
        return "Never"
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%b/%d/%Y %H:%M:%S UTC")
