"""The server without its compiled PVA module (a checkout installed without `make ext`): it starts
and serves CA and sim, and says loudly that pva:// is unavailable and how to build the module:
an error in its log, /readyz, a GraphQL error, and FAILED pva:// channels on the stream.

The real server runs from a copy of the package without the module, found before the checkout.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from pvwire_client import Client
from pvwire_dev.ioc import IocProcess

from tests.eventually import eventually
from tests.server_process import ServerProcess, server_args_for_tests

PACKAGE = Path(__file__).resolve().parent.parent / "server" / "pvwire"
HOW = "make ext"  # what every report of the missing module tells the operator to run


@pytest.fixture(scope="module")
def server(
    epics_env: IocProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    copy = tmp_path_factory.mktemp("no-module")
    shutil.copytree(PACKAGE, copy / "pvwire", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    with ServerProcess(*server_args_for_tests(), env={"PYTHONPATH": str(copy)}) as proc:
        yield proc


def test_the_log_says_pva_is_unavailable_and_how_to_build_it(server: ServerProcess) -> None:
    def errors() -> list[str]:  # the log is read by a thread: perhaps after the server answers
        lines = server.log().splitlines()
        return [line for line in lines if "pva:// channels are unavailable" in line]

    first = eventually(errors, server.log)[0]
    assert "ERROR" in first and HOW in first, server.log()


def test_readyz_is_ready_and_names_pva(server: ServerProcess) -> None:
    with urllib.request.urlopen(f"{server.url}/readyz", timeout=30) as r:
        body = json.loads(r.read())
    assert body["ready"] is True
    assert list(body["unavailable"]) == ["pva"] and HOW in body["unavailable"]["pva"]


def test_ca_and_sim_are_served(server: ServerProcess) -> None:
    doc = server.graphql(
        'query { ca: channel(id: "ca://PVW:AO", timeout: 20) { value connection } '
        'sim: channel(id: "sim://sine") { value connection } }'
    )
    assert "errors" not in doc, doc
    assert doc["data"]["ca"]["connection"] == "CONNECTED"
    assert doc["data"]["sim"]["connection"] == "CONNECTED"
    assert isinstance(doc["data"]["ca"]["value"], float)


def test_a_pva_get_is_an_error_saying_what_is_missing(server: ServerProcess) -> None:
    doc = server.graphql('query { channel(id: "pva://PVW:AO") { value } }')
    [error] = doc["errors"]
    assert error["extensions"]["code"] == "UNAVAILABLE"
    assert "PVA module is not built" in error["message"] and HOW in error["message"]


def test_channels_shows_a_pva_channel_failed_as_the_stream_does(server: ServerProcess) -> None:
    doc = server.graphql(
        'query { channels(ids: ["pva://PVW:AO", "sim://sine"]) { connection errorCode error } }'
    )
    pva, sim = doc["data"]["channels"]
    assert (pva["connection"], pva["errorCode"]) == ("FAILED", "UNAVAILABLE"), pva
    assert HOW in pva["error"]
    assert (sim["connection"], sim["errorCode"]) == ("CONNECTED", None)


async def test_a_pva_channel_fails_on_the_stream_and_ca_streams_beside_it(
    server: ServerProcess,
) -> None:
    async with Client(server.url) as client, asyncio.timeout(60):
        states = {}
        async for update in client.monitor(["pva://PVW:AO", "ca://PVW:COUNTER"]):
            states[update.channel.id] = update.channel
            pva, ca = states.get("pva://PVW:AO"), states.get("ca://PVW:COUNTER")
            if pva is not None and pva.connection == "FAILED" and ca is not None and ca.connected:
                break
    assert pva is not None
    assert HOW in pva.reason and "PVA module is not built" in pva.reason
