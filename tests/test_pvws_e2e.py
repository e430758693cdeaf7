"""pvws conformance: the real server, the real test IOC, a client written from pvws's source.

Each test states what pvws (ornl-epics/pvws `Vtype2Json.java`, `WebSocket.java`) sends for the
case and checks the message field by field, in pvws's order. This module runs its own server with
local PVs writable by the `loc://w*` rule, so it may write without disturbing other modules.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pvwire_dev.ioc import IocProcess

from tests.eventually import eventually_async
from tests.pvws_client import PingRecorder, PvwsClient, array_of
from tests.server_process import ServerProcess, server_args_for_tests

DB = Path(__file__).parent / "dbs" / "test.db"
NUMBER_META = [
    "type", "pv", "vtype", "units", "description", "precision", "min", "max",
    "warn_low", "warn_high", "alarm_low", "alarm_high", "severity", "value", "readonly",
    "seconds", "nanos",
]  # fmt: skip


@pytest.fixture(scope="module")
def pvws_server(epics_env: IocProcess) -> Iterator[ServerProcess]:
    args = server_args_for_tests(["--write-rule", "loc://w*"])
    # Pings every second (20 s by default), so that a test sees one soon.
    with ServerProcess(*args, env={"PVWIRE_WS_PING_INTERVAL_S": "1"}) as server:
        yield server


@pytest.fixture
def client_url(pvws_server: ServerProcess) -> str:
    return pvws_server.url


def http(url: str, method: str = "GET") -> Any:
    req = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read()
    return json.loads(body) if body else None


def pvget(server: ServerProcess, name: str) -> tuple[int, Any]:
    """GET /pvws/pvget?name=...: the status and the JSON answer, error or not."""
    url = f"{server.url}/pvws/pvget?" + urllib.parse.urlencode({"name": name})
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.headers["content-type"] == "application/json"
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_number_first_message_then_severity_only_on_change(pvws_client: PvwsClient) -> None:
    await pvws_client.send(type="subscribe", pvs=["loc://wnum(0)", "ca://PVW:AO"])
    first = await pvws_client.next("update", "ca://PVW:AO")
    assert list(first) == NUMBER_META
    assert first["vtype"] == "VDouble"
    assert (first["units"], first["description"], first["precision"]) == ("mm", "Test output", 3)
    assert (first["min"], first["max"]) == (-100, 100)
    assert (first["warn_low"], first["warn_high"], first["alarm_low"], first["alarm_high"]) == (
        -70, 70, -90, 90,
    )  # fmt: skip
    assert first["readonly"] is False  # the test server's rules let anyone write PVW:*
    assert isinstance(first["seconds"], int) and 0 <= first["nanos"] < 1_000_000_000

    # Writes through the pvws socket itself: HIGH (70) is MINOR, then back to NONE.
    for value, severity in ((75.0, "MINOR"), (1.25, "NONE"), (2.5, None)):
        await pvws_client.send(type="write", pv="ca://PVW:AO", value=value)
        update = await pvws_client.next("update", "ca://PVW:AO")
        while update["value"] != value:
            update = await pvws_client.next("update", "ca://PVW:AO")
        expected = ["type", "pv", "value", "seconds", "nanos"]
        if severity:
            expected.insert(2, "severity")
            assert update["severity"] == severity
        assert list(update) == expected


async def test_integer_string_and_enum(pvws_client: PvwsClient) -> None:
    await pvws_client.subscribe("ca://PVW:LONG", "ca://PVW:STR", "ca://PVW:MBBO")
    got: dict[str, dict[str, Any]] = {}
    async with asyncio.timeout(10):
        while len(got) < 3:
            m = await pvws_client.next("update")
            got.setdefault(m["pv"], m)
    long, text, enum = got["ca://PVW:LONG"], got["ca://PVW:STR"], got["ca://PVW:MBBO"]
    assert long["vtype"] == "VInt" and isinstance(long["value"], int)
    assert long["units"] == "pcs" and (long["min"], long["max"]) == (0, 1000)
    assert list(text) == ["type", "pv", "vtype", "severity", "text", "readonly", "seconds", "nanos"]
    assert text["vtype"] == "VString" and isinstance(text["text"], str)
    assert list(enum) == [
        "type", "pv", "vtype", "labels", "severity", "value", "text", "readonly", "seconds",
        "nanos",
    ]  # fmt: skip
    assert enum["vtype"] == "VEnum" and enum["labels"][:3] == ["Off", "On", "Fault"]
    assert enum["text"] == enum["labels"][enum["value"]]


async def test_double_array_as_base64(pvws_client: PvwsClient, pvws_server: ServerProcess) -> None:
    await pvws_client.subscribe("ca://PVW:WF")
    first = await pvws_client.next("update", "ca://PVW:WF")
    assert first["vtype"] == "VDoubleArray" and first["units"] == "V"
    assert "value" not in first
    values = array_of(first)
    # Other modules write this shared record: compare with what GraphQL reads from the same hub.
    data = pvws_server.graphql('{ channel(id: "ca://PVW:WF") { value } }')
    assert values is not None
    np.testing.assert_array_equal(values, data["data"]["channel"]["value"])


async def test_local_pvs_initial_values_and_writes_seen_by_others(
    pvws_client: PvwsClient, pvws_server: ServerProcess
) -> None:
    other = await PvwsClient.connect(pvws_server.url)
    try:
        await pvws_client.subscribe(
            'loc://wtext("hello,world")', "loc://wpi(3.14)", "loc://warr(1,2)"
        )
        got: dict[str, dict[str, Any]] = {}
        async with asyncio.timeout(10):
            while len(got) < 3:
                m = await pvws_client.next("update")
                got[m["pv"]] = m
        assert got['loc://wtext("hello,world")']["text"] == "hello,world"
        assert got["loc://wpi(3.14)"]["value"] == 3.14
        assert got["loc://wpi(3.14)"]["vtype"] == "VDouble"
        np.testing.assert_array_equal(array_of(got["loc://warr(1,2)"]), [1.0, 2.0])

        # The same local PV under another initial value is the same PV (as in Phoebus).
        await other.subscribe("loc://wpi(7)")
        assert (await other.next("update", "loc://wpi(7)"))["value"] == 3.14
        await pvws_client.send(type="write", pv="loc://wpi(3.14)", value=42)
        assert (await other.next("update", "loc://wpi(7)"))["value"] == 42.0
        await pvws_client.send(type="write", pv='loc://wtext("hello,world")', value="bye")
        update = await pvws_client.next("update", 'loc://wtext("hello,world")')
        assert update["text"] == "bye"
    finally:
        await other.close()


async def test_refused_and_unknown_writes_are_errors(pvws_client: PvwsClient) -> None:
    await pvws_client.subscribe("loc://ro(1)")
    first = await pvws_client.next("update", "loc://ro(1)")
    assert first["readonly"] is True  # no rule lets anyone write loc://ro
    await pvws_client.send(type="write", pv="loc://ro(1)", value=2)
    error = await pvws_client.next("error")
    assert list(error) == ["type", "message"] and "loc://ro" in error["message"]
    await pvws_client.send(type="write", pv="loc://never-subscribed", value=2)
    error = await pvws_client.next("error")
    assert error["message"] == "Cannot write unknown PV loc://never-subscribed"


async def test_clear_list_echo_and_bad_messages(pvws_client: PvwsClient) -> None:
    await pvws_client.subscribe("sim://counter?rate=50", "loc://wkeep(1)")
    await pvws_client.next("update", "sim://counter?rate=50")
    await pvws_client.send(type="list")
    listed = await pvws_client.next("list")
    assert listed == {"type": "list", "pvs": ["sim://counter?rate=50", "loc://wkeep(1)"]}
    await pvws_client.send(type="clear", pvs=["sim://counter?rate=50"])
    await pvws_client.send(type="list")
    while (m := await pvws_client.recv())["type"] != "list":
        pass  # counter updates queued before the clear took effect
    assert m["pvs"] == ["loc://wkeep(1)"]

    # Malformed and unknown messages get no answer, and the connection goes on.
    for bad in ("not json", '{"no": "type"}', '{"type": "bogus"}', '{"type": "subscribe"}'):
        await pvws_client.ws.send(bad)
    echo = {"type": "echo", "body": "Hello, echo", "other": [1, 2]}
    await pvws_client.send(**echo)
    # Nothing but the echo arrives: no counter update after the clear, no error for bad input.
    assert await pvws_client.recv() == echo


async def test_ping_is_served_by_the_keepalive(pvws_client: PvwsClient) -> None:
    # pvws.js asks for a ping when its connection is idle, to keep proxies from dropping it: the
    # server pings every connection anyway (`ws_ping_interval_s`), idle or not, and `ping` is no
    # error and stops nothing.
    await pvws_client.send(type="ping")
    await pvws_client.send(type="echo", body="after ping")
    assert await pvws_client.next("echo") == {"type": "echo", "body": "after ping"}
    ws = pvws_client.ws
    assert isinstance(ws, PingRecorder)
    await eventually_async(lambda: ws.pings >= 2)


async def test_large_subscribe_message(pvws_client: PvwsClient) -> None:
    names = [f"loc://wbig{i:04d}({i})" for i in range(400)]
    message = json.dumps({"type": "subscribe", "pvs": names})
    assert len(message) > 8192  # pvws under Tomcat refuses this by default
    await pvws_client.ws.send(message)
    seen: set[str] = set()
    async with asyncio.timeout(20):
        while len(seen) < len(names):
            seen.add((await pvws_client.next("update"))["pv"])
    assert seen == set(names)


async def test_flipflop_heartbeat_of_cs_web_lib(pvws_client: PvwsClient) -> None:
    await pvws_client.subscribe("sim://flipflop(0.1)")
    first = await pvws_client.next("update", "sim://flipflop(0.1)")
    assert first["vtype"] == "VEnum" and first["labels"] == ["false", "true"]
    second = await pvws_client.next("update", "sim://flipflop(0.1)")
    assert second["text"] != first["text"] and "labels" not in second


async def test_inspection_urls(pvws_client: PvwsClient, pvws_server: ServerProcess) -> None:
    await pvws_client.subscribe("loc://winspect(5)", "ca://PVW:WF")
    async with asyncio.timeout(10):
        while len(pvws_client.merged) < 2:
            await pvws_client.next("update")
    base = pvws_server.url + "/pvws"
    info = http(base + "/info")
    assert set(info) == {"start_time", "jre"}
    assert "env" in http(base + "/info?env=true")  # for administrators (here: this machine)
    summary = http(base + "/summary")["sockets"]
    mine = [s for s in summary if s["pvs"] == 2]
    assert mine and set(mine[0]) == {
        "id", "created", "last_client_message", "client_messages", "last_message_sent", "queued",
        "pvs", "arrays", "max_size",
    }  # fmt: skip
    assert mine[0]["arrays"] == 1 and mine[0]["max_size"] == 10
    sid = mine[0]["id"]
    socket = http(f"{base}/socket/{sid}")["sockets"]
    assert [p["name"] for p in socket[0]["pvs"]] == ["loc://winspect(5)", "ca://PVW:WF"]
    pool = http(base + "/pool")
    assert {"refs": 1, "pv": "loc://winspect(5)"} in pool
    with pytest.raises(urllib.error.HTTPError) as unknown:
        http(f"{base}/socket/no-such-socket", method="DELETE")
    assert unknown.value.code == 404
    assert json.loads(unknown.value.read()) == {"error": "no socket 'no-such-socket'"}
    http(f"{base}/socket/{sid}", method="DELETE")
    async with asyncio.timeout(10):
        while True:
            try:
                await pvws_client.recv()
            except Exception:
                break
    assert pvws_client.ws.close_code == 1000


async def test_one_upstream_monitor_for_both_endpoints(
    pvws_client: PvwsClient, pvws_server: ServerProcess
) -> None:
    from pvwire_client import Client

    await pvws_client.subscribe("ca://PVW:COUNTER")
    await pvws_client.next("update", "ca://PVW:COUNTER")
    async with Client(pvws_server.url) as py:
        updates = py.monitor(["ca://PVW:COUNTER"])
        async with asyncio.timeout(10):
            async for _ in updates:
                break
        query = "{ server { channels { id subscribers lastUpdate } clients { endpoint } } }"
        server = pvws_server.graphql(query)["data"]["server"]
        rows = [c for c in server["channels"] if c["id"] == "ca://PVW:COUNTER"]
        assert len(rows) == 1 and rows[0]["subscribers"] == 2 and rows[0]["lastUpdate"] > 0
        assert {"pvws", "stream"} <= {c["endpoint"] for c in server["clients"]}


async def test_disconnect_as_pvws_shows_it() -> None:
    ioc = IocProcess([DB])
    ioc.start()
    server = ServerProcess(*server_args_for_tests(), env=ioc.ports.client_env())
    server.start()
    try:
        c = await PvwsClient.connect(server.url)
        await c.subscribe("ca://PVW:COUNTER")
        await c.next("update", "ca://PVW:COUNTER")
        ioc.stop()
        async with asyncio.timeout(20):
            while (m := await c.next("update", "ca://PVW:COUNTER"))["value"] != "NaN":
                pass
        assert list(m) == ["type", "pv", "severity", "value", "seconds", "nanos"]
        assert m["severity"] == "UNDEFINED"
        await c.close()
    finally:
        server.stop()
        ioc.stop()


def test_inspection_needs_an_admin_but_info_is_for_everyone(epics_env: IocProcess) -> None:
    env = {"EPICS_CA_ADDR_LIST": "10.11.12.255"}
    with ServerProcess(*server_args_for_tests(["--admin-group", "ops"]), env=env) as server:
        for page in ("/summary", "/socket", "/socket/1", "/pool"):
            with pytest.raises(urllib.error.HTTPError) as err:
                http(server.url + "/pvws" + page)
            err.value.close()  # it holds the response, and with it the socket
            assert err.value.code == 403
        # cs-web-lib 0.10 fetches /pvws/info from the browser, as whoever uses the page, and
        # moves to this server only on 200. It names no client; the environment names the
        # site's networks, and only administrators see it.
        for query in ("", "?env=true"):
            assert set(http(server.url + "/pvws/info" + query)) == {"start_time", "jre"}
        # ...from a page on another host: the browser shows it the answer only with this header.
        request = urllib.request.Request(
            server.url + "/pvws/info", headers={"Origin": "http://screens.example"}
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.headers["Access-Control-Allow-Origin"] == "*"


async def test_pvget_answers_with_the_first_update_of_a_subscriber(
    pvws_client: PvwsClient, pvws_server: ServerProcess
) -> None:
    await pvws_client.subscribe("ca://PVW:AO")
    first = await pvws_client.next("update", "ca://PVW:AO")
    status, got = pvget(pvws_server, "ca://PVW:AO")
    assert status == 200 and list(got) == list(first) == NUMBER_META
    changing = ("value", "severity", "seconds", "nanos")  # other tests write this record
    assert {k: v for k, v in got.items() if k not in changing} == {
        k: v for k, v in first.items() if k not in changing
    }


async def test_pvget_of_sim_channels(pvws_server: ServerProcess) -> None:
    status, wave = pvget(pvws_server, "sim://waveform/pvget?length=8&rate=5")
    assert (status, wave["type"], wave["vtype"]) == (200, "update", "VDoubleArray")
    values = array_of(wave)
    assert values is not None and len(values) == 8
    status, flip = pvget(pvws_server, "sim://flipflop(0.5)")  # cs-web-lib's heartbeat
    assert (status, flip["vtype"], flip["labels"]) == (200, "VEnum", ["false", "true"])
    assert flip["text"] in ("false", "true") and flip["readonly"] is True


async def test_pvget_errors_are_json(pvws_server: ServerProcess) -> None:
    status, bad = pvget(pvws_server, "nosuch://X")
    assert status == 400 and bad["type"] == "error" and bad["code"] == "BAD_CHANNEL_ID"
    assert bad["pv"] == "nosuch://X" and "nosuch" in bad["message"]
    status, unknown = pvget(pvws_server, "ca://PVW:NO_SUCH_RECORD")
    assert (status, unknown["code"]) == (404, "NOT_FOUND")
    status, missing = pvget(pvws_server, "")
    assert (status, missing["code"]) == (400, "BAD_REQUEST")


async def test_a_connection_past_max_channels_gets_errors_and_others_go_on() -> None:
    """max_channels_per_connection bounds the PVs of one /pvws/pv connection: each PV holds an
    upstream channel, and one client must not open them until the server runs out of memory."""
    env = {"PVWIRE_MAX_CHANNELS_PER_CONNECTION": "3"}
    with ServerProcess(*server_args_for_tests(), env=env) as server:
        greedy = await PvwsClient.connect(server.url)
        other = await PvwsClient.connect(server.url)
        try:
            pvs = [f"sim://counter/cap{i}" for i in range(5)]
            await greedy.subscribe(*pvs)
            errors: list[str] = []
            values: set[str] = set()
            async with asyncio.timeout(60):
                while len(errors) < 2 or len(values) < 3:
                    m = await greedy.recv(30)
                    if m["type"] == "error":
                        errors.append(m["message"])
                    elif m["type"] == "update":
                        values.add(m["pv"])
            assert values == set(pvs[:3])
            assert sorted(errors) == [
                f"Cannot subscribe to {pv}: this connection holds 3 PVs, the most one may "
                "(max_channels_per_connection)"
                for pv in pvs[3:]
            ]
            await other.subscribe("sim://counter/cap0", "sim://counter/cap9")
            seen: set[str] = set()
            async with asyncio.timeout(60):
                while len(seen) < 2:
                    seen.add((await other.next("update", timeout=30))["pv"])
            assert seen == {"sim://counter/cap0", "sim://counter/cap9"}
        finally:
            await greedy.close()
            await other.close()
