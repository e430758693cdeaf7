"""PVA normative types and generic structures QSRV cannot serve, from a real p4p server.

A p4p server on its own loopback ports serves NTScalar (uint64 beyond 2^53), NTScalarArray of
strings, NTEnum, NTNDArray, NTTable and an arbitrary structure with a union, a variant union and
a structure array; the real pvwire server reaches it over PVA. Each arrives over GraphQL and the
stream exactly as PROTOCOL.md section 4 says (structures as maps, unions as the selected
member's value, structure arrays as arrays of maps), and a later post reaches a monitor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from p4p import Type, Value
from p4p.nt import NTEnum, NTNDArray, NTScalar, NTTable
from p4p.server.thread import SharedPV
from pvwire_client import Client
from pvwire_client.state import ChannelState

from tests.p4p_server import p4p_server
from tests.server_process import ServerProcess, server_args_for_tests

pytestmark = [pytest.mark.ioc, pytest.mark.usefixtures("epics_env")]

GENERIC = Type(
    [
        ("count", "L"),
        ("flag", "?"),
        ("nested", ("S", None, [("m", "d"), ("names", "as")])),
        ("choice", ("U", None, [("x", "d"), ("s", "s")])),
        ("anything", "v"),
        ("items", ("aS", None, [("q", "i"), ("w", "as")])),
        ("samples", "ai"),
    ]
)
GENERIC_VALUE = {
    "count": 2**64 - 1,
    "flag": True,
    "nested": {"m": 1.5, "names": ["a", "b"]},
    "choice": ("s", "picked"),
    "anything": np.array([1.0, 2.0]),
    "items": [{"q": 1, "w": ["x"]}, {"q": 2, "w": []}],
    "samples": np.array([-1, 2], dtype=np.int32),
}
IMAGE = np.arange(6, dtype=np.uint16).reshape(2, 3)


def _pvs() -> dict[str, SharedPV]:
    table = NTTable([("name", "s"), ("k1", "d")])
    return {
        "ST:U64": SharedPV(nt=NTScalar("L"), initial=2**64 - 1),
        "ST:STRINGS": SharedPV(nt=NTScalar("as"), initial=["one", "", "three"]),
        "ST:EMPTY_STRINGS": SharedPV(nt=NTScalar("as"), initial=[]),
        "ST:ENUM": SharedPV(nt=NTEnum(), initial={"index": 1, "choices": ["a", "b", "c"]}),
        "ST:IMAGE": SharedPV(nt=NTNDArray(), initial=IMAGE),
        "ST:TABLE": SharedPV(
            nt=table, initial=table.wrap([{"name": "q1", "k1": 0.5}, {"name": "q2", "k1": -0.25}])
        ),
        "ST:GENERIC": SharedPV(initial=Value(GENERIC, GENERIC_VALUE)),
    }


# What the stream client sees for each, and the metadata type.
EXPECT: dict[str, tuple[Any, str]] = {
    "ST:U64": (2**64 - 1, "uint64"),
    "ST:STRINGS": (["one", "", "three"], "string"),
    "ST:EMPTY_STRINGS": ([], "string"),
    "ST:ENUM": (1, "enum"),
    "ST:IMAGE": (IMAGE, "uint16"),
    "ST:TABLE": ({"name": ["q1", "q2"], "k1": np.array([0.5, -0.25])}, "table"),
    "ST:GENERIC": (
        {
            "count": 2**64 - 1,
            "flag": 1,
            "nested": {"m": 1.5, "names": ["a", "b"]},
            "choice": "picked",
            "anything": np.array([1.0, 2.0]),
            "items": [{"q": 1, "w": ["x"]}, {"q": 2, "w": []}],
            "samples": np.array([-1, 2], dtype=np.int32),
        },
        "struct",
    ),
}


def same(got: Any, want: Any) -> bool:
    if isinstance(want, np.ndarray):
        return isinstance(got, np.ndarray) and got.dtype == want.dtype and np.array_equal(got, want)
    if isinstance(want, dict):
        return (
            isinstance(got, dict)
            and got.keys() == want.keys()
            and all(same(got[k], want[k]) for k in want)
        )
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(same, got, want))
    return type(got) is type(want) and got == want


@pytest.fixture(scope="module")
def structures_server() -> Iterator[tuple[ServerProcess, dict[str, SharedPV]]]:
    pvs = _pvs()
    with p4p_server("structures", pvs) as client_env:
        args = server_args_for_tests(["--write-rule", "pva://ST:*"])
        with ServerProcess(*args, env=client_env) as proc:
            yield proc, pvs


@pytest.fixture
def client_url(structures_server: tuple[ServerProcess, dict[str, SharedPV]]) -> str:
    return structures_server[0].url


async def test_graphql_reads_normative_types_and_structures(client: Client) -> None:
    states = await client.get(*(f"pva://{n}" for n in EXPECT))
    for name, s in zip(EXPECT, states, strict=True):
        value, type_name = EXPECT[name]
        assert s.metadata.get("type") == type_name, (name, s.metadata)
        if isinstance(value, np.ndarray) and value.ndim == 1:
            assert np.array_equal(s.value, value), (name, s.value)
        elif name == "ST:U64":
            assert s.value == value  # JSON keeps the integer exact
        assert s.value is not None, name


async def test_stream_carries_each_form_exactly_and_follows_posts(
    client: Client, structures_server: tuple[ServerProcess, dict[str, SharedPV]]
) -> None:
    pvs = structures_server[1]
    ids = [f"pva://{n}" for n in EXPECT]
    latest: dict[str, ChannelState] = {}
    posted = False
    stream = client.monitor(ids)
    try:
        async with asyncio.timeout(30):
            async for u in stream:
                name = u.channel.id.removeprefix("pva://")
                latest[name] = u.channel
                if (
                    not posted
                    and len(latest) == len(EXPECT)
                    and all(s.serial is not None for s in latest.values())
                ):
                    for n, (value, type_name) in EXPECT.items():
                        s = latest[n]
                        assert s.metadata.get("type") == type_name, (n, s.metadata)
                        assert same(s.value, value), (n, s.value, value)
                    pvs["ST:GENERIC"].post(
                        Value(GENERIC, {**GENERIC_VALUE, "choice": ("x", 2.5), "count": 7})
                    )
                    pvs["ST:STRINGS"].post(["only"])
                    posted = True
                elif posted and latest["ST:STRINGS"].value == ["only"]:
                    generic = latest["ST:GENERIC"].value
                    if isinstance(generic, dict) and generic["count"] == 7:
                        assert generic["choice"] == 2.5
                        break
    finally:
        await stream.aclose()
