"""A flood of writes at the real server: every allowed put keeps its audit line, the puts that
pvwire refuses (its rate limit; writes past the bound in flight) leave a bounded number of lines
per kind and a summary, and `/metrics` counts every one of them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pvwire_dev.ioc import IocProcess

from tests.eventually import eventually
from tests.pvws_client import PvwsClient
from tests.server_process import ServerProcess, server_args_for_tests

WRITES = 3_000
PV = "sim://value/flood"


@pytest.fixture
def flood_server(epics_env: IocProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    args = server_args_for_tests(["--audit-log", str(tmp_path / "audit.jsonl")])
    with ServerProcess(*args) as server:
        yield server


def audit(folder: Path) -> list[dict[str, Any]]:
    path = folder / "audit.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def put_refusals(server: ServerProcess) -> dict[str, int]:
    out = {}
    for line in server.metrics().splitlines():
        if line.startswith("pvwire_put_refusals_total{"):
            labels, value = line.split(" ")
            out[labels.split('"')[1]] = int(float(value))
    return out


async def test_a_write_flood_leaves_bounded_audit_lines_and_exact_counts(
    flood_server: ServerProcess, tmp_path: Path
) -> None:
    client = await PvwsClient.connect(flood_server.url)
    try:
        await client.subscribe(PV, "sim://value/quiet")  # a page of two PVs: reads errors
        await client.next("update", PV, timeout=60)
        for i in range(WRITES):
            await client.send(type="write", pv=PV, value=float(i))
        # Every refused write is answered with an error; the others are audited as "ok".
        errors: list[str] = []

        async def answered() -> bool:
            try:
                while True:
                    m = await client.recv(0.5)
                    if m["type"] == "error":
                        errors.append(m["message"])
            except TimeoutError:
                pass
            ok = sum(1 for r in audit(tmp_path) if r.get("result") == "ok")
            return ok + len(errors) >= WRITES

        async with asyncio.timeout(180):
            while not await answered():
                pass
    finally:
        await client.close()
    records = audit(tmp_path)
    ok = [r for r in records if r.get("result") == "ok"]
    assert len(ok) + len(errors) == WRITES  # each allowed put has its line
    refused = {
        "rate_limited": [e for e in errors if "puts per second" in e],
        "too_many_writes": [e for e in errors if "(pvws_writes_in_flight)" in e],
    }
    assert sum(map(len, refused.values())) == len(errors)
    assert len(errors) > WRITES // 2  # the flood: most writes are refused

    def counted() -> dict[str, int]:
        counts = put_refusals(flood_server)
        exact = all(counts.get(k) == len(v) for k, v in refused.items())
        return counts if exact else {}

    eventually(counted, "every refused put counted in /metrics", timeout=60)
    for reason, messages in refused.items():
        lines = [r for r in records if r.get("code") == reason.upper()]
        assert len(lines) <= 40, reason  # a burst's worth, not one per refusal
        assert len(lines) > 0 or not messages, reason

    def summarised() -> bool:
        rows = audit(tmp_path)
        for reason, messages in refused.items():
            written = sum(1 for r in rows if r.get("code") == reason.upper())
            left_out = sum(
                r["suppressed"]
                for r in rows
                if r.get("event") == "put_refused_summary" and r["reason"] == reason
            )
            if written + left_out != len(messages):
                return False
        return True

    eventually(summarised, "summary lines account for every refusal left out", timeout=60)
    assert len(audit(tmp_path)) < 200  # one line per write was 3,000
