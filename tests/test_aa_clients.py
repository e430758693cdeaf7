"""The Archiver Appliance API of the real server over a real IOC, read by the clients that exist:
PyPI's epicsarchiver-retrieval-client decodes `getData.raw` of every type (its own protobuf
classes and parser), and `getData.json` agrees with it sample for sample; the requests the
Grafana data source and cs-web-lib send (their URL forms, read from their sources) are answered
as they parse them."""

from __future__ import annotations

import datetime
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from epicsarchiver.common.errors import ArchiverResponseError
from epicsarchiver.retrieval.archive_event import ArchiveEvent
from epicsarchiver.retrieval.client.archiver_retrieval import ArchiverRetrieval
from epicsarchiver.retrieval.client.processor import Processor, ProcessorName
from epicsarchiver.retrieval.pb import parse_pb_data
from pvwire_dev.ioc import IocProcess

from tests.eventually import eventually
from tests.server_process import ServerProcess, server_args_for_tests

UTC = datetime.UTC
# PV -> (values written, the PayloadInfo type the client names, the JSON value of each)
TYPED: dict[str, tuple[list[Any], str]] = {
    "PVW:AO": ([1.25, -3.5, 7.0], "ScalarDouble"),
    "PVW:AA:FLOAT": ([0.25, 1.5, -2.75], "ScalarFloat"),
    "PVW:LONG": ([5, 1000, 17], "ScalarInt"),  # its DRVL and DRVH: 0 and 1000
    "PVW:AA:SHORT": ([-7, 300, -32768], "ScalarShort"),
    "PVW:AA:CHAR": ([10, 13, 27], "ScalarByte"),
    "PVW:MBBO": ([0, 2, 1], "ScalarEnum"),
}
RECORDED = [*TYPED, "PVW:COUNTER", "PVW:WAVE16", "PVW:STR"]


@pytest.fixture(scope="module")
def server(epics_env: IocProcess) -> Iterator[ServerProcess]:
    extra = ["--history-array-max", "16", "--write-rule", "ca://PVW:AA:*"]
    for pv in RECORDED:
        extra += ["--history-channels", f"ca://{pv}"]
    with ServerProcess(*server_args_for_tests(extra)) as proc:
        yield proc


@pytest.fixture(scope="module")
def written(server: ServerProcess) -> dict[str, list[Any]]:
    """Each typed PV written three times through pvwire, once its history holds the first value."""
    for pv, (values, _) in TYPED.items():
        eventually(partial(recorded_once, server, pv), f"{pv} recorded")
        for v in values:
            doc = server.graphql(
                f'mutation {{ put(id: "ca://{pv}", value: {json.dumps(v)}, wait: true) {{ ok }} }}'
            )
            assert doc.get("data", {}).get("put", {}).get("ok"), doc
    for pv, (values, _) in TYPED.items():
        eventually(partial(holds, server, pv, values), f"{pv}: {values}")
    return {pv: values for pv, (values, _) in TYPED.items()}


def recorded_once(server: ServerProcess, pv: str) -> bool:
    return len(events(server, pv)) >= 1


def holds(server: ServerProcess, pv: str, values: list[Any]) -> bool:
    return _vals(pv, events(server, pv)[-3:]) == values


def _vals(pv: str, got: list[ArchiveEvent]) -> list[Any]:
    if TYPED.get(pv, (None, ""))[1] == "ScalarByte":
        return [int.from_bytes(e.val, "little", signed=True) for e in got]  # type: ignore[arg-type]
    return [e.val for e in got]


def client(server: ServerProcess) -> ArchiverRetrieval:
    return ArchiverRetrieval("127.0.0.1", server.port)


def window() -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(UTC)
    return now - datetime.timedelta(minutes=10), now + datetime.timedelta(seconds=5)


def events(
    server: ServerProcess, pv: str, processor: Processor | None = None
) -> list[ArchiveEvent]:
    return client(server).get_events(pv, *window(), processor=processor)[1]


def get_json(server: ServerProcess, path: str, **params: str) -> Any:
    url = f"{server.url}/retrieval/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def test_every_scalar_type_is_read_back_by_the_archiver_client(
    server: ServerProcess, written: dict[str, list[Any]]
) -> None:
    for pv, (values, kind) in TYPED.items():
        meta, got = client(server).get_events(pv, *window())
        assert {m.pv_type.rsplit(".", 1)[-1] for m in meta.values()} == {f"{kind}'>"}, pv
        assert _vals(pv, got[-3:]) == values, pv
        assert [e.pv for e in got] == [pv] * len(got)
        times = [e.timestamp_ns for e in got]
        assert times == sorted(times) and len(set(times)) == len(times)


def test_headers_carry_the_units_and_precision_and_with_latest_metadata_the_limits(
    server: ServerProcess, written: dict[str, list[Any]]
) -> None:
    meta, _ = client(server).get_events("PVW:AA:FLOAT", *window())
    got = {(h.name, h.value) for m in meta.values() for h in m.headers}
    assert got == {("EGU", "A"), ("PREC", "4")}
    start, end = window()
    doc = get_json(server, "data/getData.json", pv="PVW:AO", fetchLatestMetadata="true",
                   **{"from": start.isoformat(), "to": end.isoformat()})  # fmt: skip
    m = doc[0]["meta"]
    assert (m["name"], m["EGU"], m["PREC"], m["DRVH"], m["HIHI"], m["LOW"]) == (
        "PVW:AO", "mm", "3", "100.0", "90.0", "-70.0",
    )  # fmt: skip
    assert m["DESC"] == "Test output"


def test_json_agrees_with_what_the_archiver_client_decodes_from_raw(
    server: ServerProcess, written: dict[str, list[Any]]
) -> None:
    # The waveform steps with the IOC's counter: three of its frames may take a few seconds.
    eventually(lambda: len(events(server, "PVW:WAVE16")) >= 3, "three frames of PVW:WAVE16")
    start, end = window()
    span = {"from": start.isoformat(), "to": end.isoformat()}
    for pv in [*TYPED, "PVW:WAVE16"]:
        raw = client(server).get_data_raw(pv, start, end).content
        _, decoded = parse_pb_data(raw)
        doc = get_json(server, "data/getData.json", pv=pv, **span)
        rows = [r for r in doc[0]["data"] if (r["secs"], r["nanos"]) <= (
            decoded[-1].timestamp_ns // 10**9, decoded[-1].timestamp_ns % 10**9)]  # fmt: skip
        assert len(rows) >= len(decoded) >= 3, pv
        rows = rows[: len(decoded)]
        for r, e in zip(rows, decoded, strict=True):
            assert r["secs"] * 10**9 + r["nanos"] == e.timestamp_ns, pv
            assert (r["severity"], r["status"]) == (e.severity, e.status), pv
            want = _vals(pv, [e])[0]
            if isinstance(want, list):
                assert [float(x) for x in r["val"]] == [float(x) for x in want], pv
            else:
                assert math.isclose(r["val"], want, rel_tol=1e-6), pv


def sixteen(server: ServerProcess) -> list[ArchiveEvent]:
    """The waveform's events, once its last holds 16 elements."""
    got = events(server, "PVW:WAVE16")
    return got if got and isinstance(got[-1].val, list) and len(got[-1].val) == 16 else []


def test_arrays_come_as_vectors_and_strings_as_their_current_value(server: ServerProcess) -> None:
    got = eventually(partial(sixteen, server))
    meta, _ = client(server).get_events("PVW:WAVE16", *window())
    assert {m.pv_type.rsplit(".", 1)[-1] for m in meta.values()} == {"VectorDouble'>"}
    last = got[-1].val
    assert isinstance(last, list) and last == [
        float(x) for x in range(int(last[0]), int(last[0]) + 16)
    ]
    meta, strings = client(server).get_events("PVW:STR", *window())
    assert {m.pv_type.rsplit(".", 1)[-1] for m in meta.values()} == {"ScalarString'>"}
    assert [e.val for e in strings] in (["hello"], [])  # its value, if it came in the window
    start = datetime.datetime.now(UTC) - datetime.timedelta(days=3000)
    _, strings = client(server).get_events("PVW:STR", start, window()[1])
    assert [e.val for e in strings] == ["hello"]


def test_mean_bins_of_the_counter_are_the_means_of_its_points(server: ServerProcess) -> None:
    """`mean_2(PV)` as the client asks for it: 2 s bins, each answered at its middle with the mean
    of the counter's points in it (the points read back as raw from the same history)."""
    eventually(lambda: len(events(server, "PVW:COUNTER")) > 150, "150 counter updates")
    start = datetime.datetime.now(UTC) - datetime.timedelta(seconds=12)
    end = start + datetime.timedelta(seconds=10)
    ret = client(server)
    raw = ret.get_events("PVW:COUNTER", start - datetime.timedelta(seconds=5), end)[1]
    means = ret.get_events("PVW:COUNTER", start, end, Processor(ProcessorName.MEAN, 2))[1]
    start_s, end_s = int(start.timestamp()), int(end.timestamp())
    bins = [(e.timestamp_ns // 10**9 - 1) // 2 for e in means]
    assert bins == list(range(start_s // 2 - 1, end_s // 2 + 1)) or bins == list(
        range(start_s // 2, end_s // 2 + 1)
    )
    for e, b in zip(means, bins, strict=True):
        assert e.timestamp_ns % 10**9 == 0 and e.timestamp_ns // 10**9 == b * 2 + 1
        lo, hi = start.timestamp() * 1e9, end.timestamp() * 1e9
        inside = [
            r.val for r in raw if r.timestamp_ns // 10**9 // 2 == b and lo <= r.timestamp_ns <= hi
        ]
        if b >= start_s // 2 and inside:
            assert math.isclose(e.val, sum(inside) / len(inside)), (b, inside)  # type: ignore[arg-type]


def test_an_unknown_pv_answers_404_as_the_archiver_does(server: ServerProcess) -> None:
    with pytest.raises(ArchiverResponseError):
        client(server).get_events("PVW:NO:SUCH:PV", *window())
    try:
        urllib.request.urlopen(
            f"{server.url}/retrieval/data/getData.json?pv=PVW:NO:SUCH:PV", timeout=30
        )
    except urllib.error.HTTPError as exc:
        with exc:
            assert (exc.code, exc.read()) == (404, b"Unable to find typeinfo for pv PVW:NO:SUCH:PV")
    else:
        raise AssertionError("an unknown PV was answered")


def test_matching_pvs_as_the_client_and_grafanas_picker_ask(server: ServerProcess) -> None:
    found = client(server).search("PVW:AA:.*", limit=2)
    assert found == ["PVW:AA:CHAR", "PVW:AA:FLOAT"]
    assert get_json(server, "bpl/getMatchingPVs", regex="PVW:(COUNT|WAVE1)E?R?.*",
                    limit="100") == ["PVW:COUNTER", "PVW:WAVE16"]  # fmt: skip
    assert get_json(server, "bpl/getMatchingPVs", pv="PVW:AA:?HAR") == ["PVW:AA:CHAR"]


def test_grafanas_request_form_is_answered(
    server: ServerProcess, written: dict[str, list[Any]]
) -> None:
    """What the Grafana data source sends (pkg/archiverappliance/aaclient.go, buildQueryUrl):
    `<op>_<binSeconds>(pv)`, times as 2006-01-02T15:04:05.000-07:00 and `donotchunk` empty; the
    body, with its Content-Length, read by the PyPI client's parser."""
    now = datetime.datetime.now(datetime.timezone(datetime.timedelta(hours=-7)))
    for op in ("mean_1", "max_5", "min_5", "count_10", "lastSample_2", "firstSample_2", "std_3"):
        query = urllib.parse.urlencode({
            "pv": f"{op}(PVW:COUNTER)", "donotchunk": "",
            "from": (now - datetime.timedelta(minutes=1)).isoformat(timespec="milliseconds"),
            "to": now.isoformat(timespec="milliseconds"),
        })  # fmt: skip
        with urllib.request.urlopen(
            f"{server.url}/retrieval/data/getData.raw?{query}", timeout=30
        ) as r:
            assert r.headers["Transfer-Encoding"] is None and r.headers["Content-Length"]
            meta, got = parse_pb_data(r.read())
        assert [m.pv_name for m in meta.values()] == ["PVW:COUNTER"] and len(got) >= 2, op
        if op.startswith(("mean", "max", "min", "count", "std")):
            assert {m.pv_type.rsplit(".", 1)[-1] for m in meta.values()} == {"ScalarDouble'>"}


def test_cs_web_libs_request_form_is_answered(server: ServerProcess) -> None:
    """cs-web-lib's useArchivedData: getDataForPVs.json with `mean_<period>(pv)` per trace and
    ISO times from the browser; it reads `meta.name`, `data[].secs` and `data[].val`."""
    now = datetime.datetime.now(UTC)
    start = (now - datetime.timedelta(minutes=2)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    end = now.isoformat().replace("+00:00", "Z")
    url = (f"{server.url}/retrieval/data/getDataForPVs.json?pv=mean_1(PVW:COUNTER)"
           f"&pv=mean_1(ca://PVW:AO)&from={start}&to={end}")  # fmt: skip
    with urllib.request.urlopen(url, timeout=30) as r:
        doc = json.loads(r.read())
    assert [d["meta"]["name"] for d in doc] == ["PVW:COUNTER", "ca://PVW:AO"]
    assert all(isinstance(p["secs"], int) and isinstance(p["val"], float) for p in doc[0]["data"])
    assert len(doc[0]["data"]) >= 3 and doc[1]["data"]


def test_data_at_time_as_save_and_restore_asks(
    server: ServerProcess, written: dict[str, list[Any]]
) -> None:
    body = json.dumps(["PVW:AO", "PVW:LONG", "PVW:NO:SUCH:PV"]).encode()
    req = urllib.request.Request(f"{server.url}/retrieval/data/getDataAtTime", data=body,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as r:
        doc = json.loads(r.read())
    assert sorted(doc) == ["PVW:AO", "PVW:LONG"]
    assert (doc["PVW:AO"]["val"], doc["PVW:LONG"]["val"]) == (7.0, 17)
    assert doc["PVW:LONG"]["meta"] == {"DBRType": "DBR_SCALAR_INT"}
