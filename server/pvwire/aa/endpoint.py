"""The Archiver Appliance's retrieval routes, under `--aa-prefix` (`/retrieval`): `data/getData`
(`.json`, `.raw`, `.csv`), `data/getDataForPVs` (`.json`, `.raw`), `data/getDataAtTime` (POST),
`bpl/getMatchingPVs` and `bpl/getPVStatus`, answered from the hub's history (docs/ARCHIVER.md).

Every request is checked before any work: the origin, the identity, READ on every PV, PVs per
request, the time range, the samples its answer will hold (counted from the rows it will read)
and the identity's samples per second. The answer is then made a piece at a time as the client
reads it: a client that stops reading holds one piece and what the socket buffers, and after
`stall_timeout_s` without progress is dropped. With `donotchunk` the body is counted whole
first (it is bounded by `aa_max_points`) and sent with its length."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from ..access.identity import Authenticator, AuthError, Identity
from ..access.ratelimit import RateLimiter
from ..core.archive import ArchiveMissing
from ..core.hub import Hub
from ..core.recorded import Recorded
from ..errors import BadChannelId, Forbidden, PvwireError
from ..limits import MAX_SEARCH_RESULTS, integer, number
from . import answers, names, pb, spanning, times
from .answers import Answer
from .operators import BadOperator, Operator, Rows, Series, compute, estimate, parse_pv
from .pb import PayloadType
from .source import headers, payload_type, rows_of, string_series

__all__ = ["AaEndpoint"]

log = logging.getLogger("pvwire.aa")

NS = 1_000_000_000
MAX_PVS = integer("aa_max_pvs")
MAX_POINTS = integer("aa_max_points")
MAX_RANGE_NS = int(number("aa_max_range_s") * NS)
_MEDIA = {"json": "application/json", "raw": "application/x-protobuf", "csv": "text/csv"}


class Refused(Exception):
    """A request answered with an HTTP error before any work; `status` and the reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Pieces(Response):
    """A body made a piece at a time as the client reads it (the module docstring)."""

    def __init__(self, pieces: Iterator[bytes], media_type: str, stall_s: float) -> None:
        super().__init__(media_type=media_type)
        # No Content-Length: the body's length is not known before it is made (chunked).
        self.raw_headers = [h for h in self.raw_headers if h[0] != b"content-length"]
        self.pieces = pieces
        self.stall_s = stall_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.ensure_future(_disconnect(receive))
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": self.raw_headers})  # fmt: skip
            for piece in self.pieces:
                if gone.done():
                    return
                await asyncio.wait_for(
                    send({"type": "http.response.body", "body": piece, "more_body": True}),
                    self.stall_s,
                )
                await asyncio.sleep(0)  # other requests and the tick run between pieces
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except TimeoutError:
            log.info("an Archiver Appliance API client stopped reading; dropped")
        finally:
            gone.cancel()


async def _disconnect(receive: Receive) -> None:
    """Returns when the client has gone (what came before, the request's body, was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class AaEndpoint:
    def __init__(self, hub: Hub, authenticator: Authenticator) -> None:
        self.hub = hub
        self.authenticator = authenticator
        rate = hub.settings.aa_points_per_s
        self.limiter = RateLimiter(rate, 2 * rate)

    def router(self) -> APIRouter:
        router = APIRouter(prefix=self.hub.settings.aa_prefix)
        for ext in ("json", "raw", "csv"):
            router.add_api_route(f"/data/getData.{ext}", self._route(self.get_data, ext),
                                 methods=["GET"])  # fmt: skip
        for ext in ("json", "raw"):
            router.add_api_route(f"/data/getDataForPVs.{ext}", self._route(self.get_data, ext),
                                 methods=["GET", "POST"])  # fmt: skip
        router.add_api_route("/data/getDataAtTime", self._route(self.data_at_time, ""),
                             methods=["POST"])  # fmt: skip
        router.add_api_route("/bpl/getMatchingPVs", self._route(self.matching, ""),
                             methods=["GET"])  # fmt: skip
        router.add_api_route("/bpl/getPVStatus", self._route(self.status, ""),
                             methods=["GET", "POST"])  # fmt: skip
        return router

    def _route(self, handler: Callable[..., Any], ext: str) -> Callable[[Request], Any]:
        async def route(request: Request) -> Response:
            try:
                identity = self._admit(request)
                return await handler(request, identity, ext)  # type: ignore[no-any-return]
            except (Refused, names.BadNames) as exc:
                return PlainTextResponse(str(exc), status_code=exc.status)

        return route

    def _admit(self, request: Request) -> Identity:
        allowed = self.hub.settings.allowed_origins
        origin = request.headers.get("origin")
        if allowed and origin is not None and origin not in allowed:
            raise Refused(403, f"origin {origin!r} is not allowed")
        peer = request.client.host if request.client else ""
        try:
            return self.authenticator.identify(request.headers, peer, f"aa {request.url.path}")
        except AuthError as exc:
            raise Refused(401, str(exc)) from None

    def _spend(self, identity: Identity, cost: int) -> None:
        if not self.limiter.take(identity.rate_key, cost):
            raise Refused(
                429,
                f"more than {self.limiter.rate:,.0f} samples per second for this identity "
                "(aa_points_per_s); slow down",
            )

    # --- data ---------------------------------------------------------------------------------

    async def get_data(self, request: Request, identity: Identity, ext: str) -> Response:
        params = request.query_params
        asked = params.getlist("pv")
        if request.method == "POST":
            asked += await names.posted(request)
        if not asked:
            raise Refused(400, "PV name is null.")
        _bounded(asked)
        if ext == "csv" and len(asked) > 1:
            raise Refused(400, "getData.csv answers one PV")
        try:
            since, until = times.request_range(params.get("from"), params.get("to"))
        except times.BadTime as exc:
            raise Refused(400, str(exc)) from None
        if until - since > MAX_RANGE_NS:
            raise Refused(400, f"from {times.iso(since)} to {times.iso(until)} is longer than "
                               f"{MAX_RANGE_NS // NS:,} s (aa_max_range_s)")  # fmt: skip
        latest = params.get("fetchLatestMetadata") == "true"
        wanted = [self._wanted(name, identity, since, until) for name in asked]
        points = sum(w[3] for w in wanted)
        if points > MAX_POINTS:
            raise Refused(400, f"the answer would hold up to {points:,} samples, more than "
                               f"{MAX_POINTS:,} (aa_max_points): ask for a shorter range or "
                               "larger bins (mean_N with a larger N)")  # fmt: skip
        self._spend(identity, points + len(wanted))
        parts = await self._archive_parts(wanted, since, until, identity, MAX_POINTS - points)
        for (name, _, rec, _), part in zip(wanted, parts, strict=True):
            unknown = rec.rings is None and not rec.open and not self.hub.knows(rec.id)
            if unknown and part is not None and part.series is not None and not len(part.series):
                raise Refused(404, f"Unable to find typeinfo for pv {name}")

        def made() -> Iterator[Answer]:
            for (name, op, rec, _), part in zip(wanted, parts, strict=True):
                yield self._answer(name, op, rec, since, until, latest, part)

        pieces = {"json": answers.json_pieces, "raw": answers.raw_pieces,
                  "csv": answers.csv_pieces}[ext](made())  # fmt: skip
        media = _MEDIA[ext]
        chunked = params.get("donotchunk") in (None, "false")
        missing = [(name, part.reason) for (name, *_), part in zip(wanted, parts, strict=True)
                   if part is not None and part.series is None]  # fmt: skip
        response: Response
        if chunked:
            response = Pieces(pieces, media, self.hub.settings.stall_timeout_s)
        else:
            body = []
            for piece in pieces:
                body.append(piece)
                await asyncio.sleep(0)
            response = Response(b"".join(body), media_type=media)
        if missing:
            response.headers[ARCHIVE_HEADER] = _missing_header(missing, len(wanted))
        return response

    async def _archive_parts(self, wanted: list[tuple[str, Operator | None, Recorded, int]],
                             since: int, until: int, identity: Identity,
                             room: int) -> list[spanning.Part | None]:  # fmt: skip
        """Each PV's part older than the server's rows, from its archiver (None: none needed
        or none holds it), read together under one deadline; at most `room` samples."""
        reach = self.hub.archive_reach(identity)
        reach.samples_left = room
        plans: list[tuple[int, spanning.Wanted]] = []
        for i, (_, op, rec, _) in enumerate(wanted):
            if not self.hub.archive_holds(rec.id) or _string(rec):
                continue
            if rec.rings is not None and rec.rings.raw().ring.ndim == 2:
                continue  # an array channel: its past is not read from an archive
            first, own = spanning.seam_of(rec.rings, until)
            if since < first:
                plans.append((i, spanning.plan(op, since, until, first, own)))
        got = await asyncio.gather(
            *(self.hub.read_archive(wanted[i][2].id, w.operator, w.start, w.end, reach)
              for i, w in plans), return_exceptions=True,
        )  # fmt: skip
        parts: list[spanning.Part | None] = [None] * len(wanted)
        for (i, w), one in zip(plans, got, strict=True):
            if isinstance(one, ArchiveMissing):
                parts[i] = spanning.Part(w.seam, None, str(one))
            elif isinstance(one, BaseException):
                raise one
            else:
                parts[i] = spanning.Part(w.seam, one)
        return parts

    def _wanted(self, text: str, identity: Identity, since: int, until: int
                ) -> tuple[str, Operator | None, Recorded, int]:  # fmt: skip
        """(name, operator, channel, samples at most) of one `pv` of a request."""
        try:
            op, name = parse_pv(text)
        except BadOperator as exc:
            raise Refused(400, str(exc)) from None
        if name.endswith(".VAL"):  # the record's value is the record, as the Archiver has it
            name = name[:-4]
        rec = self._recorded(name, identity)
        if rec.rings is None or _string(rec):
            return name, op, rec, 1
        return name, op, rec, estimate(op, rows_of(rec.rings, since, until), since, until)

    def _recorded(self, name: str, identity: Identity) -> Recorded:
        unknown = Refused(404, f"Unable to find typeinfo for pv {name}")
        try:
            rec = self.hub.recorded(name, identity)
        except BadChannelId:
            raise unknown from None
        except Forbidden as exc:
            raise Refused(403, str(exc)) from None
        except PvwireError as exc:
            raise Refused(400, str(exc)) from None
        # Known without listing what the server knows: an unknown PV costs no catalogue walk.
        held = rec.rings is not None or rec.open or self.hub.knows(rec.id)
        if not held and not self.hub.archive_holds(rec.id):  # its archiver may know it
            raise unknown
        return rec

    def _answer(self, name: str, op: Operator | None, rec: Recorded, since: int, until: int,
                latest: bool, part: spanning.Part | None = None) -> Answer:  # fmt: skip
        year = pb.seconds_into_year(until // NS)[0]
        if part is not None:  # reaching into the archive (aa/spanning.py)
            meta = headers(rec.meta, latest)
            if part.series is None:
                meta = [*meta, (ARCHIVE_META, f"missing: {part.reason}")]
            if rec.rings is None:
                rows, ptype = _NO_ROWS, part.series.ptype if part.series else _DOUBLE
            else:
                rows = rows_of(rec.rings, part.seam, until)
                ptype = payload_type(rec, rows.vector)
            return Answer(name, meta, spanning.join(op, part, rows, ptype, since, until), year)
        if rec.rings is None or _string(rec):
            return Answer(name, headers(rec.meta, latest), string_series(rec, until), year)
        rows = rows_of(rec.rings, since, until)
        series = compute(op, rows, payload_type(rec, rows.vector), since, until)
        return Answer(name, headers(rec.meta, latest), series, year)

    async def data_at_time(self, request: Request, identity: Identity, _: str) -> Response:
        asked = await names.posted(request)
        _bounded(asked)
        at_text = request.query_params.get("at")
        try:
            at = times.parse_instant(at_text) if at_text else time.time_ns()
        except times.BadTime as exc:
            raise Refused(400, str(exc)) from None
        self._spend(identity, len(asked))
        out: dict[str, Any] = {}
        for name in asked:
            try:
                rec = self._recorded(name[:-4] if name.endswith(".VAL") else name, identity)
            except Refused:
                continue  # as the Archiver Appliance: a PV it cannot answer is left out
            if rec.rings is None or _string(rec):
                series = string_series(rec, at)
            else:
                rows = rows_of(rec.rings, at, at)
                series = compute(None, rows, payload_type(rec, rows.vector), at, at)
            if len(series):
                out[name] = _at(series)
            await asyncio.sleep(0)
        # json's NaN and Infinity, as the Archiver Appliance writes them (JSONResponse refuses).
        return Response(json.dumps(out), media_type="application/json")

    # --- bpl ----------------------------------------------------------------------------------

    def _catalogue(self, identity: Identity) -> _Catalogue:
        return _Catalogue(self.hub, identity, self._spend, self._shown)

    def _shown(self, cid: str) -> str:
        """An id as a PV name: bare for the default scheme, as the clients' users write them."""
        prefix = self.hub.settings.default_scheme + "://"
        return cid[len(prefix) :] if cid.startswith(prefix) else cid

    async def matching(self, request: Request, identity: Identity, _: str) -> Response:
        params = request.query_params
        if "regex" in params:
            pattern = params["regex"]
        elif "pv" in params:  # a glob made a regex as the Archiver Appliance does, unescaped
            pattern = params["pv"].replace("*", ".*").replace("?", ".")
        else:
            raise Refused(404, "getMatchingPVs needs regex= or pv=")
        limit = _limit(params.get("limit"), 500)
        found = await self._catalogue(identity).matching(names.compiled(pattern), sys.maxsize)
        return JSONResponse(found[:limit])

    async def status(self, request: Request, identity: Identity, _: str) -> Response:
        params = request.query_params
        asked = [x for p in params.getlist("pv") for x in p.split(",") if x]
        if request.method == "POST":
            asked += await names.posted(request)
        _bounded(asked)
        limit = _limit(params.get("limit"), -1)
        most = min(limit, MAX_PVS + 1)  # one past the bound is enough to refuse the request
        known = self._catalogue(identity)
        found: list[str] = []
        if "regex" in params and not asked:
            found = await known.matching(names.compiled(params["regex"]), most)
        for pv in asked:
            if len(found) >= most:
                break
            if "*" in pv or "?" in pv:
                pattern = names.compiled(names.glob_regex(pv))
                found += await known.matching(pattern, most - len(found))
            else:
                found.append(pv)
        found = found[:limit]
        if len(found) > MAX_PVS:
            raise _too_many(len(found), matched=True)
        out = []
        for name in found:
            try:
                rec = self._recorded(name, identity)
            except Refused:
                out.append({"pvName": name, "status": "Not being archived"})
                continue
            out.append(self._status_of(name, rec))
        return JSONResponse(out)

    def _status_of(self, name: str, rec: Recorded) -> dict[str, str]:
        if rec.rings is None and not rec.open:
            return {"pvName": name, "status": "Not being archived"}
        common = {"appliance": self.hub.settings.instance, "pvName": name,
                  "pvNameOnly": self._shown(rec.id)}  # fmt: skip
        if not rec.open:  # its history is kept, nothing is recorded now
            return {**common, "status": "Paused"}
        return {
            **common,
            "status": "Being archived",
            "isMonitored": "true",
            "samplingPeriod": "0.0",
            "connectionState": "true" if rec.connected else "false",
            "lastEvent": times.human(rec.seconds),
            "recorded": "true" if rec.rings is not None else f"false: {rec.unkept}",
        }


class _Catalogue:
    """The ids the server knows as one request matches patterns against them (aa/names.py):
    listed when a pattern first needs them, at one sample each, then one sample per id a
    pattern is matched against; only those its identity may read are found."""

    def __init__(
        self,
        hub: Hub,
        identity: Identity,
        spend: Callable[[Identity, int], None],
        shown: Callable[[str], str],
    ) -> None:
        """`spend`: the endpoint's cost per identity; `shown`: an id as its name is shown."""
        self._hub, self._identity = hub, identity
        self._spend, self._shown = partial(spend, identity), shown
        self._ids: list[str] | None = None

    async def matching(self, pattern: Any, most: int) -> list[str]:
        """The names of the ids `pattern` matches, at most `most`."""
        spend, hub = self._spend, self._hub
        if self._ids is None:
            self._ids = hub.known_ids()
            spend(len(self._ids))
        spend(1)  # a pattern costs at least one sample, however few the ids
        found = await names.matched(pattern, self._ids, self._shown,
                                    partial(hub.may_read, self._identity), spend, most)  # fmt: skip
        await asyncio.sleep(0)  # between patterns too, whatever the catalogue's size
        return sorted(found)  # the found, not the catalogue: ~35 ms of loop for 100,000 ids


# A response whose archive part is missing for some PVs says so, with the first reason; each
# such PV's `meta` (JSON) or PayloadInfo headers (PB) say so too.
ARCHIVE_HEADER = "Pvwire-Archive"
ARCHIVE_META = "pvwireArchive"
_DOUBLE = PayloadType.SCALAR_DOUBLE
_NO_ROWS = Rows(np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0),
                np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                np.zeros(0, np.bool_), 0)  # fmt: skip


def _missing_header(missing: list[tuple[str, str]], of: int) -> str:
    name, reason = missing[0]
    text = f"missing for {len(missing)} of {of} PVs; {name}: {reason}"
    return "".join(c if c.isprintable() and ord(c) < 128 else "?" for c in text)[:400]


def _string(rec: Recorded) -> bool:
    """A string channel: the history keeps none of its values, its answer is its current one."""
    return isinstance(rec.value, str) or rec.meta.type == "string"


def _too_many(n: int, matched: bool = False) -> Refused:
    more = " or more" if matched else ""
    return Refused(400, f"{n:,}{more} PVs in one request; at most {MAX_PVS:,} (aa_max_pvs)")


def _bounded(asked: list[str]) -> None:
    """A request's names within aa_max_pvs and aa_max_names_bytes, before anything is done
    with them."""
    if len(asked) > MAX_PVS:
        raise _too_many(len(asked))
    names.too_many_bytes(asked)


def _limit(text: str | None, default: int) -> int:
    """A `limit` parameter: -1 (or any number below 1) for all, at most MAX_SEARCH_RESULTS."""
    if text is None:
        return _limit(str(default), default)
    try:
        n = int(text)
    except ValueError:
        raise Refused(400, f"limit must be a number, not {text[:40]!r}") from None
    return MAX_SEARCH_RESULTS if n < 1 else min(n, MAX_SEARCH_RESULTS)


def _at(s: Series) -> dict[str, Any]:
    """`getDataAtTime`'s answer for one PV: its last sample, with its type in `meta`."""
    i = len(s) - 1
    value = answers.values(s)[i]
    if isinstance(value, np.ndarray):
        value = value.tolist()
    secs, nanos = divmod(int(s.t[i]), NS)
    return {
        "nanos": nanos,
        "secs": secs,
        "severity": int(s.severity[i]),
        "status": int(s.status[i]),
        "val": value,
        "meta": {"DBRType": "DBR_" + PayloadType(s.ptype).name},
    }
