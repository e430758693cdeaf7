"""Prometheus text exposition for /metrics, named by what each series counts."""

from __future__ import annotations

from .. import __version__
from ..core.stats import HubSnapshot
from ..core.tick import TICK_BUCKETS_MS
from ..worker import WorkerIdentity

__all__ = ["render_metrics"]


def render_metrics(
    s: HubSnapshot, clients: int, channels: int, worker: WorkerIdentity | None = None
) -> str:
    lines: list[str] = []
    # Under `--workers N` each scrape is answered by whichever worker the kernel hands the
    # connection to: a `worker` label on every series keeps each worker's counters a series of
    # their own, so rate() never mixes two processes' counters. A lone process needs none.
    own = f'worker="{worker.worker}"' if worker is not None and worker.workers > 1 else ""

    def with_own(labels: str) -> str:
        if not own:
            return labels
        return f"{{{own},{labels[1:]}" if labels else f"{{{own}}}"

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP pvwire_{name} {help_text}")
        lines.append(f"# TYPE pvwire_{name} {kind}")
        lines.extend(f"pvwire_{name}{with_own(labels)} {value:g}" for labels, value in samples)

    if worker is not None:
        info = (
            f'{{instance="{_escape(worker.instance)}",pid="{worker.pid}",'
            f'version="{__version__}",worker="{worker.worker}",workers="{worker.workers}"}}'
        )
        metric("server_info", "gauge", "The process that answered this scrape (always 1).",
               [(info, 1)])  # fmt: skip

    metric("clients", "gauge", "Connected stream clients.", [("", clients)])
    metric("channels", "gauge", "Open upstream channels.", [("", channels)])
    metric(
        "upstream_channels",
        "gauge",
        "Channels held open by the upstream libraries, by scheme and state.",
        [
            (f'{{scheme="{scheme}",state="{state}"}}', n)
            for scheme, counts in s.upstream_channels.items()
            for state, n in sorted(counts.items())
        ],
    )
    metric("views", "gauge", "Distinct subscriptions being served.", [("", s.views)])
    metric(
        "updates_received_total",
        "counter",
        "Upstream updates received.",
        [("", s.updates_in)],
    )
    metric(
        "frames_sent_total",
        "counter",
        "Stream messages sent to clients.",
        [("", s.frames_out)],
    )
    metric("bytes_sent_total", "counter", "Stream bytes sent to clients.", [("", s.bytes_out)])
    metric(
        "conflated_total",
        "counter",
        "Entries merged because a client was behind.",
        [("", s.conflated)],
    )
    metric(
        "queued_bytes",
        "gauge",
        "Bytes queued for all clients.",
        [("", s.queued_bytes)],
    )
    metric(
        "disconnects_total",
        "counter",
        "Stream connections closed, by close code.",
        [(f'{{code="{c}"}}', n) for c, n in sorted(s.closes_by_code.items())],
    )
    metric(
        "gets_total",
        "counter",
        "GraphQL gets, by where the answer came from.",
        [
            ('{source="cache"}', s.control.cache_gets),
            ('{source="upstream"}', s.control.upstream_gets),
        ],
    )
    metric(
        "puts_total",
        "counter",
        "Puts, by result.",
        [
            ('{result="ok"}', s.control.puts - s.control.put_errors),
            ('{result="error"}', s.control.put_errors),
        ],
    )
    metric(
        "failures_total",
        "counter",
        "Failures contained to one unit (a channel turned FAILED, a view or a session closed).",
        [(f'{{unit="{u}"}}', s.failures.get(u, 0)) for u in ("channel", "view", "session")],
    )
    metric(
        "event_loop_lag_seconds",
        "gauge",
        "Worst event loop lag in the last 10 s.",
        [("", s.loop_lag)],
    )
    lines.append("# HELP pvwire_tick_duration_seconds Time to process one tick.")
    lines.append("# TYPE pvwire_tick_duration_seconds histogram")
    cumulative = 0
    for bound, count in zip(TICK_BUCKETS_MS, s.tick_buckets, strict=False):
        cumulative += count
        le = with_own(f'{{le="{bound / 1000:g}"}}')
        lines.append(f"pvwire_tick_duration_seconds_bucket{le} {cumulative}")
    inf = with_own('{le="+Inf"}')
    lines.append(f"pvwire_tick_duration_seconds_bucket{inf} {s.ticks}")
    lines.append(f"pvwire_tick_duration_seconds_sum{with_own('')} {s.tick_seconds:g}")
    lines.append(f"pvwire_tick_duration_seconds_count{with_own('')} {s.ticks}")
    return "\n".join(lines) + "\n"


def _escape(label: str) -> str:
    """A label value as the text format wants it: backslash, quote and newline escaped."""
    return label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
