"""docs/PVWS.md sections 2 and 3 against the real server: every client message the table lists
is handled (and answered as the table says), every update field it lists is sent and no other,
and `error` messages reach the clients that read them and not Grafana's live proxy.

The server is this module's own, on the shared test IOC (tests/dbs/test.db), with local PVs
writable by the `loc://cw*` rule.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pvwire.pvws.messages import CLIENT_MESSAGES
from pvwire_dev.ioc import IocProcess
from websockets.exceptions import ConnectionClosed

from tests.eventually import eventually_async
from tests.pvws_client import PingRecorder, PvwsClient
from tests.server_process import ServerProcess, server_args_for_tests

DOC = Path(__file__).parent.parent / "docs" / "PVWS.md"
BAD = "nosuchscheme://pv"  # refused when subscribed (no such backend): answered with `error`


def doc_table(section: str, header: str) -> list[list[str]]:
    """The rows of the table under `section` whose header row starts with `header`."""
    text = DOC.read_text().split(section, 1)[1]
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith(f"| {header} |"):
            break
    next(lines)  # |---|
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def names(cell: str) -> list[str]:
    """The backticked names in a table cell."""
    return re.findall(r"`([^`]+)`", cell)


@pytest.fixture(scope="module")
def server(epics_env: IocProcess) -> Iterator[ServerProcess]:
    with ServerProcess(*server_args_for_tests(["--write-rule", "loc://cw*"])) as proc:
        yield proc


@pytest.fixture
def client_url(server: ServerProcess) -> str:
    return server.url


# --- section 2: client messages --------------------------------------------------------------


async def answer_of(kind: str, c: PvwsClient) -> str:
    """Send a `kind` message as a client would and name what came back, as the table does."""
    if kind in ("subscribe", "monitor"):
        await c.send(type=kind, pvs=[f"loc://cw_{kind}(1)"])
        return str((await c.next("update", f"loc://cw_{kind}(1)"))["type"])
    if kind == "clear":
        await c.subscribe("sim://counter?rate=50")
        await c.next("update", "sim://counter?rate=50")
        await c.send(type="clear", pvs=["sim://counter?rate=50"])
        await c.send(type="echo", n=1)
        while (m := await c.recv())["type"] != "echo":
            pass  # counter updates queued before the clear
        await c.send(type="echo", n=2)  # nothing of the counter between two echoes
        return "none" if await c.recv() == {"type": "echo", "n": 2} else "update"
    if kind == "list":
        await c.send(type="list")
        return str((await c.next("list"))["type"])
    if kind == "write":
        await c.subscribe("loc://cw_write(1)")
        await c.next("update", "loc://cw_write(1)")
        await c.send(type="write", pv="loc://cw_write(1)", value=7)
        update = await c.next("update", "loc://cw_write(1)")
        assert update["value"] == 7
        return str(update["type"])
    if kind == "ping":
        await c.send(type="ping")
        await c.send(type="echo")
        await c.next("echo")
        assert isinstance(c.ws, PingRecorder)
        return "ping frame" if c.ws.pings >= 1 else "none"
    if kind == "echo":
        echo = {"type": "echo", "body": [1, "two"]}
        await c.send(**echo)
        m = await c.recv()
        assert m == echo
        return str(m["type"])
    raise AssertionError(f"no scenario for {kind!r}")


def test_the_table_lists_exactly_the_messages_the_server_handles() -> None:
    listed = [names(row[0])[0] for row in doc_table("## 2. Client to server", "Message")]
    assert sorted(listed) == sorted(CLIENT_MESSAGES)


@pytest.mark.parametrize("row", doc_table("## 2. Client to server", "Message"), ids=lambda r: r[0])
async def test_each_client_message_is_answered_as_the_table_says(
    row: list[str], pvws_client: PvwsClient
) -> None:
    kind, answer = names(row[0])[0], names(row[-1])[0]
    assert await answer_of(kind, pvws_client) == answer


# --- section 3: update fields ----------------------------------------------------------------


async def test_update_fields_are_the_documented_ones(pvws_client: PvwsClient) -> None:
    documented = {n for row in doc_table("### `update`", "Field") for n in names(row[0])}
    pvs = ["ca://PVW:AO", "ca://PVW:MBBO", "ca://PVW:STR", "ca://PVW:WF", "loc://cw_fields(1)"]
    await pvws_client.subscribe(*pvs)
    seen: set[str] = set()
    firsts: set[str] = set()
    async with asyncio.timeout(20):
        while len(firsts) < len(pvs):
            m = await pvws_client.next("update")
            firsts.add(m["pv"])
            seen |= set(m)
    assert seen <= documented
    # The array fields other than b64dbl are checked type by type (tests/test_pvws_types.py).
    assert documented - seen == {"b64flt", "b64srt", "b64int", "b64byt"}


# --- section 3: who gets `error` ---------------------------------------------------------------


def summary(server: ServerProcess) -> list[dict[str, Any]]:
    with urllib.request.urlopen(server.url + "/pvws/summary", timeout=10) as r:
        sockets: list[dict[str, Any]] = json.loads(r.read())["sockets"]
    return sockets


async def received_until_closed(c: PvwsClient) -> list[dict[str, Any]]:
    """Everything the server sent before the close handshake (TCP keeps the order)."""
    await c.ws.close()
    out = []
    with pytest.raises(ConnectionClosed):
        while True:
            out.append(json.loads(await c.ws.recv()))
    return out


async def test_grafana_live_proxy_gets_no_error(epics_env: IocProcess) -> None:
    """One socket, one `subscribe` of one PV (pkg/aalive/data_proxy.go), every message taken as a
    data point: a bad name must not come back as an `error` (a point of value 0 at 1970)."""
    with ServerProcess(*server_args_for_tests()) as server:
        grafana = await PvwsClient.connect(server.url)
        await grafana.ws.send(f'{{ "type": "subscribe", "pvs": [ "{BAD}" ] }}')

        async def handled() -> bool:
            # Its message was read and whatever it queued has been written to the socket.
            socks = await asyncio.to_thread(summary, server)
            return (
                len(socks) == 1 and socks[0]["client_messages"] == 1 and (socks[0]["queued"] == 0)
            )

        await eventually_async(handled, lambda: f"the message handled: {summary(server)}")
        assert await received_until_closed(grafana) == []


async def test_clients_that_read_errors_get_them(server: ServerProcess) -> None:
    # cs-web-lib: its heartbeat PV and the page's PVs.
    cs = await PvwsClient.connect(server.url)
    await cs.subscribe("sim://flipflop(29.929)", BAD)
    assert BAD in (await cs.next("error"))["message"]
    await cs.close()
    # dbwr and pvws.js pages: one PV per subscribe; the held error comes with the next message.
    page = await PvwsClient.connect(server.url)
    await page.subscribe(BAD)
    await page.send(type="write", pv=BAD, value=1)
    assert BAD in (await page.next("error"))["message"]  # the subscription's
    assert (await page.next("error"))["message"] == f"Cannot write unknown PV {BAD}"
    await page.close()


def test_pvws_js_scripts_are_served_as_javascript(server: ServerProcess) -> None:
    for name in ("pvws.js", "base64.js"):
        with urllib.request.urlopen(f"{server.url}/pvws/js/{name}", timeout=10) as r:
            assert r.headers["content-type"].startswith("application/javascript")
            assert b"PVWS" in r.read() or name == "base64.js"
