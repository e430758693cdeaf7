"""``pvwire monitor``: camonitor over the stream, honest about channels that are not there.

Imported only for ``monitor``: it needs asyncio, the WebSocket client and numpy, which the other
commands do without.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys

from .client import Client
from .cliformat import camonitor_line, change_json, channel_problem
from .entry import ALARM, CONN, META, TIME, VALUE
from .state import FAILED, NOT_FOUND, ChannelState

__all__ = ["Watch", "monitor"]

EVERYTHING = VALUE | TIME | ALARM | META | CONN


class Watch:
    """What a monitor learnt about each channel: lines for stderr, and who is missing at the end.

    A channel's problem (not found, failed) is reported when the channel enters that state, so
    once however many updates repeat it; the monitor keeps watching, since a PV may appear later.
    """

    def __init__(self) -> None:
        self._state: dict[str, int] = {}

    def see(self, s: ChannelState) -> str | None:
        """Note an update; return the line to print on stderr, if it brought a problem."""
        before = self._state.get(s.id)
        self._state[s.id] = s.state
        return channel_problem(s) if s.state != before else None

    @property
    def missing(self) -> list[str]:
        """Channels not found or failed, as last seen."""
        return [i for i, st in self._state.items() if st in (NOT_FOUND, FAILED)]


def _text_line(s: ChannelState, changed: int) -> str:
    return camonitor_line(s)


def _json_line(s: ChannelState, changed: int) -> str:
    return json.dumps(change_json(s, changed), ensure_ascii=False)


_BITS = {"value": VALUE, "time": TIME, "alarm": ALARM, "metadata": META, "connection": CONN}


async def _with_past(c: Client, a: argparse.Namespace, watch: Watch) -> None:
    """``--backfill S``: the server's recorded last S seconds first, then live lines, one update
    at a time (``Client.monitor``; batches carry no past). Past lines do not count for
    ``--count``."""
    left = a.count
    printed: set[str] = set()
    render = _json_line if a.json else _text_line
    async for u in c.monitor(
        a.ids,
        max_rate=a.max_rate,
        mode=a.mode,
        max_columns=a.max_columns,
        max_pixels=a.max_pixels,
        backfill=a.backfill,
    ):
        s = u.channel
        if not u.past:
            problem = watch.see(s)
            if problem is not None:
                print(problem, file=sys.stderr, flush=True)
                continue
        if s.value is None and not u.past:
            continue  # like camonitor: nothing to print before the first value
        # (A past row without a value is a gap: printed, as a plot would break its line.)
        changed = sum(_BITS[n] for n in u.changed)
        if s.id not in printed:
            printed.add(s.id)
            changed = EVERYTHING
        print(render(s, changed), flush=True)
        if left is not None and not u.past and changed & VALUE:
            left -= 1
            if left == 0:
                return


async def monitor(a: argparse.Namespace) -> list[str]:
    """Print updates until ``--count`` values, ``--duration`` seconds or SIGTERM; return the
    channels that were missing (not found or failed) when it stopped."""
    watch = Watch()
    stop = asyncio.Event()
    # SIGTERM (from `timeout`, a supervisor or a test) ends the monitor like --duration does, so
    # the exit status can still say whether every channel was found.
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with Client(a.server, timeout=a.timeout, token=a.token, ca_file=a.ca_file) as c:

        async def run() -> None:
            if getattr(a, "backfill", 0):
                await _with_past(c, a, watch)
                return
            left = a.count
            printed: set[int] = set()  # channels whose first line was printed
            render = _json_line if a.json else _text_line
            out, err = sys.stdout, sys.stderr
            async for batch in c.monitor_batches(
                a.ids,
                max_rate=a.max_rate,
                mode=a.mode,
                max_columns=a.max_columns,
                max_pixels=a.max_pixels,
            ):
                lines = []
                states = batch.states
                for sid, changed in batch.changed.items():
                    s = states[sid]
                    problem = watch.see(s)
                    if problem is not None:
                        print(problem, file=err, flush=True)
                        continue
                    if s.value is None:
                        continue  # like camonitor: nothing to print before the first value
                    if sid not in printed:
                        # The first line holds everything known: the registration may have
                        # brought the metadata before the snapshot (a channel another client
                        # keeps open), so the snapshot entry need not carry it.
                        printed.add(sid)
                        changed = EVERYTHING
                    lines.append(render(s, changed))
                    if left is not None and changed & VALUE:
                        left -= 1
                        if left == 0:
                            break
                # One write and one flush per frame, not per line: print(flush=True) per line
                # was a system call per update.
                if lines:
                    out.write("\n".join(lines) + "\n")
                    out.flush()
                if left == 0:
                    return

        runner = asyncio.create_task(run())
        stopper = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait(
                {runner, stopper}, timeout=a.duration, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for t in (runner, stopper):
                t.cancel()
            await asyncio.gather(runner, stopper, return_exceptions=True)
        failure = None if runner.cancelled() else runner.exception()
        if failure is not None:
            raise failure
    return watch.missing
