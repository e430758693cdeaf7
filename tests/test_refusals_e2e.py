"""Refused authentications at the real server, over real HTTP and WebSocket: the audit file gets
one line per refusal with the reason and the operation, `/metrics` counts them by reason, and a
flood writes a bounded number of lines and a summary."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
import websockets
from pvwire_client import Client, Unauthenticated, wire

from tests.eventually import eventually
from tests.server_process import ServerProcess
from tests.stream_client import RawStream

SECRET = "refusals-e2e-secret-not-for-production-0123456789"


def forged() -> str:
    now = int(time.time())
    claims = {"sub": "mallory", "aud": "pvwire", "iat": now, "exp": now + 600}
    return jwt.encode(claims, "a-forged-secret-of-more-than-thirty-two", "HS256")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    (tmp_path / "secret").write_text(SECRET)
    with ServerProcess(
        "--jwt-secret-file", str(tmp_path / "secret"), "--jwt-audience", "pvwire",
        "--audit-log", str(tmp_path / "audit.jsonl"), "--write-rule", "loc://*",
        "--log-level", "warning",
    ) as s:  # fmt: skip
        yield s


def audit(folder: Path) -> list[dict[str, Any]]:
    path = folder / "audit.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def refusal_counts(server: ServerProcess) -> dict[str, int]:
    text = server.metrics()  # within 30 s: httpx.get gives up after 5 s by default
    out = {}
    for line in text.splitlines():
        if line.startswith("pvwire_auth_refusals_total{"):
            labels, value = line.split(" ")
            out[labels.split('"')[1]] = int(value)
    return out


async def test_a_forged_token_put_leaves_one_audit_line_with_the_reason(
    server: ServerProcess, tmp_path: Path
) -> None:
    async with Client(server.url, token=forged()) as c:
        with pytest.raises(Unauthenticated, match="signature"):
            await c.put("loc://refused", 1.0)
    (line,) = audit(tmp_path)
    assert (line["event"], line["reason"], line["address"], line["operation"]) == (
        "auth_refused", "bad_signature", "127.0.0.1", "mutation put")  # fmt: skip
    counts = refusal_counts(server)
    assert counts["bad_signature"] == 1
    assert sum(counts.values()) == 1
    # A security event shows in the server's log at the default level, too (read by a thread of
    # ServerProcess's, so perhaps after the answer).
    eventually(lambda: "auth_refused" in server.log(), "auth_refused in the server's log")


async def test_pvws_refusals_are_audited_with_their_endpoint(
    server: ServerProcess, tmp_path: Path
) -> None:
    url = server.url.replace("http", "ws") + "/pvws/pv"
    headers = {"Authorization": "Bearer not.a.token"}
    async with websockets.connect(url, additional_headers=headers) as ws:
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 30)
    (line,) = audit(tmp_path)
    assert (line["reason"], line["operation"]) == ("malformed_token", "pvws")
    assert refusal_counts(server)["malformed_token"] == 1


async def test_a_flood_of_forged_tokens_is_counted_and_summarised(
    server: ServerProcess, tmp_path: Path
) -> None:
    """2,000 forged puts as fast as the server answers them: every one is counted, at most the
    burst (20) plus one a second are written, and the rest are accounted for by summaries (the
    server writes the last one when it stops)."""
    body = {"query": 'mutation { put(id: "loc://x", value: 1) { ok } }'}
    headers = {"Authorization": f"Bearer {forged()}"}
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:

        async def send(n: int) -> None:
            for _ in range(n):
                r = await http.post("/graphql", json=body, headers=headers)
                assert r.status_code == 401

        await asyncio.gather(*(send(200) for _ in range(10)))
    elapsed = time.monotonic() - started
    assert refusal_counts(server)["bad_signature"] == 2000
    server.stop()
    found = audit(tmp_path)
    written = [x for x in found if x["event"] == "auth_refused"]
    summaries = [x for x in found if x["event"] == "auth_refused_summary"]
    assert len(written) <= 20 + elapsed + 1
    assert summaries
    assert len(written) + sum(x["suppressed"] for x in summaries) == 2000


async def test_a_forged_stream_token_at_attach_is_audited(
    server: ServerProcess, tmp_path: Path
) -> None:
    stream = await RawStream.connect(server.ws_url)
    try:
        await stream.send(16, 1, "k1.forged.token")
        refused = await stream.recv()
        assert isinstance(refused, wire.Error), refused
    finally:
        await stream.close()
    (line,) = audit(tmp_path)
    assert (line["reason"], line["operation"], line["address"]) == (
        "bad_stream_token", "stream attach", "127.0.0.1")  # fmt: skip
    assert refusal_counts(server)["bad_stream_token"] == 1
