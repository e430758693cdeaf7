"""A small archiver for tests: a real HTTP server on 127.0.0.1 (a thread of the test process)
answering the Archiver Appliance's `getData.raw` as its documentation publishes it, its PB
written with the protobuf classes of PyPI's epicsarchiver-retrieval-client (EPICSEvent_pb2,
compiled from the Archiver Appliance's EPICSEvent.proto) and that package's escaping, not with
pvwire's encoder.

It holds samples per PV (`hold`, or `every`: a sample each `step` ns up to now, generated when
asked) and answers them raw, or through `optimized_K` / `optimizedSample_K` (the samples when at
most K, else [mean, std, min, max, count] bins of (to - from) / K seconds at their middle) and
`mean_N` / `count_N`, each computed here, independently of pvwire's post-processors. The last
sample before `from` comes first (into the bin before the first), as the Archiver Appliance
sends it; a PV it holds nothing of is a 404.

PVs named for a failure answer that way: `SLOW:...` trickles a byte at a time and never ends,
`GARBAGE:...` answers bytes that are no PB, `BIG:...` more samples than anyone asks for,
`ERROR:...` HTTP 500; an archiver made with `fails="SLOW"` (or another of them) answers every PV
so. `requests` counts what was asked, by PV."""

from __future__ import annotations

import contextlib
import datetime
import math
import re
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType
from typing import Any

from epicsarchiver.retrieval import EPICSEvent_pb2 as ee
from epicsarchiver.retrieval.pb import escape_bytes

NS = 1_000_000_000
_CALL = re.compile(r"([A-Za-z]+)_(\d+)\((.+)\)")


# One sample: (ns, value, severity, status, fields).
Sample = tuple[int, float, int, int, tuple[tuple[str, str], ...]]


@dataclass(frozen=True, slots=True)
class Held:
    """Samples of one PV."""

    samples: list[Sample]


@dataclass(frozen=True, slots=True)
class Every:
    """A sample every `step` ns from `start` to now, its value its time in steps."""

    start: int
    step: int

    def samples(self, until: int) -> list[Sample]:
        end = min(until, time.time_ns())
        n = max(0, (end - self.start) // self.step + 1)
        none: tuple[tuple[str, str], ...] = ()
        return [(self.start + k * self.step, float(k), 0, 0, none) for k in range(n)]


def _instant(text: str) -> int:
    at = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(at.timestamp()) * NS + at.microsecond * 1000


class PbArchiver:
    def __init__(self, fails: str = "", every: Every | None = None) -> None:
        """`every`: what it holds of a PV it was told nothing of (None: nothing, a 404)."""
        self.fails = fails
        self.default = every
        self.pvs: dict[str, Held | Every] = {}
        self.requests: Counter[str] = Counter()
        self.asked: list[dict[str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/retrieval"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._stopping = threading.Event()

    def __enter__(self) -> PbArchiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def hold(self, pv: str, samples: list[tuple[int, float]],
             lost: Mapping[int, str] = MappingProxyType({})) -> None:  # fmt: skip
        """`samples` (ns, value); `lost`: by index, the `cnxlostepsecs` of that sample (the
        archiver lost the channel then, and had it back at that sample)."""
        self.pvs[pv] = Held([(t, v, 0, 0, (("cnxlostepsecs", lost[i]),
                                           ("cnxregainedepsecs", str(t // NS))) if i in lost
                              else ()) for i, (t, v) in enumerate(samples)])  # fmt: skip

    def every(self, pv: str, start: int, step: int) -> None:
        self.pvs[pv] = Every(start, step)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        archiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                params = dict(urllib.parse.parse_qsl(url.query))
                if url.path != "/retrieval/data/getData.raw" or "pv" not in params:
                    self._send(404, b"not here")
                    return
                archiver.asked.append(params)
                archiver._answer(self, params)

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler

    def _answer(self, h: BaseHTTPRequestHandler, params: dict[str, str]) -> None:
        found = _CALL.fullmatch(params["pv"])
        op, n, pv = "", 0, params["pv"]
        if found:
            op, n, pv = found.group(1), int(found.group(2)), found.group(3)
        self.requests[pv] += 1
        if self.fails:
            pv = f"{self.fails}:{pv}"
        if pv.startswith("SLOW:"):
            self._trickle(h)
            return
        if pv.startswith("ERROR:"):
            self._status(h, 500, b"java.lang.NullPointerException")
            return
        if pv.startswith("GARBAGE:"):
            self._status(h, 200, b"\x08\x06\x12\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\n" * 50)
            return
        start, end = _instant(params["from"]), _instant(params["to"])
        if pv.startswith("BIG:"):  # one sample line, many times: more than any bound allows
            info = ee.PayloadInfo(type=ee.PayloadType.SCALAR_DOUBLE, pvname=pv, year=2026)
            line = escape_bytes(ee.ScalarDouble(secondsintoyear=5, nano=1, val=1.0)
                                .SerializeToString()) + b"\n"  # fmt: skip
            self._status(h, 200, escape_bytes(info.SerializeToString()) + b"\n" + line * 200_000)
            return
        held = self.pvs.get(pv, self.default)
        if held is None:
            self._status(h, 404, f"Unable to find typeinfo for pv {pv}".encode())
            return
        samples = held.samples if isinstance(held, Held) else held.samples(end)
        before = [s for s in samples if s[0] < start][-1:]
        inside = [s for s in samples if start <= s[0] <= end]
        if op in ("optimized", "optimizedSample"):
            interval = max(1, (end // NS - start // NS) // n)
            if len(before) + len(inside) <= n:
                body = _pb(pv, ee.PayloadType.SCALAR_DOUBLE, _raw_rows(before + inside))
            else:
                rows = _bins(before, inside, interval, start, end, fill=op == "optimized")
                body = _pb(pv, ee.PayloadType.WAVEFORM_DOUBLE, rows, elements=5)
        elif op in ("mean", "count"):
            rows = _bins(before, inside, n, start, end, fill=True)
            which = 0 if op == "mean" else 4
            body = _pb(pv, ee.PayloadType.SCALAR_DOUBLE,
                       [(t, r[which], sev, ()) for t, r, sev, _ in rows])  # fmt: skip
        else:
            body = _pb(pv, ee.PayloadType.SCALAR_DOUBLE, _raw_rows(before + inside))
        self._status(h, 200, body)

    def _status(self, h: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/x-protobuf")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        with contextlib.suppress(OSError):  # the reader gave up: what it got is what is tested
            h.wfile.write(body)

    def _trickle(self, h: BaseHTTPRequestHandler) -> None:
        """A valid start, then a byte every 50 ms, for as long as the reader stays."""
        h.send_response(200)
        h.send_header("Content-Type", "application/x-protobuf")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        info = ee.PayloadInfo(type=ee.PayloadType.SCALAR_DOUBLE, pvname="SLOW", year=2026)
        head = escape_bytes(info.SerializeToString())
        try:
            for byte in head + b"\n" + b"\x08" * 10_000:
                if self._stopping.is_set():
                    return
                h.wfile.write(b"1\r\n" + bytes([byte]) + b"\r\n")
                h.wfile.flush()
                self._stopping.wait(0.05)
        except OSError:
            return


Row = tuple[int, Any, int, tuple[tuple[str, str], ...]]


def _raw_rows(samples: list[Sample]) -> list[Row]:
    return [(t, v, sev, fields) for t, v, sev, _, fields in samples]


def _bins(before: list[Any], inside: list[Any], interval: int, start: int, end: int,
          fill: bool) -> list[tuple[int, list[float], int, tuple[()]]]:  # fmt: skip
    """[mean, std, min, max, count] per bin of `interval` s with samples (every bin from the
    first to `end`'s when `fill`), each at its middle; the sample before `start` in the bin
    before the first."""
    first = start // NS // interval
    groups: dict[int, list[float]] = {}
    severity: dict[int, int] = {}
    for t, v, sev, _, _ in inside:
        b = t // NS // interval
        groups.setdefault(b, []).append(v)
        severity[b] = max(severity.get(b, 0), sev)
    if before and not any(t == start for t, *_ in inside):
        groups.setdefault(first - 1, []).insert(0, before[0][1])
    keys = sorted(groups)
    if fill and keys:
        keys = list(range(keys[0], max(keys[-1], end // NS // interval) + 1))
    out = []
    last: list[float] | None = None
    for b in keys:
        vs = groups.get(b)
        if vs:
            mean = sum(vs) / len(vs)
            spread = sum((x - mean) ** 2 for x in vs)
            std = math.sqrt(spread / (len(vs) - 1)) if len(vs) > 1 else 0.0
            last = [mean, std, min(vs), max(vs), float(len(vs))]
        if last is None:
            continue
        middle = (b * interval + interval // 2) * NS + (NS // 2 if interval % 2 else 0)
        out.append((middle, list(last), severity.get(b, 0), ()))
    return out


def _pb(pv: str, ptype: Any, rows: list[Any], elements: int | None = None) -> bytes:
    """PB/HTTP: a chunk per UTC year, an empty line between, each line escaped."""
    out: list[bytes] = []
    for year, part in _by_year(rows):
        info = ee.PayloadInfo(type=ptype, pvname=pv, year=year)
        if elements is not None:
            info.elementCount = elements
        info.headers.add(name="EGU", val="counts")
        if out:
            out.append(b"")
        out.append(escape_bytes(info.SerializeToString()))
        base = int(datetime.datetime(year, 1, 1, tzinfo=datetime.UTC).timestamp())
        for t, value, sev, fields in part:
            if ptype == ee.PayloadType.WAVEFORM_DOUBLE:
                msg: Any = ee.VectorDouble(val=value)
            else:
                msg = ee.ScalarDouble(val=value)
            msg.secondsintoyear = t // NS - base
            msg.nano = t % NS
            if sev:
                msg.severity = sev
            for name, val in fields:
                msg.fieldvalues.add(name=name, val=val)
            out.append(escape_bytes(msg.SerializeToString()))
    return b"\n".join(out) + b"\n" if out else b""


def _by_year(rows: list[Any]) -> Iterator[tuple[int, list[Any]]]:
    if not rows:
        yield datetime.datetime.now(datetime.UTC).year, []
        return
    year: int | None = None
    part: list[Any] = []
    for r in rows:
        y = datetime.datetime.fromtimestamp(r[0] // NS, datetime.UTC).year
        if y != year and part:
            yield year, part  # type: ignore[misc]
            part = []
        year = y
        part.append(r)
    yield year, part  # type: ignore[misc]
