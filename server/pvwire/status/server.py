"""The status PVs served over PVA by p4p's server, their figures read on the event loop once a
period from the snapshot `/metrics` reads.

p4p's thread flavour (`p4p.server.thread.SharedPV`), not its asyncio one. The PVs take no puts
or RPCs (p4p refuses those in its own thread, "Put not supported"); what remains of a handler's
work is p4p's note of each PV's first connection and last disconnection. The asyncio flavour
runs those on the event loop (a `call_soon_threadsafe` each), so PVA clients coming and going
would add work to the loop whose lag the PVs report; the thread flavour runs them on p4p's
worker thread, one item per PV and connection cycle, whatever the number of clients. Posting is
thread-safe, and pvxs's own threads answer gets and monitors from the last posted value, so the
PVs keep answering while the loop is late (their figures then come late too, as loopLag says).

Under `--workers N` each worker serves its own figures under `PREFIX` + `W<n>:` (n in 1..N): its
figures are its own (own clients, own upstream channels), as `/metrics` gives each a `worker`
label, and workers share nothing to add them up with. The number is claimed as the name of an
abstract Unix socket held while the process lives, so the worker that replaces one that died
takes the number it left (uvicorn numbers a replacement anew) and archived names stay valid.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import socket
import time
from collections.abc import Callable
from typing import Any

from .. import __version__
from ..core.stats import HubSnapshot
from ..limits import number
from ..model import Severity
from .figures import Window
from .pvs import Alarm, StatusPv, status_pvs

__all__ = ["StatusServer", "claim_slot"]

log = logging.getLogger("pvwire.status")

PERIOD_S = number("status_period_s")
WINDOW_S = number("status_window_s")
# pvData's alarm status for a limit alarm, as QSRV sends it (DEVICE); the message names the
# menuAlarmStat status (HIHI...), which pvwire's own PVA backend reads back as that status.
_DEVICE_STATUS = 1
# display.form's choices, as QSRV sends them; the status PVs are all Default.
_FORMS = ("Default", "String", "Binary", "Decimal", "Hex", "Exponential", "Engineering")


class StatusServer:
    """Serves the status PVs under `prefix` from `start()` (on the event loop) to `stop()`.
    A failure to serve (a port held by another program, a p4p error) is logged once; the
    server goes on without its PVs."""

    def __init__(
        self,
        prefix: str,
        snapshot: Callable[[], HubSnapshot],
        ready: Callable[[], bool],
        tick_ms: float,
        workers: int = 1,
    ) -> None:
        self.prefix = prefix
        self._snapshot = snapshot
        self._ready = ready
        self._workers = workers
        self.table = status_pvs(tick_ms)
        self._window = Window(WINDOW_S)
        self._slot: socket.socket | None = None
        self._server: Any = None  # p4p.server.Server while serving
        self._pvs: dict[str, Any] = {}  # name after the prefix -> its SharedPV
        self._posted: dict[str, tuple[object, int]] = {}  # name -> (value, severity) posted
        self._task: asyncio.Task[None] | None = None
        self._post_failed = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="status PVs")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._slot is not None:
            self._slot.close()

    async def _run(self) -> None:
        base = self.prefix
        try:
            if self._workers > 1:
                base = f"{self.prefix}W{await self._claim()}:"
            self._serve(base)
        except Exception as exc:
            log.error("status PVs under %s are not served (%s); the server goes on without them",
                      base, exc)  # fmt: skip
            return
        log.info("status PVs served: %s{%s}", base, ",".join(pv.name for pv in self.table))
        while True:
            await asyncio.sleep(PERIOD_S)
            self.post()

    async def _claim(self) -> int:
        """This worker's number, once one is free (a worker that died frees its own)."""
        slot = claim_slot(self.prefix, self._workers)
        if slot is None:
            log.warning("status PVs under %s: waiting for one of the worker numbers 1..%d to "
                        "be free", self.prefix, self._workers)  # fmt: skip
        while slot is None:
            await asyncio.sleep(PERIOD_S)
            slot = claim_slot(self.prefix, self._workers)
        self._slot, n = slot
        return n

    def _serve(self, base: str) -> None:
        from p4p.server import Server, StaticProvider
        from p4p.server.thread import SharedPV

        figures = self._figures()
        provider = StaticProvider("pvwire-status")
        for pv in self.table:
            value = figures[pv.name]
            initial = _initial(pv, value)
            shared = SharedPV(nt=_nt(pv), initial=initial)
            self._pvs[pv.name] = shared
            self._posted[pv.name] = (value, initial["alarm"]["severity"])
            provider.add(base + pv.name, shared)
        # The EPICS_PVAS_* settings of the environment, as any PVA server on this host reads them.
        self._server = Server(providers=[provider])

    def _figures(self) -> dict[str, float | int | str]:
        return self._window.figures(time.monotonic(), self._snapshot(), self._ready(), __version__)

    def post(self) -> None:
        """Read the figures once and post each PV whose value or alarm changed."""
        try:
            figures = self._figures()
            now = time.time()
            for pv in self.table:
                value = figures[pv.name]
                severity, status = _alarm(pv.alarm, value)
                if self._posted.get(pv.name) == (value, severity):
                    continue
                self._pvs[pv.name].post(
                    {"value": value, "alarm": _alarm_fields(severity, status)}, timestamp=now
                )
                self._posted[pv.name] = (value, severity)
        except Exception as exc:
            if not self._post_failed:
                self._post_failed = True
                log.error("posting the status PVs under %s failed: %r", self.prefix, exc)


def claim_slot(prefix: str, workers: int) -> tuple[socket.socket, int] | None:
    """The lowest worker number in 1..`workers` that no live process holds for `prefix`, held
    by the socket returned (closed, or the process gone, it is free again); None if all are
    held."""
    key = hashlib.sha256(prefix.encode()).hexdigest()[:32]  # any prefix fits a socket name
    for n in range(1, workers + 1):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(f"\0pvwire-status-{key}-{n}")
        except OSError:
            sock.close()
            continue
        return sock, n
    return None


def _nt(pv: StatusPv) -> Any:
    from p4p.nt import NTScalar

    return NTScalar(pv.code, display=True, valueAlarm=pv.alarm is not None, form=True)


def _alarm(alarm: Alarm | None, value: object) -> tuple[int, str]:
    if alarm is None or not isinstance(value, int | float):
        return 0, ""
    return alarm.check(float(value))


def _alarm_fields(severity: int, status: str) -> dict[str, Any]:
    return {"severity": severity, "status": _DEVICE_STATUS if severity else 0, "message": status}


def _initial(pv: StatusPv, value: object) -> dict[str, Any]:
    severity, status = _alarm(pv.alarm, value)
    secs, nanos = divmod(time.time_ns(), 1_000_000_000)
    initial: dict[str, Any] = {
        "value": value,
        "alarm": _alarm_fields(severity, status),
        "timeStamp": {"secondsPastEpoch": secs, "nanoseconds": nanos},
        "display": {"description": pv.description, "units": pv.units},
    }
    if pv.code != "s":
        initial["display"]["precision"] = pv.precision
        initial["display"]["form"] = {"index": 0, "choices": list(_FORMS)}
    if pv.alarm is not None:
        a = pv.alarm
        initial["valueAlarm"] = {
            "active": True,
            "lowAlarmLimit": _limit(a.low_alarm, pv),
            "lowWarningLimit": _limit(math.nan, pv),
            "highWarningLimit": _limit(a.high_warning, pv),
            "highAlarmLimit": _limit(a.high_alarm, pv),
            "lowAlarmSeverity": 0 if math.isnan(a.low_alarm) else Severity.MAJOR,
            "lowWarningSeverity": 0,
            "highWarningSeverity": 0 if math.isnan(a.high_warning) else Severity.MINOR,
            "highAlarmSeverity": 0 if math.isnan(a.high_alarm) else Severity.MAJOR,
        }
    return initial


def _limit(limit: float, pv: StatusPv) -> float | int:
    """A valueAlarm limit as the PV's type holds it: an int32 PV's unused (NaN) limit is 0,
    with no severity."""
    if pv.code == "i":
        return 0 if math.isnan(limit) else int(limit)
    return limit
