"""``pvwire``: caget/caput/camonitor for a pvwire server.

    pvwire get ID...                         value, units, alarm
    pvwire put ID VALUE                      VALUE: int, float, JSON list, else a string
    pvwire monitor ID... [--count N] [--duration S]
    pvwire info ID                           metadata
    pvwire search PATTERN

``--json`` prints machine-readable output (one JSON object per line for monitor); ``--server URL``
or ``PVWIRE_URL`` selects the server (default http://127.0.0.1:8080). Expected errors print one
line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from .client import DEFAULT_URL, Client, Update
from .errors import PvwireError
from .state import ChannelState
from .wire import ProtocolError

__all__ = ["main", "parse_value"]


def parse_value(text: str) -> Any:
    """A command-line value: int, float, JSON array/object, else the string itself."""
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, np.generic):
        return _jsonable(x.item())
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)  # JSON has no NaN/Infinity
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    return x


def state_json(s: ChannelState) -> dict[str, Any]:
    t = s.datetime
    return {
        "id": s.id,
        "value": _jsonable(s.value),
        "display": s.format(),
        "units": s.units,
        "time": t.isoformat() if t else None,
        "seconds": s.seconds,
        "nanoseconds": s.nanoseconds,
        "severity": s.severity_name,
        "status": s.status_name,
        "message": s.message,
        "connection": s.connection,
        "reason": s.reason,
        "serial": s.serial,
        "conflated": s.conflated,
        "metadata": _jsonable(s.metadata),
    }


def _local_time(s: ChannelState) -> str:
    t = s.datetime
    if t is None:
        return "<no time>" + " " * 17
    return t.astimezone().replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def camonitor_line(s: ChannelState) -> str:
    """``ID  2026-11-22 17:30:01.123456  VALUE UNITS  [SEVERITY STATUS]``"""
    if not s.connected:
        reason = f": {s.reason}" if s.reason else ""
        return f"{s.id}  {_local_time(s)}  {s.format()}  <{s.connection.lower()}{reason}>"
    line = f"{s.id}  {_local_time(s)}  {s.format()}"
    if s.severity:
        line += f"  {s.severity_name} {s.status_name}"
    return line


def _print(obj: Any) -> None:
    print(json.dumps(obj, ensure_ascii=False), flush=True)


async def _get(c: Client, a: argparse.Namespace) -> int:
    results = await c.get_many(a.ids, timeout=a.timeout)
    rc = 0
    for r in results:
        if isinstance(r, PvwireError):
            print(f"pvwire: {r}", file=sys.stderr)
            rc = 1
        elif a.json:
            _print(state_json(r))
        else:
            sev = f"  {r.severity_name} {r.status_name}" if r.severity else ""
            conn = "" if r.connected else f"  <{r.connection.lower()}>"
            print(f"{r.id}  {r.format()}{sev}{conn}")
    return rc


async def _put(c: Client, a: argparse.Namespace) -> int:
    value = parse_value(a.value)
    await c.put(a.id, value, wait=a.wait, timeout=a.timeout)
    state = await c.get(a.id, timeout=a.timeout)
    if a.json:
        _print(state_json(state))
    else:
        print(f"{state.id}  {state.format()}")
    return 0


async def _monitor(c: Client, a: argparse.Namespace) -> int:
    n = 0

    async def run() -> None:
        nonlocal n
        u: Update
        async for u in c.monitor(a.ids, max_rate=a.max_rate, mode=a.mode):
            if u.channel.value is None:
                continue  # like camonitor: nothing to print before the first value
            if a.json:
                _print({**state_json(u.channel), "changed": sorted(u.changed)})
            else:
                print(camonitor_line(u.channel), flush=True)
            n += 1
            if a.count is not None and n >= a.count:
                return

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(run(), a.duration)
    return 0


async def _info(c: Client, a: argparse.Namespace) -> int:
    s = await c.get(a.id, timeout=a.timeout)
    if a.json:
        _print(state_json(s))
        return 0
    print(f"{s.id}")
    print(f"  connection: {s.connection}" + (f" ({s.reason})" if s.reason else ""))
    print(f"  value: {s.format()}")
    for k, v in s.metadata.items():
        print(f"  {k}: {', '.join(map(str, v)) if isinstance(v, list) else v}")
    return 0


async def _search(c: Client, a: argparse.Namespace) -> int:
    ids = await c.search(a.pattern, a.limit)
    if a.json:
        _print(ids)
    else:
        for i in ids:
            print(i)
    return 0


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--server",
        default=os.environ.get("PVWIRE_URL", DEFAULT_URL),
        help="pvwire server URL (env PVWIRE_URL; default %(default)s)",
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--timeout", type=float, default=3.0, help="seconds (default 3)")
    p = argparse.ArgumentParser(
        prog="pvwire", description="Read, write and monitor EPICS PVs through a pvwire server."
    )
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("get", parents=[common], help="read channels")
    g.add_argument("ids", nargs="+", metavar="ID")
    g.set_defaults(fn=_get)
    w = sub.add_parser("put", parents=[common], help="write a value")
    w.add_argument("id", metavar="ID")
    w.add_argument("value", metavar="VALUE", help="int, float, JSON list, else a string")
    w.add_argument("--wait", action="store_true", help="wait for the put to complete")
    w.set_defaults(fn=_put)
    m = sub.add_parser("monitor", parents=[common], help="print updates as they come")
    m.add_argument("ids", nargs="+", metavar="ID")
    m.add_argument("--count", type=int, help="stop after N updates")
    m.add_argument("--duration", type=float, help="stop after S seconds")
    m.add_argument("--max-rate", type=float, default=0, help="updates per second (0: all)")
    m.add_argument("--mode", choices=["LATEST", "ALL"], default="LATEST")
    m.set_defaults(fn=_monitor)
    i = sub.add_parser("info", parents=[common], help="show metadata")
    i.add_argument("id", metavar="ID")
    i.set_defaults(fn=_info)
    s = sub.add_parser("search", parents=[common], help="find channel ids by glob pattern")
    s.add_argument("pattern", metavar="PATTERN")
    s.add_argument("--limit", type=int, default=100)
    s.set_defaults(fn=_search)
    return p


async def _run(a: argparse.Namespace) -> int:
    async with Client(a.server, timeout=a.timeout) as c:
        rc: int = await a.fn(c, a)
        return rc


def main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    try:
        return asyncio.run(_run(a))
    except (PvwireError, ProtocolError) as e:
        print(f"pvwire: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `pvwire monitor X | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0


if __name__ == "__main__":
    sys.exit(main())
