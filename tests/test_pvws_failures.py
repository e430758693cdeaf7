"""A subscribed PV whose channel fails after it opened: the pvws client gets an `error` naming
the PV and the reason, once per failure (docs/PVWS.md section 3), over the real server with a
real PVA server (p4p) whose NTNDArray turns into one pvwire cannot serve (an unknown codec)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from p4p import Value
from p4p.nt import NTNDArray
from p4p.server.thread import SharedPV

from tests.p4p_server import p4p_server
from tests.pvws_client import PvwsClient
from tests.server_process import ServerProcess, server_args_for_tests

IMAGE = "pva://PF:IMAGE"
OTHER = "pva://PF:OTHER"


def frame(fill: int, codec: str = "") -> Value:
    value = NTNDArray().wrap(np.full((2, 2), fill, dtype=np.uint8))
    # Set even when empty: a post carries only the fields marked changed.
    value["codec.name"] = codec
    return value


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ServerProcess, SharedPV]]:
    image = SharedPV(initial=frame(1))
    other = SharedPV(initial=frame(7))
    with (
        p4p_server("pvwsfail", {"PF:IMAGE": image, "PF:OTHER": other}) as pva_env,
        ServerProcess(*server_args_for_tests(), env=pva_env) as proc,
    ):
        yield proc, image


async def until(client: PvwsClient, done: Any, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Every message received until one satisfies `done` (inclusive)."""
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while not seen or not done(seen[-1]):
            seen.append(await client.recv(timeout))
    return seen


def shows(fill: int) -> Any:
    return lambda m: m.get("pv") == IMAGE and m.get("b64int") == _b64(fill)


def _b64(fill: int) -> str:
    return base64.b64encode(np.full(4, fill, dtype="<i4").tobytes()).decode()


def test_a_pv_whose_channel_fails_gets_one_error_per_failure(
    served: tuple[ServerProcess, SharedPV],
) -> None:
    server, image = served

    async def run() -> None:
        client = await PvwsClient.connect(server.url)
        try:
            await client.subscribe(IMAGE, OTHER)  # two PVs: a client that reads errors
            await until(client, shows(1))
            image.post(frame(2, codec="nosuch"))
            seen = await until(client, lambda m: m.get("type") == "error")
            error = seen[-1]
            assert error["message"].startswith(f"{IMAGE}: value cannot be served: ")
            assert "NTNDArray codec" in error["message"]
            # Still failed, for the same reason: no other error; then a value it can serve.
            image.post(frame(3, codec="nosuch"))
            image.post(frame(4, codec="nosuch"))
            image.post(frame(5))
            seen = await until(client, shows(5))
            assert [m for m in seen if m["type"] == "error"] == []
            # A new failure is a new error.
            image.post(frame(6, codec="nosuch"))
            seen = await until(client, lambda m: m.get("type") == "error")
            assert seen[-1] == error
        finally:
            await client.close()

    asyncio.run(run())
