"""The PV names a request asks for, and the patterns matched against the ids the server knows
(`getMatchingPVs`, `getPVStatus`).

Names are bounded before anything is done with them: a body by `aa_max_names_bytes` (on its
`Content-Length` before it is read, then as it is read), then the names by count and bytes. A
pattern is compiled by RE2 (linear time, and no cache shared between requests: `fnmatch` keeps
32,768 compiled patterns of ~14 KB each) and matched against the known ids a slice at a time:
each slice is charged to the identity before it is matched (one sample per id), and the event
loop serves other requests between slices, so a request of many patterns over a large
catalogue costs its identity's rate and never holds the loop for more than one slice."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import re2
from starlette.requests import Request

from ..limits import integer

__all__ = ["BadNames", "compiled", "glob_regex", "matched", "posted", "too_many_bytes"]

MAX_NAMES_BYTES = integer("aa_max_names_bytes")
MAX_PATTERN = integer("aa_max_pattern")
# Ids matched between two turns of the event loop: RE2 from Python costs ~1.5 us a match, two
# matches an id (its name and its id), so ~3 ms of loop a slice.
SLICE = 1024


class BadNames(ValueError):
    """A request's names refused: `status` (400, 413) and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def too_many_bytes(names: Iterable[str]) -> None:
    """BadNames (400) when `names` hold more than aa_max_names_bytes."""
    size = sum(len(n.encode("utf-8", "surrogatepass")) for n in names)
    if size > MAX_NAMES_BYTES:
        raise BadNames(400, _bytes_message(size))


def _bytes_message(size: int | None) -> str:
    what = f"{size:,} bytes" if size is not None else "more than that"
    return (
        f"PV names of at most {MAX_NAMES_BYTES:,} bytes in one request (aa_max_names_bytes); "
        f"this one {what}"
    )


async def posted(request: Request) -> list[str]:
    """PV names in a POST body: a JSON list (of names, or of {"pv": name}), text lines, or a
    form's `pv` (comma-separated), as the Archiver Appliance reads them; the body bounded
    before it is read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_NAMES_BYTES:
        raise BadNames(413, _bytes_message(int(declared)))
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_NAMES_BYTES:
            raise BadNames(413, _bytes_message(None))
    try:
        text = body.decode()
    except UnicodeDecodeError:
        raise BadNames(400, "the body is not UTF-8") from None
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if kind == "application/json":
        try:
            got = json.loads(text)
        except ValueError as exc:
            raise BadNames(400, f"the body is not JSON: {exc}") from None
        if not isinstance(got, list):
            raise BadNames(400, "the body must be a JSON list of PV names")
        names = [x.get("pv") if isinstance(x, dict) else x for x in got]
        if not all(isinstance(x, str) for x in names):
            raise BadNames(400, "the body must be a JSON list of PV names")
        return [str(x) for x in names]
    if kind == "text/plain":
        return [line.strip() for line in text.splitlines() if line.strip()]
    # A form, also when the body names no type, as the Archiver Appliance takes it.
    form = urllib.parse.parse_qsl(text)
    return [x for k, v in form if k == "pv" for x in v.split(",") if x]


def compiled(pattern: str) -> Any:
    """An RE2 regex (BadNames saying why it is not one)."""
    if len(pattern) > MAX_PATTERN:
        raise BadNames(400, f"a pattern longer than {MAX_PATTERN:,} characters (aa_max_pattern)")
    try:
        return re2.compile(pattern)
    except re2.error as exc:
        raise BadNames(400, f"bad regex {pattern[:80]!r}: {exc}") from None


_WILD = re.compile(r"([*?])")


def glob_regex(glob: str) -> str:
    """A glob as a regex, `*` any characters, `?` one, the rest as written: the Archiver
    Appliance's WildcardFileFilter in `getPVStatus`."""
    if len(glob) > MAX_PATTERN:
        raise BadNames(400, f"a glob longer than {MAX_PATTERN:,} characters (aa_max_pattern)")
    wild = {"*": ".*", "?": "."}
    return "".join(wild.get(p) or re2.escape(p) for p in _WILD.split(glob) if p)


async def matched(
    pattern: Any,
    ids: Sequence[str],
    shown: Callable[[str], str],
    keep: Callable[[str], bool],
    spend: Callable[[int], None],
    most: int,
) -> list[str]:
    """The names (`shown`) of the ids whose name or id `pattern` matches whole and that `keep`
    keeps, in the order of `ids`, at most `most`: a slice at a time, each `spend`t before it is
    matched (which raises to stop), the event loop running other work between slices."""
    out: list[str] = []
    full = pattern.fullmatch
    for start in range(0, len(ids), SLICE):
        part = ids[start : start + SLICE]
        spend(len(part))
        for cid in part:
            name = shown(cid)
            if (full(name) or (name != cid and full(cid))) and keep(cid):
                out.append(name)
                if len(out) >= most:
                    return out
        await asyncio.sleep(0)
    return out
