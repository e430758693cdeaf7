"""``pvwire``: caget/caput/camonitor for a pvwire server.

    pvwire get ID...                         value, units, alarm
    pvwire put ID VALUE                      VALUE: int, float, JSON list, else a string
    pvwire monitor ID... [--count N] [--duration S]
    pvwire info ID                           metadata
    pvwire search PATTERN

``--json`` prints machine-readable output (for monitor one JSON object per line: a channel's
first holds everything known, later ones only what changed); ``--server URL``
or ``PVWIRE_URL`` selects the server (default http://127.0.0.1:8080). Problems print one line on
stderr: ``ID: what happened`` for a channel, ``pvwire: what happened`` for the command.

``monitor`` reports a channel that no IOC answers (``ID: not found (...)``) or that failed, once,
and keeps watching: the PV may appear later. SIGTERM ends it like ``--duration``.

Exit status, as caget's is 1 when a channel could not be read:

    0  every channel was read, written or watched
    1  an error: the server could not be reached or refused the request (write denied, wrong type,
       bad channel id, timeout, ...); it wins over 3 when both apply
    2  the command line was wrong
    3  a channel was not found: no IOC answered (get, put, info), or, for monitor, a channel was
       not found or had failed when the monitor stopped
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from .cliformat import channel_error, get_line, state_json
from .control import DEFAULT_URL, Control
from .errors import NotFound, ProtocolError, PvwireError

__all__ = ["EXIT_ERROR", "EXIT_NOT_FOUND", "EXIT_OK", "EXIT_USAGE", "main", "parse_value"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOT_FOUND = 0, 1, 2, 3


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


def _print(obj: Any) -> None:
    print(json.dumps(obj, ensure_ascii=False), flush=True)


def _get(a: argparse.Namespace) -> int:
    errors: list[PvwireError] = []
    for r in Control(a.server, timeout=a.timeout).get_many(a.ids, timeout=a.timeout):
        if isinstance(r, PvwireError):
            print(channel_error(r), file=sys.stderr)
            errors.append(r)
        elif a.json:
            _print(state_json(r))
        else:
            print(get_line(r))
    if any(not isinstance(e, NotFound) for e in errors):
        return EXIT_ERROR
    return EXIT_NOT_FOUND if errors else EXIT_OK


def _put(a: argparse.Namespace) -> int:
    c = Control(a.server, timeout=a.timeout)
    c.put(a.id, parse_value(a.value), wait=a.wait, timeout=a.timeout)
    state = c.get(a.id)
    if a.json:
        _print(state_json(state))
    else:
        print(f"{state.id}  {state.format()}")
    return EXIT_OK


def _monitor(a: argparse.Namespace) -> int:
    import asyncio  # only monitor needs the event loop and the stream client

    from .climonitor import monitor

    missing = asyncio.run(monitor(a))
    return EXIT_NOT_FOUND if missing else EXIT_OK


def _info(a: argparse.Namespace) -> int:
    s = Control(a.server, timeout=a.timeout).get(a.id)
    if a.json:
        _print(state_json(s))
        return EXIT_OK
    print(f"{s.id}")
    print(f"  connection: {s.connection}" + (f" ({s.reason})" if s.reason else ""))
    print(f"  value: {s.format()}")
    for k, v in s.metadata.items():
        print(f"  {k}: {', '.join(map(str, v)) if isinstance(v, list) else v}")
    return EXIT_OK


def _search(a: argparse.Namespace) -> int:
    ids = Control(a.server, timeout=a.timeout).search(a.pattern, a.limit)
    if a.json:
        _print(ids)
    else:
        for i in ids:
            print(i)
    return EXIT_OK


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
        prog="pvwire",
        description="Read, write and monitor EPICS PVs through a pvwire server.",
        epilog="exit status: 0 ok, 1 error, 2 bad command line, 3 a channel was not found",
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
    m.add_argument("--count", type=int, help="stop after N values")
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


def main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    try:
        rc: int = a.fn(a)
        return rc
    except NotFound as e:
        print(channel_error(e), file=sys.stderr)
        return EXIT_NOT_FOUND
    except (PvwireError, ProtocolError) as e:
        print(f"pvwire: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `pvwire monitor X | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
