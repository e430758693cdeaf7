"""Prometheus text exposition for /metrics, named by what each series counts.

One table (`METRICS`): name, kind, help and the getter that reads a scrape's snapshot. Rules the
renderer keeps for every series:
- Integers are written as integers and floats exactly (`repr`): `{:g}` wrote a counter of
  123,456,789 as `1.23457e+08`, so `rate()` read 0 or jumped.
- A label's values come from an allow-list: anything else is counted under `other`, so what a
  client sends (a close code) cannot grow the number of series (~2,000 codes otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from .. import __version__
from ..access.refusals import PUT_REASONS, REASONS
from ..core.archive.fetch import OUTCOMES as ARCHIVE_OUTCOMES
from ..core.mjpeg import MjpegStats
from ..core.stats import FAILURE_UNITS, HubSnapshot
from ..core.tick import TICK_BUCKETS_MS
from ..wire.codes import CLOSE_CODES
from ..worker import WorkerIdentity
from .connections import REFUSAL_REASONS, TIMEOUT_PHASES, ConnectionStats

__all__ = ["METRICS", "Metric", "render_metrics"]

Number = int | float
Labels = tuple[tuple[str, str], ...]
Sample = tuple[str, Labels, Number]  # (name suffix, labels, value)
OTHER = "other"


@dataclass(frozen=True, slots=True)
class Scrape:
    """What one scrape reads: the hub's snapshot and the process that answered."""

    snapshot: HubSnapshot
    worker: WorkerIdentity | None
    mjpeg: MjpegStats
    connections: ConnectionStats = field(default_factory=ConnectionStats)


@dataclass(frozen=True, slots=True)
class Metric:
    name: str  # without the `pvwire_` prefix
    kind: Literal["counter", "gauge", "histogram"]
    help: str
    samples: Callable[[Scrape], Iterable[Sample]]
    # label -> the values exported as they are; a label not listed here is free (bounded by
    # the server's own configuration, e.g. the schemes it serves).
    allowed: Mapping[str, frozenset[str]] = field(default_factory=dict)


def _one(value: Callable[[HubSnapshot], Number]) -> Callable[[Scrape], Iterable[Sample]]:
    return lambda s: [("", (), value(s.snapshot))]


def _mjpeg(value: Callable[[MjpegStats], Number]) -> Callable[[Scrape], Iterable[Sample]]:
    return lambda s: [("", (), value(s.mjpeg))]


def _server_info(s: Scrape) -> Iterable[Sample]:
    w = s.worker
    if w is None:
        return []
    labels = (("instance", w.instance), ("pid", str(w.pid)), ("version", __version__),
              ("worker", str(w.worker)), ("workers", str(w.workers)))  # fmt: skip
    return [("", labels, 1)]


def _tick_histogram(s: Scrape) -> Iterable[Sample]:
    snap, cumulative = s.snapshot, 0
    for bound, count in zip(TICK_BUCKETS_MS, snap.tick_buckets, strict=False):
        cumulative += count
        yield "_bucket", (("le", _number(bound / 1000)),), cumulative
    yield "_bucket", (("le", "+Inf"),), snap.ticks
    yield "_sum", (), snap.tick_seconds
    yield "_count", (), snap.ticks


# WebSocket codes a closed stream can report besides the table's: 1005 (the client's close
# frame had no code) and 1007 (a text frame that is not UTF-8, closed by the WebSocket layer).
_CLOSE_CODES_SEEN = frozenset(str(c) for c in (*CLOSE_CODES, 1005, 1007))
_PUT_RESULTS = frozenset({"ok", "error"})


def _disconnects(s: Scrape) -> Iterable[Sample]:
    by_code = sorted(s.snapshot.closes_by_code.items())
    for code, n in sorted(by_code, key=lambda cn: str(cn[0]) not in _CLOSE_CODES_SEEN):
        yield "", (("code", str(code)),), n  # the table's codes first, then `other`


METRICS: tuple[Metric, ...] = (
    Metric("server_info", "gauge", "The process that answered this scrape (always 1).",
           _server_info),
    Metric("clients", "gauge", "Connected clients of /stream and /pvws/pv.",
           _one(lambda s: s.client_count)),
    Metric("channels", "gauge", "Open upstream channels.", _one(lambda s: s.channel_count)),
    Metric("upstream_channels", "gauge",
           "Channels held open by the upstream libraries, by scheme and state.",
           lambda s: [("", (("scheme", scheme), ("state", state)), n)
                      for scheme, counts in s.snapshot.upstream_channels.items()
                      for state, n in sorted(counts.items())]),
    Metric("views", "gauge", "Distinct subscriptions being served.", _one(lambda s: s.views)),
    Metric("updates_received_total", "counter", "Upstream updates received.",
           _one(lambda s: s.updates_in)),
    Metric("frames_sent_total", "counter", "Stream messages sent to clients.",
           _one(lambda s: s.frames_out)),
    Metric("bytes_sent_total", "counter", "Stream bytes sent to clients.",
           _one(lambda s: s.bytes_out)),
    Metric("conflated_total", "counter", "Entries merged because a client was behind.",
           _one(lambda s: s.conflated)),
    Metric("deliveries_total", "counter",
           "Channel updates queued for clients (/stream DATA entries, /pvws/pv updates).",
           _one(lambda s: s.deliveries)),
    Metric("dropped_total", "counter",
           "ALL mode updates dropped at its bounds (all_mode_per_channel, all_mode_per_view).",
           _one(lambda s: s.dropped)),
    Metric("queued_bytes", "gauge", "Bytes queued for all clients.",
           _one(lambda s: s.queued_bytes)),
    Metric("disconnects_total", "counter",
           "Stream connections closed, by close code (codes outside the protocol's table: "
           f'code="{OTHER}").',
           _disconnects,
           {"code": _CLOSE_CODES_SEEN}),
    Metric("gets_total", "counter", "GraphQL gets, by where the answer came from.",
           lambda s: [("", (("source", "cache"),), s.snapshot.control.cache_gets),
                      ("", (("source", "upstream"),), s.snapshot.control.upstream_gets)],
           {"source": frozenset({"cache", "upstream"})}),
    Metric("puts_total", "counter", "Puts, by result.",
           lambda s: [("", (("result", "ok"),),
                       s.snapshot.control.puts - s.snapshot.control.put_errors),
                      ("", (("result", "error"),), s.snapshot.control.put_errors)],
           {"result": _PUT_RESULTS}),
    Metric("failures_total", "counter",
           "Failures contained to one unit (a channel turned FAILED, a reduction sent whole, "
           "a view or a session closed).",
           lambda s: [("", (("unit", u),), s.snapshot.failures.get(u, 0)) for u in FAILURE_UNITS],
           {"unit": frozenset(FAILURE_UNITS)}),
    Metric("auth_refusals_total", "counter",
           "Refused authentications (bad, expired or misaddressed tokens, untrusted proxy "
           "headers), by reason.",
           lambda s: [("", (("reason", r),), s.snapshot.auth_refusals.get(r, 0)) for r in REASONS],
           {"reason": frozenset(REASONS)}),
    Metric("put_refusals_total", "counter",
           "Puts refused by pvwire (its rate limit, its rules), by reason: every one, also "
           "those whose audit line a flood left out.",
           lambda s: [("", (("reason", r),), s.snapshot.put_refusals.get(r, 0))
                      for r in PUT_REASONS],
           {"reason": frozenset(PUT_REASONS)}),
    Metric("peer_refusals_total", "counter",
           "What pvwire's own PVA client (puts as a user) refused from servers, by reason: a "
           "protocol error that closed the connection (message_bytes, type_depth, type_nodes, "
           "type_cache, malformed), a reply to nothing asked (unsolicited), a search answer to "
           "no pending search or from an address not searched (search_reply), a MESSAGE left "
           "out of the log (message_log).",
           lambda s: [("", (("scheme", scheme), ("reason", reason)), n)
                      for scheme, counts in s.snapshot.peer_refusals.items()
                      for reason, n in counts.items()]),
    Metric("archive_reads_total", "counter",
           "Reads of the facility's archive behind the history (--archiver), by outcome: read, "
           "cached, shared (with a read under way), unknown (a PV the archiver lacks); missed: "
           "timeout, down, http_error, malformed, too_large, refused (values pvwire cannot "
           "use), busy (no turn in time), skipped (the archiver is left alone after a failure), "
           "failed.",
           lambda s: [("", (("outcome", o),), s.snapshot.archive_reads.get(o, 0))
                      for o in ARCHIVE_OUTCOMES],
           {"outcome": frozenset(ARCHIVE_OUTCOMES)}),
    Metric("archive_cache_bytes", "gauge", "Archivers' answers held for repeated reads.",
           _one(lambda s: s.archive_cache_bytes)),
    Metric("event_loop_lag_seconds", "gauge", "Worst event loop lag in the last 10 s.",
           _one(lambda s: s.loop_lag)),
    Metric("tick_duration_seconds", "histogram", "Time to process one tick.", _tick_histogram),
    Metric("history_budget_bytes", "gauge", "Memory allowed for recent history (--history-mb).",
           _one(lambda s: s.history.budget_bytes)),
    Metric("history_bytes", "gauge", "Memory held by recent history.",
           _one(lambda s: s.history.used_bytes)),
    Metric("history_channels", "gauge",
           "Channels with recent history, by whether they are monitored now.",
           lambda s: [("", (("monitored", "true"),), s.snapshot.history.monitored),
                      ("", (("monitored", "false"),),
                       s.snapshot.history.channels - s.snapshot.history.monitored)],
           {"monitored": frozenset({"true", "false"})}),
    Metric("history_refused_total", "counter",
           "Channels (or their arrays) that got no history: the budget was full of monitored "
           "channels.",
           _one(lambda s: s.history.refused)),
    Metric("history_reclaimed_total", "counter",
           "Histories of channels no longer monitored, dropped to make room for new ones.",
           _one(lambda s: s.history.reclaimed)),
    # MJPEG feeds are neither clients nor connections: one feed serves many viewers.
    Metric("mjpeg_feeds", "gauge",
           "MJPEG feeds open: one JPEG encoding per frame each, shared by its viewers.",
           _mjpeg(lambda m: m.feeds)),
    Metric("mjpeg_viewers", "gauge", "MJPEG responses being streamed (/mjpeg).",
           _mjpeg(lambda m: m.viewers)),
    Metric("mjpeg_encodes_total", "counter", "JPEGs encoded by the MJPEG feeds.",
           _mjpeg(lambda m: m.encodes)),
    Metric("mjpeg_frames_sent_total", "counter", "JPEG parts sent to MJPEG viewers.",
           _mjpeg(lambda m: m.frames_sent)),
    Metric("mjpeg_bytes_sent_total", "counter", "Bytes sent to MJPEG viewers.",
           _mjpeg(lambda m: m.bytes_sent)),
    # Counted at accept (api/connections.py): HTTP and WebSocket, before any byte is read.
    Metric("connections", "gauge", "Open connections, HTTP and WebSocket.",
           lambda s: [("", (), s.connections.open)]),
    Metric("connections_refused_total", "counter",
           "Connections answered at once and closed: their address had all its connections "
           "(per_address, 429) or the process all it takes (capacity, 503).",
           lambda s: [("", (("reason", r),), s.connections.refused.get(r, 0))
                      for r in REFUSAL_REASONS],
           {"reason": frozenset(REFUSAL_REASONS)}),
    Metric("request_timeouts_total", "counter",
           "HTTP requests answered 408 and closed: headers or body too slow; or dropped: "
           "the client read nothing of the response (response).",
           lambda s: [("", (("phase", p),), s.connections.timeouts.get(p, 0))
                      for p in TIMEOUT_PHASES],
           {"phase": frozenset(TIMEOUT_PHASES)}),
)  # fmt: skip


def render_metrics(
    s: HubSnapshot,
    worker: WorkerIdentity | None = None,
    mjpeg: MjpegStats | None = None,
    connections: ConnectionStats | None = None,
) -> str:
    scrape = Scrape(s, worker, mjpeg or MjpegStats(), connections or ConnectionStats())
    # Under `--workers N` each scrape is answered by whichever worker the kernel hands the
    # connection to: a `worker` label on every series keeps each worker's counters a series of
    # their own, so rate() never mixes two processes' counters. A lone process needs none.
    own = (("worker", str(worker.worker)),) if worker is not None and worker.workers > 1 else ()
    lines: list[str] = []
    for metric in METRICS:
        samples = _allowed(metric, metric.samples(scrape))
        lines.append(f"# HELP pvwire_{metric.name} {metric.help}")
        lines.append(f"# TYPE pvwire_{metric.name} {metric.kind}")
        for (suffix, labels), value in samples.items():
            if own and not any(k == "worker" for k, _ in labels):
                labels = own + labels
            lines.append(f"pvwire_{metric.name}{suffix}{_labels(labels)} {_number(value)}")
    return "\n".join(lines) + "\n"


def _allowed(metric: Metric, samples: Iterable[Sample]) -> dict[tuple[str, Labels], Number]:
    """The samples with every label value outside its allow-list replaced by `other`, and
    samples that thereby share their labels summed (in the order first seen)."""
    out: dict[tuple[str, Labels], Number] = {}
    for suffix, labels, value in samples:
        if metric.allowed:
            labels = tuple(
                (k, v if k not in metric.allowed or v in metric.allowed[k] else OTHER)
                for k, v in labels
            )
        key = (suffix, labels)
        out[key] = out.get(key, 0) + value
    return out


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


def _number(value: Number) -> str:
    """An integer as an integer, a float exactly (the text format reads Go's float syntax)."""
    if isinstance(value, bool | int):
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _escape(label: str) -> str:
    """A label value as the text format wants it: backslash, quote and newline escaped."""
    return label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
