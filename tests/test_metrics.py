"""/metrics as text: exact numbers, every failure unit, and label values from allow-lists only
(the hub in memory with a test-double backend; tests/test_operations_doc.py reads the served
page)."""

from __future__ import annotations

import dataclasses
import re

import pytest
from pvwire.api.metrics import render_metrics
from pvwire.core import view as view_module
from pvwire.core.channel import ALL_MODE_LIMIT
from pvwire.core.hub import Hub
from pvwire.wire.codes import CLOSE_CODES
from pvwire.worker import WorkerIdentity

from .hub_doubles import Client, FakeBackend, attach

SAMPLE = re.compile(r"^(pvwire_\w+)(?:\{(.*)\})? (\S+)$")


def samples(text: str, name: str) -> dict[str, str]:
    """labels as written -> value, for the samples of series `name`."""
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m[1] == name:
            out[m[2] or ""] = m[3]
    return out


def test_integers_stay_integers_and_floats_are_exact(hub: Hub) -> None:
    snap = dataclasses.replace(
        hub.snapshot(detail=False),
        bytes_out=123_456_789,
        frames_out=2**53 + 1,
        loop_lag=0.1234567,
        client_count=10_000_001,
    )
    text = render_metrics(snap)
    assert samples(text, "pvwire_bytes_sent_total") == {"": "123456789"}
    assert samples(text, "pvwire_frames_sent_total") == {"": "9007199254740993"}
    assert samples(text, "pvwire_clients") == {"": "10000001"}
    assert samples(text, "pvwire_event_loop_lag_seconds") == {"": "0.1234567"}


def test_every_failure_unit_is_exported(hub: Hub) -> None:
    hub.ticker.count_failure("reduction")
    hub.ticker.count_failure("reduction")
    text = render_metrics(hub.snapshot(detail=False))
    assert samples(text, "pvwire_failures_total") == {
        'unit="channel"': "0",
        'unit="reduction"': "2",
        'unit="view"': "0",
        'unit="session"': "0",
        'unit="history"': "0",
    }


def test_close_codes_a_client_sends_cannot_grow_the_series(hub: Hub) -> None:
    for code in range(1000, 5000):  # every code a client may put in its close frame
        hub.count_close(code)
    hub.count_close(4008)
    found = samples(render_metrics(hub.snapshot(detail=False)), "pvwire_disconnects_total")
    assert found['code="4008"'] == "2" and found['code="1005"'] == "1"
    allowed = {*CLOSE_CODES, 1005, 1007}
    assert set(found) == {f'code="{c}"' for c in allowed} | {'code="other"'}
    assert found['code="other"'] == str(4000 - len(allowed))


def test_under_workers_every_sample_names_its_worker_once(hub: Hub) -> None:
    worker = WorkerIdentity(instance="host-1", pid=123, worker=2, workers=3)
    text = render_metrics(hub.snapshot(detail=False), worker)
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert len(lines) > 20
    for line in lines:
        m = SAMPLE.match(line)
        assert m is not None and m[2] is not None, line
        names = re.findall(r'(\w+)="', m[2])
        assert names.count("worker") == 1 and len(names) == len(set(names)), line
        assert 'worker="2"' in m[2]


async def test_clients_and_channels_are_counted_in_the_snapshot(hub: Hub) -> None:
    a, b = Client(hub), Client(hub)
    attach(a, hub, ["fake://a", "fake://b"])
    attach(b, hub, ["fake://a"])
    snap = hub.snapshot(detail=False)
    assert (snap.clients, snap.channels) == ((), ())  # no detail, the counts all the same
    text = render_metrics(snap)
    assert samples(text, "pvwire_clients") == {"": "2"}
    assert samples(text, "pvwire_channels") == {"": "2"}
    assert hub.channel_count == 2


def test_what_pvas_own_client_refused_is_exported_by_reason(hub: Hub) -> None:
    from pvwire.upstream.pva_identity import PEER_REASONS

    counts = dict.fromkeys(PEER_REASONS, 0) | {"type_nodes": 2, "search_reply": 7}
    snap = dataclasses.replace(hub.snapshot(detail=False), peer_refusals={"pva": counts})
    got = samples(render_metrics(snap), "pvwire_peer_refusals_total")
    assert got == {f'scheme="pva",reason="{r}"': str(n) for r, n in counts.items()}
    assert "pvwire_peer_refusals_total" in render_metrics(hub.snapshot(detail=False))


async def test_deliveries_count_each_channel_update_queued_for_each_client(
    hub: Hub, backend: FakeBackend
) -> None:
    a, b = Client(hub), Client(hub)
    attach(a, hub, ["fake://x", "fake://y"])
    attach(b, hub, ["fake://x"])
    before = hub.snapshot(detail=False).deliveries
    backend.update("x", 1.0)
    backend.update("y", 2.0)
    hub.ticker.tick()
    assert hub.snapshot(detail=False).deliveries == before + 3  # a: x and y, b: x
    hub.remove_session(a.session)  # a client that leaves keeps its share of the total
    text = render_metrics(hub.snapshot(detail=False))
    assert samples(text, "pvwire_deliveries_total") == {"": str(before + 3)}


async def test_dropped_counts_all_mode_updates_past_either_bound(
    hub: Hub, backend: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    attach(Client(hub), hub, ["fake://x"], mode="ALL")
    # One channel: all_mode_per_channel updates kept between two ticks, the rest dropped.
    for i in range(ALL_MODE_LIMIT + 5):
        backend.update("x", float(i))
    hub.ticker.tick()
    assert hub.snapshot(detail=False).dropped == 5
    # One subscription: entries kept between two of its DATA (here a maxRate of one per
    # 1,000 s holds them), the oldest beyond all_mode_per_view (here 4) dropped.
    monkeypatch.setattr(view_module, "ALL_PENDING_LIMIT", 4)
    # `attach` ticks once: the view's first DATA (metadata, connection), the next 1,000 s away.
    attach(Client(hub), hub, ["fake://y", "fake://z"], mode="ALL", max_rate=0.001)
    for i in range(3):
        backend.update("y", float(i))
        backend.update("z", float(i))
        hub.ticker.tick()
    text = render_metrics(hub.snapshot(detail=False))
    assert samples(text, "pvwire_dropped_total") == {"": str(5 + 6 - 4)}
