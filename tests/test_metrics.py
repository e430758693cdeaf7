"""/metrics as text: exact numbers, every failure unit, and label values from allow-lists only
(the hub in memory with a test-double backend; tests/test_operations_doc.py reads the served
page)."""

from __future__ import annotations

import dataclasses
import re

from pvwire.api.metrics import render_metrics
from pvwire.core.hub import Hub
from pvwire.wire.codes import CLOSE_CODES
from pvwire.worker import WorkerIdentity

from .hub_doubles import Client, attach

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
