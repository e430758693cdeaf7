"""docs/PVWS.md section 4, row by row, against the real server: every type over CA and PVA.

An IOC of this module's own serves tests/dbs/alltypes.db and test.db (over CA and, through QSRV,
PVA); a p4p server in the test process serves the PVA types QSRV cannot (`pva://PT:*`); one pvwire
server reaches both. Each row of the table that names a PV is subscribed to at `/pvws/pv`, and its
first update must carry the row's pvwire vtype, exactly the row's value fields, and (where the row
gives one) the value cs-web-lib shows, decoded as cs-web-lib's `pvwsToDType` decodes it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from p4p.nt import NTNDArray, NTScalar
from p4p.server.thread import SharedPV
from pvwire_dev.ioc import IocProcess

from tests.p4p_server import p4p_server
from tests.pvws_client import PvwsClient
from tests.server_process import ServerProcess, server_args_for_tests

pytestmark = pytest.mark.ioc

ROOT = Path(__file__).parent.parent
DOC = ROOT / "docs" / "PVWS.md"
DBS = Path(__file__).parent / "dbs"
# The PVA types QSRV does not serve: (p4p type code, value).
P4P_SCALARS: dict[str, tuple[str, Any]] = {
    "PT:UBYTE": ("B", 200),
    "PT:BYTE": ("b", -5),
    "PT:USHORT": ("H", 60000),
    "PT:SHORT": ("h", -2),
    "PT:UINT": ("I", 4_000_000_000),
    "PT:ULONG": ("L", 2**63 + 1),
    "PT:FLOAT": ("f", 1.5),
    "PT:BOOL": ("?", True),
    "PT:BOOLS": ("a?", [True, False, True]),
}
# cs-web-lib's pvwsToDType: each base64 field as a typed array (b64byt signed).
CS_WEB_LIB_ARRAYS = {
    "b64dbl": "<f8",
    "b64flt": "<f4",
    "b64srt": "<i2",
    "b64int": "<i4",
    "b64byt": "i1",
}
VALUE_FIELDS = {"value", "text", *CS_WEB_LIB_ARRAYS}


@dataclass(frozen=True)
class Row:
    over: str
    type: str
    vtype: str
    sends: frozenset[str]
    shows: Any  # the JSON value in the "cs-web-lib shows" column, or None
    pv: str


def type_rows() -> list[Row]:
    """The rows of docs/PVWS.md section 4 that name a PV to check."""
    section = DOC.read_text().split("## 4. Types", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 8 or not cells[7].startswith("`"):
            continue
        over, kind, _, _, vtype, sends, shows, pv = cells
        shown = json.loads(shows.strip("`")) if re.fullmatch(r"`[^`]+`", shows) else None
        fields = frozenset(f.strip() for f in sends.split(","))
        rows.append(Row(over, kind, vtype, fields, shown, pv.strip("`")))
    return rows


ROWS = type_rows()


def cs_web_lib_shows(message: dict[str, Any]) -> Any:
    for field, dtype in CS_WEB_LIB_ARRAYS.items():
        if field in message:
            return np.frombuffer(base64.b64decode(message[field]), dtype=dtype).tolist()
    return message["text"] if "text" in message else message.get("value")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    ioc = IocProcess([DBS / "alltypes.db", DBS / "test.db"])
    ioc.start()
    pvs = {name: SharedPV(nt=NTScalar(code), initial=v) for name, (code, v) in P4P_SCALARS.items()}
    image = np.array([[0, 255], [1, 2]], dtype=np.uint8)
    pvs["PT:IMAGE"] = SharedPV(nt=NTNDArray(), initial=image)
    try:
        with p4p_server("pvwstypes", pvs) as pva_env:
            env = ioc.ports.client_env()
            # One server reaches the IOC's QSRV and the p4p server: search both.
            env["EPICS_PVA_ADDR_LIST"] += " " + pva_env["EPICS_PVA_ADDR_LIST"]
            with ServerProcess(*server_args_for_tests(), env=env) as proc:
                yield proc
    finally:
        ioc.stop()


@pytest.fixture(scope="module")
def first_updates(server: ServerProcess) -> dict[str, dict[str, Any]]:
    """The first update of every PV the table names, from one pvws connection."""

    async def collect() -> dict[str, dict[str, Any]]:
        client = await PvwsClient.connect(server.url)
        try:
            names = [row.pv for row in ROWS]
            await client.subscribe(*names)
            got: dict[str, dict[str, Any]] = {}
            async with asyncio.timeout(60):
                while len(got) < len(set(names)):
                    m = await client.next("update", timeout=60)
                    got.setdefault(m["pv"], m)
            return got
        finally:
            await client.close()

    return asyncio.run(collect())


def test_the_table_covers_every_type_over_ca_and_pva() -> None:
    pvs = {row.pv for row in ROWS}
    assert len(pvs) == len(ROWS), "one PV per row"
    ca = {row.type for row in ROWS if row.over == "CA"}
    assert {"DBR_DOUBLE", "DBR_FLOAT", "DBR_LONG", "DBR_SHORT", "DBR_CHAR", "DBR_ENUM"} <= ca
    pva = {row.type for row in ROWS if row.over == "PVA"}
    numbers = ("double", "float", "long", "ulong", "int", "uint", "short", "ushort", "byte")
    for t in (*numbers, "ubyte", "boolean", "string"):
        assert t in pva and f"{t}[]" in pva, t
    assert any(row.pv.startswith("sim://image?dtype=uint8") for row in ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[row.pv for row in ROWS])
def test_pvwire_sends_what_the_table_says(
    row: Row, first_updates: dict[str, dict[str, Any]]
) -> None:
    m = first_updates[row.pv]
    assert m["vtype"] == row.vtype
    assert {k for k in m if k in VALUE_FIELDS} == row.sends
    if row.shows is not None:
        assert cs_web_lib_shows(m) == row.shows


def test_unsigned_bytes_over_pva_are_not_negative(first_updates: dict[str, dict[str, Any]]) -> None:
    """The reported case: `[0, 255, 1]` in a UCHAR waveform. pvws' own client (`pvws.js`) reads
    `b64int` as int32 and cs-web-lib reads `b64byt` as int8: PVA's ubyte[] must be b64int."""
    pva, ca = first_updates["pva://AT:WF:UCHAR"], first_updates["ca://AT:WF:UCHAR"]
    assert np.frombuffer(base64.b64decode(pva["b64int"]), "<i4").tolist() == [0, 255, 1]
    # CA's DBR_CHAR stays bytes, as pvws sends it.
    assert base64.b64decode(ca["b64byt"]) == bytes([0, 255, 1])
