"""Every put is audited with what really happened and counted by it, whatever way it ends: a
fault in the backend and a caller that went away included (no socket, no IOC: a test-double
backend)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pvwire.access.identity import Identity
from pvwire.api.metrics import render_metrics
from pvwire.config import Settings
from pvwire.core.hub import Hub
from pvwire.errors import BadChannelId, PutRejected
from pvwire.wire.tokens import TokenSigner

from .hub_doubles import KEYS, FakeBackend

ALICE = Identity("alice", address="127.0.0.1")


class FaultyBackend(FakeBackend):
    """Puts to `broken` raise a fault; puts to `stuck` never finish; others succeed."""

    def __init__(self) -> None:
        super().__init__()
        self.put_started = asyncio.Event()

    async def put(self, name: str, value: object, wait: bool, timeout: float) -> None:
        self.put_started.set()
        if name == "broken":
            raise RuntimeError("library state lost")
        if name == "stuck":
            await asyncio.Event().wait()


@pytest.fixture
async def setup(tmp_path: Path) -> Any:
    audit = tmp_path / "audit.jsonl"
    settings = Settings(default_scheme="fake", write_rules=["fake://*"], audit_log=str(audit))
    backend = FaultyBackend()
    hub = Hub({"fake": backend}, settings, TokenSigner(KEYS, "k1"))
    yield hub, backend, audit
    await hub.stop()


def audited(audit: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in audit.read_text().splitlines()]


def put_samples(hub: Hub) -> list[str]:
    text = render_metrics(hub.snapshot(detail=False))
    return [line for line in text.splitlines() if line.startswith("pvwire_puts_total")]


async def test_a_fault_in_the_backend_is_audited_as_an_error(setup: Any) -> None:
    hub, _, audit = setup
    await hub.put("fake://a", 1.0, False, 1.0, ALICE)
    with pytest.raises(PutRejected, match="internal error \\(RuntimeError\\)"):
        await hub.put("fake://broken", 2.0, False, 1.0, ALICE)
    ok, broken = audited(audit)
    assert (ok["result"], ok["code"]) == ("ok", "")
    assert broken["channel"] == "fake://broken" and broken["user"] == "alice"
    assert (broken["result"], broken["code"]) == ("error: RuntimeError", "PUT_FAILED")
    assert put_samples(hub) == ['pvwire_puts_total{result="ok"} 1',
                                'pvwire_puts_total{result="error"} 1']  # fmt: skip


async def test_a_put_whose_caller_went_away_is_audited_as_cancelled(setup: Any) -> None:
    hub, backend, audit = setup
    task = asyncio.ensure_future(hub.put("fake://stuck", 3.0, True, 5.0, ALICE))
    await asyncio.wait_for(backend.put_started.wait(), 30.0)
    task.cancel()  # what the server does to a request whose client closed the connection
    with pytest.raises(asyncio.CancelledError):
        await task
    (line,) = audited(audit)
    assert (line["channel"], line["new"], line["wait"]) == ("fake://stuck", 3.0, True)
    assert (line["result"], line["code"]) == ("cancelled", "")
    assert put_samples(hub) == ['pvwire_puts_total{result="ok"} 0',
                                'pvwire_puts_total{result="error"} 1']  # fmt: skip


async def test_a_put_to_an_id_that_names_no_channel_is_audited(setup: Any) -> None:
    hub, _, audit = setup
    with pytest.raises(BadChannelId):
        await hub.put("nope://X", 1.0, False, 1.0, ALICE)
    (line,) = audited(audit)
    assert (line["channel"], line["code"]) == ("nope://X", "BAD_CHANNEL_ID")
    assert "nope" in line["result"]
    assert put_samples(hub)[1] == 'pvwire_puts_total{result="error"} 1'
