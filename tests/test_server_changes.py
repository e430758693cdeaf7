"""Changes made at the IOC reach stream clients through the server, over CA and PVA:
alarm transitions, metadata changes (CA DBE_PROPERTY), arrays with their dtype."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pvwire_client import wire

from tests.server_process import ServerProcess
from tests.server_process import stream_token as token
from tests.stream_client import RawStream


def put(server: ServerProcess, channel: str, value: Any) -> None:
    doc = server.graphql(
        "mutation($id: String!, $v: JSON!) { put(id: $id, value: $v, wait: true) { ok } }",
        {"id": channel, "v": value},
    )
    assert doc.get("data") and doc["data"]["put"]["ok"], doc


async def entries_until(s: RawStream, predicate: Any, limit: int = 200) -> wire.Entry:
    for _ in range(limit):
        data = await s.next_data()
        for group in data.groups:
            for e in group.entries:
                if predicate(e):
                    return e
    raise AssertionError("no matching entry")


@pytest.mark.parametrize("scheme", ["ca", "pva"])
async def test_alarm_transitions_are_streamed(server: ServerProcess, scheme: str) -> None:
    s = await RawStream.connect(server.ws_url)
    await s.attach(token(server, [f"{scheme}://PVW:CHG"]))
    put(server, "ca://PVW:CHG", 95.0)
    major = await entries_until(s, lambda e: e.severity == 2)
    assert major.mask & 4 and major.status == 3  # HIHI
    put(server, "ca://PVW:CHG", 75.0)
    minor = await entries_until(s, lambda e: e.severity == 1)
    assert minor.status == 4  # HIGH
    put(server, "ca://PVW:CHG", 0.0)
    ok = await entries_until(s, lambda e: e.severity == 0 and e.mask & 4)
    assert ok.value == 0.0
    await s.close()


async def test_ca_metadata_change_is_streamed_as_it_happens(server: ServerProcess) -> None:
    s = await RawStream.connect(server.ws_url)
    await s.attach(token(server, ["ca://PVW:CHG"]))
    put(server, "ca://PVW:CHG.EGU", "um")
    meta = await entries_until(
        s, lambda e: e.metadata is not None and e.metadata.get("units") == "um"
    )
    assert meta.mask & 8 and meta.metadata is not None and meta.metadata["precision"] == 2
    put(server, "ca://PVW:CHG.EGU", "mm")
    await entries_until(s, lambda e: e.metadata is not None and e.metadata.get("units") == "mm")
    await s.close()


@pytest.mark.parametrize("scheme", ["ca", "pva"])
async def test_waveform_put_arrives_as_a_typed_array(server: ServerProcess, scheme: str) -> None:
    s = await RawStream.connect(server.ws_url)
    await s.attach(token(server, [f"{scheme}://PVW:WF"]))
    values = [float(x) for x in np.linspace(0, 9, 10)]
    put(server, "ca://PVW:WF", values)
    e = await entries_until(s, lambda e: isinstance(e.value, np.ndarray) and e.value.size == 10)
    assert e.value.dtype == np.dtype("<f8")
    assert e.value.tolist() == values
    await s.close()
