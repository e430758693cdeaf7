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
from .cliformat import camonitor_line, channel_problem, state_json
from .state import FAILED, NOT_FOUND, ChannelState

__all__ = ["Watch", "monitor"]


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
    async with Client(a.server, timeout=a.timeout, token=a.token) as c:

        async def run() -> None:
            n = 0
            async for u in c.monitor(a.ids, max_rate=a.max_rate, mode=a.mode):
                problem = watch.see(u.channel)
                if problem is not None:
                    print(problem, file=sys.stderr, flush=True)
                    continue
                if u.channel.value is None:
                    continue  # like camonitor: nothing to print before the first value
                if a.json:
                    doc = {**state_json(u.channel), "changed": sorted(u.changed)}
                    print(json.dumps(doc, ensure_ascii=False), flush=True)
                else:
                    print(camonitor_line(u.channel), flush=True)
                n += 1
                if a.count is not None and n >= a.count:
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
