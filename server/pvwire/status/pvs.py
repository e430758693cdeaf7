"""The status PVs: one table of names, types, units and alarm limits (docs/OPERATIONS.md
section 7a lists it), and the alarm a value raises, as an EPICS ai record raises it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ..limits import number
from ..model import Severity, alarm_status_name

__all__ = ["Alarm", "StatusPv", "status_pvs"]

# The limit alarms' statuses, by their menuAlarmStat numbers (model.py names them).
_HIHI, _HIGH, _LOLO = (alarm_status_name(n) for n in (3, 4, 5))
_NONE = math.nan  # a limit that raises nothing (QSRV sends NaN for an unset one too)


@dataclass(frozen=True, slots=True)
class Alarm:
    """valueAlarm's limits: at or beyond one, the PV's alarm is raised with its severity."""

    high_warning: float = _NONE  # MINOR, status HIGH
    high_alarm: float = _NONE  # MAJOR, status HIHI
    low_alarm: float = _NONE  # MAJOR, status LOLO

    def check(self, value: float) -> tuple[int, str]:
        """(severity, status name) of `value`, in the order an ai record checks them (HIHI,
        LOLO, HIGH); a NaN limit compares false, so it raises nothing."""
        if value >= self.high_alarm:
            return Severity.MAJOR, _HIHI
        if value <= self.low_alarm:
            return Severity.MAJOR, _LOLO
        if value >= self.high_warning:
            return Severity.MINOR, _HIGH
        return Severity.NO_ALARM, ""


@dataclass(frozen=True, slots=True)
class StatusPv:
    name: str  # after the prefix
    code: Literal["d", "i", "s"]  # p4p's type code: float64, int32, string
    units: str
    precision: int
    description: str
    alarm: Alarm | None = None


def status_pvs(tick_ms: float) -> tuple[StatusPv, ...]:
    """The table. A tick as long as its interval (`tick_ms`) leaves the loop no time for
    anything else: MINOR; five times that, MAJOR."""
    lag_major = number("ready_max_loop_lag_s")  # `/readyz` answers 503 from there
    return (
        StatusPv("clients", "i", "clients", 0, "clients of /stream and /pvws/pv"),
        StatusPv("channels", "i", "channels", 0, "open upstream channels"),
        StatusPv("updatesPerSec", "d", "updates/s", 1, "upstream updates received"),
        StatusPv("deliveriesPerSec", "d", "updates/s", 1, "channel updates queued for clients"),
        StatusPv("bytesPerSec", "d", "B/s", 0, "stream bytes sent to clients"),
        StatusPv("conflatedPerSec", "d", "updates/s", 1, "updates merged for clients behind"),
        StatusPv("droppedPerSec", "d", "updates/s", 1, "ALL mode updates dropped at its bounds",
                 Alarm(high_warning=1.0, high_alarm=100.0)),
        StatusPv("refusalsPerSec", "d", "refusals/s", 1, "refusals of clients and peers",
                 Alarm(high_warning=1.0, high_alarm=100.0)),
        StatusPv("loopLag", "d", "s", 3, "worst event loop lag in the last 10 s",
                 Alarm(high_warning=1.0, high_alarm=lag_major)),
        StatusPv("tickP99", "d", "ms", 2, "99th percentile of tick durations",
                 Alarm(high_warning=tick_ms, high_alarm=5 * tick_ms)),
        StatusPv("queuedBytes", "d", "B", 0, "bytes queued for all clients"),
        StatusPv("uptime", "d", "s", 0, "seconds since the server started"),
        StatusPv("ready", "i", "", 0, "1 while /readyz answers 200, else 0",
                 Alarm(low_alarm=0)),
        StatusPv("version", "s", "", 0, "pvwire's version"),
    )  # fmt: skip
