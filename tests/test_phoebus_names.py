"""Every name form of Phoebus' sim and loc PV factories, through a real server on every path:
GraphQL, `/stream` (subscribe + attach) and pvws `/pvws/pv`; and a clear error on each path for
a name that cannot work. The forms and defaults are those of Phoebus' `SimPVFactory` and
`LocalPVFactory` (names with spaces, bare names, the diirt-era long names)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from pvwire.model import ConnState

from tests.pvws_client import PvwsClient, array_of
from tests.server_process import ServerProcess
from tests.stream_client import RawStream

GET = """query($id: String!) { channel(id: $id, timeout: 5) {
  id value connection metadata { type choices } } }"""
SUBSCRIBE = "mutation($ids: [String!]!) { subscribe(ids: $ids) { token } }"


@dataclass(frozen=True)
class Case:
    name: str
    type: str  # metadata type
    vtype: str  # what pvws says
    ok: Callable[[Any], bool]  # the value as GraphQL gives it
    pvws: str | None = None  # the text pvws shows, where it differs from the value

    def __str__(self) -> str:
        return self.name


def between(lo: float, hi: float) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int | float) and lo <= v <= hi


def array(n: int, lo: float, hi: float) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and len(v) == n and all(lo <= x <= hi for x in v)


def equal(x: Any) -> Callable[[Any], bool]:
    return lambda v: bool(v == x)


def letters(n: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str) and 1 <= len(v) <= n and set(v) == {"A"}


CASES = [
    # sine: (), (min, max, update), (min, max, steps, update)
    Case("sim://sine()", "float64", "VDouble", between(-5, 5)),
    Case("sim://sine(-10, 10, 0.2)", "float64", "VDouble", between(-10, 10)),
    Case("sim://sine(0, 1, 4, 0.5)", "float64", "VDouble", between(0, 1)),
    Case("sim://sine(0 1 0.5)", "float64", "VDouble", between(0, 1)),
    # ramp
    Case("sim://ramp()", "float64", "VDouble", between(-5, 5)),
    Case("sim://ramp(0, 10, 0.5)", "float64", "VDouble", between(0, 10)),
    Case("sim://ramp(0, 10, 1, 0.5)", "float64", "VDouble", between(0, 10)),
    Case("sim://ramp(0, 10, -2, 0.5)", "float64", "VDouble", between(0, 10)),
    # noise (uniform), gaussianNoise
    Case("sim://noise()", "float64", "VDouble", between(-5, 5)),
    Case("sim://noise(0, 1, 0.5)", "float64", "VDouble", between(0, 1)),
    Case("sim://gaussianNoise", "float64", "VDouble", between(-1e6, 1e6)),
    Case("sim://gaussianNoise()", "float64", "VDouble", between(-1e6, 1e6)),
    Case("sim://gaussiannoise(5, 0, 0.5)", "float64", "VDouble", equal(5.0)),
    # flipflop
    Case("sim://flipflop", "enum", "VEnum", between(0, 1)),
    Case("sim://flipflop()", "enum", "VEnum", between(0, 1)),
    Case("sim://flipflop( 2 )", "enum", "VEnum", between(0, 1)),
    Case("sim://flipflop(29.929)", "enum", "VEnum", between(0, 1)),
    # strings
    Case("sim://strings", "string", "VString", letters(10)),
    Case("sim://strings(0.5)", "string", "VString", letters(10)),
    Case("sim://strings(3, 0.5)", "string", "VString", letters(3)),
    # intermittent (and diirt's intermittentChannel)
    Case("sim://intermittent", "float64", "VDouble", between(-5, 5)),
    Case("sim://intermittent(0.5)", "float64", "VDouble", between(-5, 5)),
    Case("sim://intermittent(0.5, 3)", "float64", "VDouble", equal(3.0)),
    Case("sim://intermittentChannel(0.5, 1, 2)", "float64", "VDouble", between(1, 2)),
    # sinewave (diirt: sineWaveform), sawtooth (sawtoothWaveform)
    Case("sim://sinewave", "float64", "VDoubleArray", array(50, -1, 1)),
    Case("sim://sinewave()", "float64", "VDoubleArray", array(50, -1, 1)),
    Case("sim://sinewave(1, 10, 20, 0.1)", "float64", "VDoubleArray", array(20, -1, 1)),
    Case("sim://sineWaveform(1, 10, 20, 0.1, 0, 5)", "float64", "VDoubleArray", array(20, 0, 5)),
    Case("sim://sawtooth", "float64", "VDoubleArray", array(50, -1, 1.3)),
    Case("sim://sawtooth(2, 5, 30, 0.2)", "float64", "VDoubleArray", array(30, -1, 1.5)),
    Case(
        "sim://sawtoothWaveform(2, 5, 30, 0.2, 0, 1)", "float64", "VDoubleArray", array(30, 0, 1.25)
    ),
    # gaussianWave, noiseWave (diirt: gaussianWaveform, noiseWaveform)
    Case("sim://gaussianWave", "float64", "VDoubleArray", array(100, 0, 1)),
    Case("sim://gaussianwave(1, 50, 64, 0.1)", "float64", "VDoubleArray", array(64, 0, 1)),
    Case("sim://noiseWave", "float64", "VDoubleArray", array(100, -5, 5)),
    Case("sim://noisewave(0, 1, 0.5)", "float64", "VDoubleArray", array(100, 0, 1)),
    Case("sim://noiseWaveform(0, 1, 8, 0.5)", "float64", "VDoubleArray", array(8, 0, 1)),
    # const, as loc:// initial values
    Case("sim://const", "float64", "VDouble", equal(0.0)),
    Case("sim://const(3.14)", "float64", "VDouble", equal(3.14)),
    Case('sim://const("Hello World")', "string", "VString", equal("Hello World")),
    Case("sim://const(1, 2, 3)", "float64", "VDoubleArray", equal([1.0, 2.0, 3.0])),
    Case('sim://const<VEnum>(1, "A", "B")', "enum", "VEnum", equal(1)),
    # loc: every type Phoebus' LocalPVFactory knows
    Case('loc://phMsg("Hello World")', "string", "VString", equal("Hello World")),
    Case("loc://phArr(1, 2, 3)", "float64", "VDoubleArray", equal([1.0, 2.0, 3.0])),
    Case('loc://phE<VEnum>(0, "A", "B")', "enum", "VEnum", equal(0)),
    Case("loc://phX", "float64", "VDouble", equal(0.0)),
    Case("loc://phD(3.14)", "float64", "VDouble", equal(3.14)),
    Case('loc://phSa("a, b", "c")', "string", "VStringArray", equal(["a, b", "c"]), "[a, b, c]"),
    Case("loc://phL<VLong>(1e10)", "int64", "VLong", equal(10_000_000_000)),
    Case("loc://phI<VInt>(0x10)", "int32", "VInt", equal(16)),
    Case("loc://phB<VBoolean>(true)", "bool", "VBoolean", equal(True)),
    Case("loc://phDa<VDoubleArray>(1)", "float64", "VDoubleArray", equal([1.0])),
    Case("loc://phS<VString>", "string", "VString", equal("")),
    Case('loc://phT<VTable>("X", "Y")', "table", "VType", equal({"X": [], "Y": []})),
]


def _pvws_value(update: dict[str, Any]) -> Any:
    if "text" in update and update.get("vtype") != "VEnum":
        return update["text"]
    arr = array_of(update)
    return arr.tolist() if arr is not None else update["value"]


@pytest.mark.parametrize("case", CASES, ids=str)
async def test_every_phoebus_name_on_every_path(server: ServerProcess, case: Case) -> None:
    # GraphQL get
    doc = server.graphql(GET, {"id": case.name})
    assert "errors" not in doc, doc
    ch = doc["data"]["channel"]
    assert ch["id"] == case.name and ch["connection"] == "CONNECTED"
    assert ch["metadata"]["type"] == case.type
    assert case.ok(ch["value"]), ch["value"]

    # /stream: a token for it, attached; the first value arrives
    sub = server.graphql(SUBSCRIBE, {"ids": [case.name]})
    assert "errors" not in sub, sub
    stream = await RawStream.connect(server.ws_url)
    try:
        _, snapshot = await stream.attach(sub["data"]["subscribe"]["token"])
        entries = list(snapshot.entries)
        while not any(e.value is not None for e in entries):
            entries = list((await stream.next_data()).groups[0].entries)
        (entry,) = [e for e in entries if e.value is not None]
        value = entry.value.tolist() if hasattr(entry.value, "tolist") else entry.value
        assert case.ok(value), value
    finally:
        await stream.close()

    # pvws
    pvws = await PvwsClient.connect(server.url)
    try:
        await pvws.subscribe(case.name)
        update = await pvws.next("update", case.name)
        assert update["vtype"] == case.vtype, update
        if case.pvws is not None:  # Java's toString() of a string list, as pvws shows it
            assert update["text"] == case.pvws, update
        elif case.type != "table":  # pvws passes tables as JSON text
            assert case.ok(_pvws_value(update)), update
    finally:
        await pvws.close()


BAD = [
    ("sim://sine(1, 2)", "sine takes no parameters, (min, max, update_seconds)"),
    ("sim://bogus(1)", "unknown sim function 'bogus'"),
    ("sim://sinewave(1, 2, 3", "missing ')'"),
    ("sim://ramp(0, one, 1)", "cannot parse a number from 'one'"),
    ("sim://sinewave(1, 10, 1000000, 0.001)", "elements/s"),
    ("sim://const<VEnum>(1)", 'VEnum needs at least (index, "Label0")'),
    ("loc://phBad<VEnum>(0)", 'VEnum needs at least (index, "Label0")'),
    ("loc://phBad<VFoo>(1)", "cannot have type 'VFoo'"),
    ('loc://phBad("open', "missing ')'"),
    ("sim://sine(0,\t1, 0.5)", "control character"),
    ("sim://" + "x" * 1100, "longer than 1024 characters"),
]


@pytest.mark.parametrize(("name", "why"), BAD, ids=[b[0][:40] for b in BAD])
async def test_a_name_that_cannot_work_is_an_error_on_every_path(
    server: ServerProcess, name: str, why: str
) -> None:
    doc = server.graphql(GET, {"id": name})
    (err,) = doc["errors"]
    assert err["extensions"]["code"] == "BAD_CHANNEL_ID" and why in err["message"], err
    sub = server.graphql(SUBSCRIBE, {"ids": [name]})
    assert why in sub["errors"][0]["message"], sub  # no token: /stream never sees it

    pvws = await PvwsClient.connect(server.url)
    try:
        await pvws.subscribe(name, "loc://phFine(1)")
        error = await pvws.next("error")
        assert why in error["message"], error
        # the other PV of the same message is served
        assert (await pvws.next("update", "loc://phFine(1)"))["value"] == 1.0
    finally:
        await pvws.close()


async def test_intermittent_disconnects_every_other_update_on_the_stream(
    server: ServerProcess,
) -> None:
    sub = server.graphql(SUBSCRIBE, {"ids": ["sim://intermittent(0.05)"]})
    stream = await RawStream.connect(server.ws_url)
    seen: list[tuple[int, str | None]] = []  # (ConnState, reason) as the stream tells them
    try:
        await stream.attach(sub["data"]["subscribe"]["token"])
        for _ in range(200):  # a bound: each update flips the state, so a few DATA suffice
            for e in (await stream.next_data()).groups[0].entries:
                if e.state is not None:
                    seen.append((e.state, e.reason))
            if _reconnected([s for s, _ in seen]):
                break
    finally:
        await stream.close()
    assert _reconnected([s for s, _ in seen]), seen
    reasons = [r or "" for s, r in seen if s == ConnState.DISCONNECTED]
    assert all("every other update" in r for r in reasons), seen


def _reconnected(states: list[int]) -> bool:
    """A disconnect was told, then the channel came back."""
    down = ConnState.DISCONNECTED
    return down in states and ConnState.CONNECTED in states[states.index(down) :]
