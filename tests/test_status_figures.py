"""The status PVs' figures and alarms (status/figures.py, status/pvs.py), read from a real hub's
snapshots with a test-double backend, and the worker numbers their names take under
`--workers N`. The PVs themselves over PVA, and through pvwire's own pva:// channels:
tests/test_status_pvs.py."""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path

import pytest
from pvwire.cli import build_parser
from pvwire.config import Settings
from pvwire.core.hub import Hub
from pvwire.core.stats import HubSnapshot
from pvwire.core.tick import TICK_BUCKETS_MS
from pvwire.model import Severity
from pvwire.status import Alarm, StatusServer, Window, claim_slot, quantile, status_pvs

from .hub_doubles import Client, FakeBackend, attach

# The figures docs/OPERATIONS.md section 7a names, at least.
REQUIRED = {
    "clients", "channels", "updatesPerSec", "deliveriesPerSec", "bytesPerSec", "loopLag",
    "tickP99", "conflatedPerSec", "droppedPerSec", "refusalsPerSec", "ready", "version",
}  # fmt: skip


def later(s: HubSnapshot, **more: int) -> HubSnapshot:
    """`s` with its counters grown by `more`."""
    return dataclasses.replace(s, **{k: getattr(s, k) + v for k, v in more.items()})


def test_the_table_names_every_figure_once() -> None:
    names = [pv.name for pv in status_pvs(20.0)]
    assert len(names) == len(set(names)) and set(names) >= REQUIRED


async def test_every_pv_of_the_table_gets_a_figure_of_its_type(hub: Hub) -> None:
    figures = Window(10.0).figures(0.0, hub.snapshot(detail=False), True, "1.2.3")
    table = status_pvs(20.0)
    assert set(figures) == {pv.name for pv in table}
    kinds = {"d": float, "i": int, "s": str}
    for pv in table:
        value = figures[pv.name]
        assert type(value) is kinds[pv.code] or (pv.code == "d" and type(value) is int), pv
    assert figures["version"] == "1.2.3" and figures["ready"] == 1


async def test_counters_become_rates_over_the_window(hub: Hub) -> None:
    w = Window(10.0)
    s = hub.snapshot(detail=False)
    first = w.figures(100.0, s, True, "v")
    assert first["updatesPerSec"] == 0.0  # nothing to compare the first reading with
    # 1,000 updates in the first second, then 10 a second: the burst counts until it is older
    # than the window.
    s = later(s, updates_in=1000, deliveries=3000, bytes_out=50_000, conflated=7, dropped=20)
    f = w.figures(101.0, s, True, "v")
    assert f["updatesPerSec"] == 1000.0 and f["deliveriesPerSec"] == 3000.0
    assert (f["bytesPerSec"], f["conflatedPerSec"], f["droppedPerSec"]) == (50_000.0, 7.0, 20.0)
    for t in range(102, 111):
        s = later(s, updates_in=10)
        f = w.figures(float(t), s, True, "v")
    assert f["updatesPerSec"] == (1000 + 9 * 10) / 10  # t = 110: the readings since t = 100
    s = later(s, updates_in=10)
    f = w.figures(111.0, s, True, "v")
    assert f["updatesPerSec"] == 10.0  # t = 101 onwards: the burst is out of the window


async def test_refusals_are_authentications_puts_and_peer_replies_refused(hub: Hub) -> None:
    w = Window(10.0)
    s = hub.snapshot(detail=False)
    w.figures(0.0, s, True, "v")
    s = dataclasses.replace(
        s,
        auth_refusals={**s.auth_refusals, "bad_signature": 30, "expired": 5},
        put_refusals={**s.put_refusals, "rate_limited": 5},
        peer_refusals={"pva": {"type_nodes": 4, "search_reply": 6}},
    )
    assert w.figures(10.0, s, True, "v")["refusalsPerSec"] == 5.0


async def test_tick_p99_is_of_the_ticks_in_the_window(hub: Hub) -> None:
    w = Window(10.0)
    s = hub.snapshot(detail=False)
    w.figures(0.0, s, True, "v")
    buckets = [0] * (len(TICK_BUCKETS_MS) + 1)
    buckets[TICK_BUCKETS_MS.index(1.0)] = 990  # 990 ticks in (0.5, 1] ms
    buckets[TICK_BUCKETS_MS.index(50.0)] = 10  # 10 in (20, 50] ms
    grown = tuple(a + b for a, b in zip(s.tick_buckets, buckets, strict=True))
    s = dataclasses.replace(s, tick_buckets=grown)
    assert w.figures(1.0, s, True, "v")["tickP99"] == 1.0  # the 990th of 1,000: 1 ms
    # Twelve seconds later nothing ticked: the window holds no tick, and nothing took time.
    assert w.figures(13.0, s, True, "v")["tickP99"] == 0.0


def test_quantile_reads_a_histogram_as_prometheus_histogram_quantile() -> None:
    bounds = (1.0, 2.0, 5.0)
    assert quantile(0.5, bounds, [10, 0, 0, 0]) == 0.5  # the first bucket starts at 0
    assert quantile(0.99, bounds, [50, 49, 1, 0]) == 2.0  # rank 99: the top of (1, 2]
    assert quantile(0.995, bounds, [50, 49, 1, 0]) == 3.5  # halfway through (2, 5]
    assert quantile(0.99, bounds, [0, 0, 1, 9]) == 5.0  # in the overflow: the highest bound
    assert quantile(0.99, bounds, [0, 0, 0, 0]) == 0.0


async def test_the_figures_are_the_snapshot_s_that_metrics_reads(
    hub: Hub, backend: FakeBackend
) -> None:
    """Clients, channels and deliveries come from the hub's own counters: two clients of one
    channel, five updates, ten deliveries."""
    a, b = Client(hub), Client(hub)
    attach(a, hub, ["fake://x"])
    attach(b, hub, ["fake://x"])
    w = Window(10.0)
    w.figures(0.0, hub.snapshot(detail=False), True, "v")
    for i in range(5):
        backend.update("x", float(i))
        hub.ticker.tick()
    f = w.figures(5.0, hub.snapshot(detail=False), True, "v")
    assert (f["clients"], f["channels"]) == (2, 1)
    assert f["updatesPerSec"] == 1.0 and f["deliveriesPerSec"] == 2.0  # 5 and 10 in 5 s


def test_alarms_are_raised_at_their_limits_as_an_ai_record_raises_them() -> None:
    by_name = {pv.name: pv for pv in status_pvs(20.0)}
    lag, tick, ready = (by_name[n].alarm for n in ("loopLag", "tickP99", "ready"))
    assert lag is not None and tick is not None and ready is not None
    assert [lag.check(v) for v in (0.5, 1.0, 4.9, 5.0)] == [
        (0, ""), (Severity.MINOR, "HIGH"), (Severity.MINOR, "HIGH"), (Severity.MAJOR, "HIHI")
    ]  # fmt: skip
    assert tick.check(19.9) == (0, "") and tick.check(20.0) == (Severity.MINOR, "HIGH")
    assert tick.check(100.0) == (Severity.MAJOR, "HIHI")
    assert ready.check(1) == (0, "") and ready.check(0) == (Severity.MAJOR, "LOLO")
    assert Alarm().check(math.inf) == (0, "")  # no limit set: nothing raised
    # A longer tick interval moves the tick's limits with it.
    slow = {pv.name: pv for pv in status_pvs(100.0)}["tickP99"].alarm
    assert slow is not None and slow.check(50.0) == (0, "")


def test_worker_numbers_are_claimed_once_and_freed_with_their_holder() -> None:
    first, second = claim_slot("TEST:CLAIM:", 2), claim_slot("TEST:CLAIM:", 2)
    assert first is not None and second is not None and (first[1], second[1]) == (1, 2)
    assert claim_slot("TEST:CLAIM:", 2) is None  # both held
    other = claim_slot("TEST:OTHER:", 2)  # another prefix has numbers of its own
    assert other is not None and other[1] == 1
    first[0].close()  # the holder of 1 is gone: the next claim takes 1 again
    again = claim_slot("TEST:CLAIM:", 2)
    assert again is not None and again[1] == 1
    for sock, _ in (again, second, other):
        sock.close()


def test_the_prefix_is_a_setting_like_the_others(tmp_path: Path) -> None:
    assert Settings().status_prefix == ""  # no status PVs unless asked for
    toml = tmp_path / "pvwire.toml"
    toml.write_text('status_prefix = "A:STS:"\n')
    assert Settings.load(toml, env={}).status_prefix == "A:STS:"
    assert Settings.load(toml, env={"PVWIRE_STATUS_PREFIX": "B:STS:"}).status_prefix == "B:STS:"
    args = build_parser().parse_args(["serve", "--status-prefix", "C:STS:"])
    assert args.status_prefix == "C:STS:"


def test_a_failure_to_post_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> HubSnapshot:
        raise RuntimeError("no snapshot")

    server = StatusServer("TEST:POST:", broken, lambda: True, 20.0)
    for _ in range(3):
        server.post()  # once a period: the first failure is logged, the next ones not
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "no snapshot" in errors[0].getMessage()


def test_the_guide_lists_every_status_pv_with_its_type_units_and_alarm_limits() -> None:
    guide = (Path(__file__).resolve().parents[1] / "docs" / "OPERATIONS.md").read_text()
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in guide.splitlines()
        if line.startswith("| `PREFIX")
    ]
    kinds = {"d": "double", "i": "int", "s": "string"}

    def limits(alarm: Alarm | None) -> str:
        if alarm is None:
            return ""
        named = ((alarm.high_warning, "MINOR (HIGH) from"), (alarm.high_alarm, "MAJOR (HIHI) from"),
                 (alarm.low_alarm, "MAJOR (LOLO) at"))  # fmt: skip
        return ", ".join(f"{what} {limit:g}" for limit, what in named if not math.isnan(limit))

    expected = [(pv.name, kinds[pv.code], pv.units, pv.description, limits(pv.alarm))
                for pv in status_pvs(20.0)]  # fmt: skip
    assert [(row[0].strip("`").removeprefix("PREFIX"), *row[1:]) for row in rows] == expected
