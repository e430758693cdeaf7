"""Prometheus text exposition for /metrics, named by what each series counts."""

from __future__ import annotations

from .hub import TICK_BUCKETS_MS, Hub

__all__ = ["render_metrics"]


def render_metrics(hub: Hub) -> str:
    s = hub.stats
    totals = hub.totals()
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP pvwire_{name} {help_text}")
        lines.append(f"# TYPE pvwire_{name} {kind}")
        lines.extend(f"pvwire_{name}{labels} {value:g}" for labels, value in samples)

    metric("clients", "gauge", "Connected stream clients.", [("", len(hub.sessions))])
    metric("channels", "gauge", "Open upstream channels.", [("", len(hub.channels))])
    metric("views", "gauge", "Distinct subscriptions being served.", [("", len(hub.views))])
    metric(
        "updates_received_total",
        "counter",
        "Upstream updates received.",
        [("", totals["updates_in"])],
    )
    metric(
        "frames_sent_total",
        "counter",
        "Stream messages sent to clients.",
        [("", totals["frames_out"])],
    )
    metric(
        "bytes_sent_total", "counter", "Stream bytes sent to clients.", [("", totals["bytes_out"])]
    )
    metric(
        "conflated_total",
        "counter",
        "Entries merged because a client was behind.",
        [("", totals["conflated"])],
    )
    metric(
        "queued_bytes",
        "gauge",
        "Bytes queued for all clients.",
        [("", sum(x.queued_bytes for x in hub.sessions))],
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
        [('{source="cache"}', s.cache_gets), ('{source="upstream"}', s.upstream_gets)],
    )
    metric(
        "puts_total",
        "counter",
        "Puts, by result.",
        [('{result="ok"}', s.puts - s.put_errors), ('{result="error"}', s.put_errors)],
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
        lines.append(f'pvwire_tick_duration_seconds_bucket{{le="{bound / 1000:g}"}} {cumulative}')
    lines.append(f'pvwire_tick_duration_seconds_bucket{{le="+Inf"}} {s.ticks}')
    lines.append(f"pvwire_tick_duration_seconds_sum {s.tick_seconds:g}")
    lines.append(f"pvwire_tick_duration_seconds_count {s.ticks}")
    return "\n".join(lines) + "\n"
