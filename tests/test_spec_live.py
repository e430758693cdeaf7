"""The live server against protocol/PROTOCOL.md, read as a client written from the spec alone
would read it: plain MessagePack and a WebSocket, none of pvwire's own decoders, so a shape the
server drifts from fails here even where both clients would forgive it. Sim channels only."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgpack
import pytest
import websockets

from tests.server_process import ServerProcess

LONG_ID = "sim://counter?" + "x" * (1_025 - len("sim://counter?"))  # one over max_id_length
OFFER = [websockets.Subprotocol("pvwire.v1.aligned"), websockets.Subprotocol("pvwire.v1")]
# Elements each mask bit brings (section 3): VALUE, TIME, ALARM, META, CONN.
ELEMENTS = {1: 2, 2: 2, 4: 3, 8: 1, 16: 2}


def unpack(data: bytes) -> Any:
    ndarray = msgpack.ExtType  # section 4.1: ext type 1, kept as it came
    return msgpack.unpackb(data, strict_map_key=True, ext_hook=ndarray)


def entry_is_exact(entry: list[Any]) -> bool:
    """`[sid, mask, field...]` with no reserved bit and exactly the elements the mask says."""
    sid, mask = entry[0], entry[1]
    expected = 2 + sum(n for bit, n in ELEMENTS.items() if mask & bit)
    return isinstance(sid, int) and 0 <= mask < 32 and len(entry) == expected


def graphql(server: ServerProcess, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    body = json.dumps({"query": query, "variables": variables}).encode()
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(server.url + "/graphql", body, headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        answer: dict[str, Any] = json.loads(r.read())
    return answer


def subscribe(server: ServerProcess, ids: list[str], options: str = "") -> dict[str, Any]:
    opts = f", options: {{{options}}}" if options else ""
    query = f"mutation($ids: [String!]!) {{ subscribe(ids: $ids{opts}) {{ token expiresAt }} }}"
    return graphql(server, query, {"ids": ids})


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess("--log-level", "warning") as proc:
        yield proc


@pytest.fixture
async def ws(server: ServerProcess) -> AsyncIterator[Any]:
    async with websockets.connect(
        server.ws_url, subprotocols=OFFER, compression=None, max_size=None
    ) as conn:
        yield conn


async def recv(ws: Any) -> Any:
    return unpack(await asyncio.wait_for(ws.recv(), 30))


async def answer(ws: Any, raw: bytes) -> Any:
    """The next message that is not DATA or HEARTBEAT, after sending `raw`."""
    await ws.send(raw)
    while (msg := await recv(ws))[0] in (3, 6):
        pass
    return msg


async def test_messages_have_the_shapes_of_section_2(server: ServerProcess, ws: Any) -> None:
    assert ws.subprotocol == "pvwire.v1.aligned"  # section 1: selected when offered
    hello = await recv(ws)
    assert hello[:2] == [0, 1] and isinstance(hello[2], str)
    assert hello[3:6] == [hello[3], 15_000, 1_048_576] and hello[3] > 0  # section 11's defaults
    ids = ["sim://sine?rate=20", "sim://counter"]
    token = subscribe(server, ids)["data"]["subscribe"]["token"]
    await ws.send(msgpack.packb([16, 7, token]))
    attached = await recv(ws)
    assert attached[:2] == [1, 7] and attached[3] == ids
    att = attached[2]
    kind, seq, snap_att, entries = await recv(ws)
    full = [e for e in entries if e is not None]  # nil items are padding (section 3)
    assert (kind, seq, snap_att) == (2, 1, att) and [e[0] for e in full] == [0, 1]
    assert all(entry_is_exact(e) for e in full)
    data: list[Any] = []
    while len(data) < 3:
        if (msg := await recv(ws))[0] == 3:
            data.append(msg)
    assert [d[1] for d in data] == [2, 3, 4]  # seq: one more for every SNAPSHOT or DATA
    for _, _, groups in data:
        for group_att, group in groups:
            assert group_att == att and group
            assert all(entry_is_exact(e) for e in group if e is not None)
    assert await answer(ws, msgpack.packb([18, "n-1"])) == [7, "n-1"]
    assert await answer(ws, msgpack.packb([17, 8, att])) == [4, 8, att]
    again = await answer(ws, msgpack.packb([16, 9, token]))
    assert again[:2] == [1, 9] and again[2] > att  # an att is never reused on a connection
    snapshot = await recv(ws)
    assert snapshot[0] == 2 and snapshot[1] > data[-1][1]


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        pytest.param(msgpack.packb([16, 11, 42]), [5, 11, 4400], id="token-not-a-str"),
        pytest.param(msgpack.packb([16, 12, "garbage"]), [5, 12, 4401], id="bad-token"),
        pytest.param(msgpack.packb([17, 13, 999]), [5, 13, 4404], id="unknown-att"),
        pytest.param(msgpack.packb([99, 14]), [5, 14, 4400], id="unknown-kind"),
        pytest.param(msgpack.packb([17, 15, 1]) + b"\x00", [5, 15, 4400], id="trailing-bytes"),
        pytest.param(b"\x93\x10\x10\xa2\xff\xfe", [5, 16, 4400], id="str-not-utf8"),
        pytest.param(b"\x93\x10\x11\x81\x01\x02", [5, 17, 4400], id="map-key-not-str"),
        pytest.param(msgpack.packb([18, 1.5]), [5, None, 4400], id="float-nonce"),
        pytest.param(b"\xc1", [5, None, 4400], id="not-msgpack"),
    ],
)
async def test_an_error_carries_the_req_whenever_it_can_be_read(
    ws: Any, raw: bytes, error: list[Any]
) -> None:
    await recv(ws)  # HELLO
    got = await answer(ws, raw)
    assert got[:3] == error and isinstance(got[3], str) and got[3]
    assert await answer(ws, msgpack.packb([18, 0])) == [7, 0]  # the connection goes on


@pytest.mark.parametrize(
    ("ids", "options", "code"),
    [
        pytest.param(["sim://counter"], "maxRate: 1000", None, id="max-rate"),
        pytest.param(["sim://counter"], "maxRate: 1001", "BAD_REQUEST", id="max-rate-over"),
        pytest.param(["sim://counter"], "maxPixels: 1024", None, id="min-pixels"),
        pytest.param(["sim://counter"], "maxPixels: 1023", "BAD_REQUEST", id="min-pixels-under"),
        pytest.param(["sim://counter"], "maxColumns: 100000", None, id="max-columns"),
        pytest.param(["sim://counter"], "maxColumns: 100001", "BAD_REQUEST", id="columns-over"),
        pytest.param(["sim://counter"], "maxColumns: 8, mode: ALL", "BAD_REQUEST", id="all-mode"),
        pytest.param([], "", "BAD_REQUEST", id="no-ids"),
        pytest.param([LONG_ID], "", "BAD_CHANNEL_ID", id="id-over-1024"),
        pytest.param(
            [f"sim://counter?n={i}" for i in range(10_001)],
            "",
            "TOO_MANY_CHANNELS",
            id="ids-over-10000",
        ),
    ],
)
def test_subscribe_meets_the_limits_of_section_11(
    server: ServerProcess, ids: list[str], options: str, code: str | None
) -> None:
    doc = subscribe(server, ids, options)
    errors = doc.get("errors") or [{}]
    assert errors[0].get("extensions", {}).get("code") == code, errors
    if code is None:  # token_ttl_s: 24 h
        assert abs(doc["data"]["subscribe"]["expiresAt"] - (time.time() + 86_400)) < 600


async def test_an_unknown_offer_gets_hello_then_4406(server: ServerProcess) -> None:
    offer = [websockets.Subprotocol("chat"), websockets.Subprotocol("pvwire.v2")]
    async with websockets.connect(server.ws_url, subprotocols=offer) as ws:
        assert ws.subprotocol == "chat"  # the first offer, so that a browser sees the code
        assert (await recv(ws))[0] == 0
        with pytest.raises(websockets.ConnectionClosed):
            await recv(ws)
        assert ws.close_code == 4406
