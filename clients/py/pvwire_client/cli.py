"""``pvwire``: caget/caput/camonitor for a pvwire server.

    pvwire get ID...                         value, units, alarm
    pvwire put ID VALUE                      VALUE: int, float, JSON list, else a string
    pvwire monitor ID... [--count N] [--duration S] [--backfill S]
    pvwire info ID                           metadata
    pvwire search PATTERN
    pvwire login [--client-id ID] [--client-secret-file PATH]   sign in (login.py)

``--json`` prints machine-readable output (for monitor one JSON object per line: a channel's
first holds everything known, later ones only what changed); ``--server URL`` or ``PVWIRE_URL``
selects the server (default http://127.0.0.1:8080). A server that checks identities takes the
user's bearer token (the site's OIDC access token) from ``PVWIRE_TOKEN``, ``--token-file PATH`` or
``--token TOKEN`` (visible to other users in the process list), else the one ``pvwire login``
stored. Problems print one line on
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
    4  not authenticated: the server wants a token, or refused the one given (invalid, expired)
    5  forbidden: this identity may not read or monitor a channel
    6  write denied: this identity may not write the channel

When channels fail in different ways the first of 4, 1, 5, 6, 3 that applies is the status.
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

__all__ = [
    "EXIT_ERROR",
    "EXIT_FORBIDDEN",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_UNAUTHENTICATED",
    "EXIT_USAGE",
    "EXIT_WRITE_DENIED",
    "exit_status",
    "main",
    "parse_value",
]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOT_FOUND = 0, 1, 2, 3
EXIT_UNAUTHENTICATED, EXIT_FORBIDDEN, EXIT_WRITE_DENIED = 4, 5, 6

# By the error's code: GraphQL ``extensions.code``, or the stream's name for a refused token.
_EXIT_BY_CODE = {
    "NOT_FOUND": EXIT_NOT_FOUND,
    "UNAUTHENTICATED": EXIT_UNAUTHENTICATED,
    "BAD_TOKEN": EXIT_UNAUTHENTICATED,
    "TOKEN_EXPIRED": EXIT_UNAUTHENTICATED,
    "FORBIDDEN": EXIT_FORBIDDEN,
    "WRITE_DENIED": EXIT_WRITE_DENIED,
}
# Without a valid token nothing else can be trusted, so it comes first; then, as before, a
# failure wins over a channel that is simply not there.
_PRECEDENCE = (EXIT_UNAUTHENTICATED, EXIT_ERROR, EXIT_FORBIDDEN, EXIT_WRITE_DENIED, EXIT_NOT_FOUND)


def exit_status(errors: Sequence[PvwireError]) -> int:
    """The exit status for what went wrong (none: 0)."""
    found = {_EXIT_BY_CODE.get(e.code, EXIT_ERROR) for e in errors}
    return next((s for s in _PRECEDENCE if s in found), EXIT_OK)


def problem_line(e: PvwireError) -> str:
    """The stderr line for an error that ended the command."""
    if _EXIT_BY_CODE.get(e.code) == EXIT_UNAUTHENTICATED:
        hint = "give a valid token: pvwire login, PVWIRE_TOKEN, --token-file or --token"
        return f"pvwire: not authenticated: {e} ({hint})"
    if isinstance(e, NotFound):
        return channel_error(e)
    return f"pvwire: {e}"


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
    control = Control(a.server, timeout=a.timeout, token=a.token, ca_file=a.ca_file)
    for r in control.get_many(a.ids, timeout=a.timeout):
        if isinstance(r, PvwireError):
            print(channel_error(r), file=sys.stderr)
            errors.append(r)
        elif a.json:
            _print(state_json(r))
        else:
            print(get_line(r))
    return exit_status(errors)


def _put(a: argparse.Namespace) -> int:
    c = Control(a.server, timeout=a.timeout, token=a.token, ca_file=a.ca_file)
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
    s = Control(a.server, timeout=a.timeout, token=a.token, ca_file=a.ca_file).get(a.id)
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
    control = Control(a.server, timeout=a.timeout, token=a.token, ca_file=a.ca_file)
    ids = control.search(a.pattern, a.limit)
    if a.json:
        _print(ids)
    else:
        for i in ids:
            print(i)
    return EXIT_OK


def _login(a: argparse.Namespace) -> int:
    import httpx

    from .login import LoginError, cache_file, login

    secret = a.client_secret or ""
    if a.client_secret_file:
        with open(a.client_secret_file, encoding="utf-8") as f:
            secret = f.read().strip()
    try:
        stored = login(
            a.server,
            issuer=a.issuer or "",
            client_id=a.client_id or "",
            client_secret=secret,
            show=lambda s: print(s, file=sys.stderr, flush=True),
        )
    except (LoginError, httpx.HTTPError, ValueError, KeyError) as e:
        print(f"pvwire: login: {e}", file=sys.stderr)
        return EXIT_UNAUTHENTICATED
    print(f"pvwire: signed in at {stored['issuer']}; token stored in {cache_file()}",
          file=sys.stderr)  # fmt: skip
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--server",
        default=os.environ.get("PVWIRE_URL", DEFAULT_URL),
        help="pvwire server URL (env PVWIRE_URL; default %(default)s)",
    )
    token = common.add_mutually_exclusive_group()
    token.add_argument(
        "--token",
        help="bearer token for a server that checks identities (default: env PVWIRE_TOKEN;"
        " prefer it or --token-file: a command line is visible to other users)",
    )
    token.add_argument("--token-file", metavar="PATH", help="read the bearer token from PATH")
    common.add_argument(
        "--ca-file",
        metavar="PEM",
        default=os.environ.get("PVWIRE_CA_FILE") or None,
        help="trust this CA for an https:// server (env PVWIRE_CA_FILE; default: the system's "
        "trusted certificates)",
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--timeout", type=float, default=3.0, help="seconds (default 3)")
    p = argparse.ArgumentParser(
        prog="pvwire",
        description="Read, write and monitor EPICS PVs through a pvwire server.",
        epilog="exit status: 0 ok, 1 error, 2 bad command line, 3 a channel was not found,"
        " 4 not authenticated, 5 forbidden, 6 write denied",
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
    m.add_argument(
        "--count", type=int, help="stop after N values (a line without a new value not counted)"
    )
    m.add_argument("--duration", type=float, help="stop after S seconds")
    m.add_argument("--max-rate", type=float, default=0, help="updates per second (0: all)")
    m.add_argument("--mode", choices=["LATEST", "ALL"], default="LATEST")
    m.add_argument(
        "--max-columns",
        type=int,
        default=0,
        metavar="N",
        help="1-D arrays over 2N elements arrive as N min/max pairs (0: whole)",
    )
    m.add_argument(
        "--max-pixels",
        type=int,
        default=0,
        metavar="N",
        help="images over N pixels arrive subsampled to at most N (0: whole)",
    )
    m.add_argument(
        "--backfill",
        type=float,
        default=0,
        metavar="S",
        help="first print the last S seconds the server recorded (not counted by --count)",
    )
    m.set_defaults(fn=_monitor)
    i = sub.add_parser("info", parents=[common], help="show metadata")
    i.add_argument("id", metavar="ID")
    i.set_defaults(fn=_info)
    s = sub.add_parser("search", parents=[common], help="find channel ids by glob pattern")
    s.add_argument("pattern", metavar="PATTERN")
    s.add_argument("--limit", type=int, default=100)
    s.set_defaults(fn=_search)
    lg = sub.add_parser("login", help="sign in at the site's identity provider, store the token")
    lg.add_argument("--server", default=os.environ.get("PVWIRE_URL", DEFAULT_URL),
                    help="pvwire server that names the provider (env PVWIRE_URL)")  # fmt: skip
    lg.add_argument("--issuer", help="the provider's issuer URL (default: the server's)")
    lg.add_argument("--client-id", help="OIDC client (default: the server's page client)")
    secret = lg.add_mutually_exclusive_group()
    secret.add_argument(
        "--client-secret-file",
        metavar="PATH",
        help="a service's client secret: client credentials, no person",
    )
    secret.add_argument("--client-secret", help="as --client-secret-file, but visible to others")
    lg.set_defaults(fn=_login)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    a = parser.parse_args(argv)
    if getattr(a, "token_file", None) is not None:
        try:
            with open(a.token_file, encoding="utf-8") as f:
                a.token = f.read().strip()
        except OSError as e:
            parser.error(f"--token-file: {e}")  # exits with EXIT_USAGE
    try:
        rc: int = a.fn(a)
        return rc
    except PvwireError as e:
        print(problem_line(e), file=sys.stderr)
        return exit_status([e])
    except ProtocolError as e:
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
