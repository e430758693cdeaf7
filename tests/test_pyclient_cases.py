"""The scripted exchanges of protocol/cases/ against the Python client's session core.

The TypeScript client runs the same files (clients/ts/test/cases.test.ts); protocol/cases/README.md
says what a case holds. Messages are encoded here with msgpack from their JSON form, so the core
decodes real bytes; entries are merged with ChannelState.merge, as Client.monitor_batches does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest
from pvwire_client.entry import FIELD_NAMES
from pvwire_client.session import (
    Attach,
    Backfill,
    Closed,
    Connected,
    Entries,
    Failed,
    Lost,
    Malformed,
    PingAnswered,
    Renew,
    ServerError,
    Session,
)
from pvwire_client.state import ChannelState, link_lost

ROOT = Path(__file__).resolve().parents[1]
CASES = sorted((ROOT / "protocol" / "cases").glob("*.json"))
VECTORS = ROOT / "protocol" / "vectors"
ORDER = ("value", "time", "alarm", "metadata", "connection")
OUTPUTS = (
    "sent", "close", "updates", "history", "failed", "renew", "pongs", "errors", "malformed",
    "connected", "closed",
)  # fmt: skip


def neutral(s: ChannelState) -> dict[str, Any]:
    """A state in the cases' language-neutral form."""
    return {
        "id": s.id,
        "value": s.value,
        "serial": s.serial,
        "conflated": s.conflated,
        "time": list(s.time) if s.time is not None else None,
        "alarm": None if s.severity is None else [s.severity, s.status, s.message],
        "metadata": s.metadata,
        "connection": s.connection,
        "reason": s.reason,
    }


class Runner:
    def __init__(self, options: dict[str, Any]) -> None:
        self.session = Session(
            request_timeout=options.get("request_timeout_s", 30.0),
            reconnect=options.get("reconnect", True),
        )
        self.now = 0.0
        self.states: dict[str, list[ChannelState]] = {}
        self.out: dict[str, Any] = {}
        self.closing = False  # the session's close request was carried out

    def record(self, kind: str, item: Any) -> None:
        if kind in ("malformed", "connected", "close", "closed"):
            self.out[kind] = item
        else:
            self.out.setdefault(kind, []).append(item)

    def update(self, key: str, sid: int, bits: int) -> None:
        changed = [n for n in ORDER if n in FIELD_NAMES[bits]]
        state = neutral(self.states[key][sid])
        self.record("updates", {"sub": key, "sid": sid, "changed": changed, "state": state})

    def pump(self) -> None:
        """What the client's pump does: send, close what the session wants closed, apply."""
        session = self.session
        while True:
            for data in session.data_to_send():
                self.record("sent", msgpack.unpackb(data))
            if session.close_request is not None and not self.closing:
                self.closing = True
                code, reason = session.close_request
                self.record("close", code)
                session.connection_lost(code, reason)
            event = session.next_event()
            if event is None:
                return
            if isinstance(event, Attach):
                key = str(event.key)
                old = self.states.get(key, [])
                self.states[key] = [
                    old[i] if i < len(old) and old[i].id == id else ChannelState(id)
                    for i, id in enumerate(event.ids)
                ]
            elif isinstance(event, Entries):
                key = str(event.key)
                for e in event.raw:
                    bits = self.states[key][e[0]].merge(e, event.snapshot)
                    self.update(key, e[0], bits)
            elif isinstance(event, Backfill):
                h = event.history
                self.record(
                    "history",
                    {
                        "sub": event.key,
                        "sid": h.sid,
                        "resolution": h.resolution,
                        "t": [list(divmod(int(t), 1_000_000_000)) for t in h.t],
                        "gap": [int(g) for g in h.gap],
                        **({"reason": h.reason} if h.reason is not None else {}),
                    },
                )
            elif isinstance(event, Lost):
                for key, states in self.states.items():
                    if key in session:
                        for sid, state in enumerate(states):
                            bits = link_lost(state, sid, event.reason)
                            if bits:
                                self.update(key, sid, bits)
            elif isinstance(event, Failed):
                self.record("failed", {"sub": event.key, "kind": event.kind, "code": event.code})
            elif isinstance(event, Renew):
                self.record("renew", event.key)
            elif isinstance(event, PingAnswered):
                self.record("pongs", {"nonce": event.nonce, "ok": event.rtt is not None})
            elif isinstance(event, ServerError):
                self.record("errors", {"code": event.code})
            elif isinstance(event, Malformed):
                self.record("malformed", True)
            elif isinstance(event, Connected):
                self.record("connected", True)
            elif isinstance(event, Closed):
                closed: dict[str, object] = {"code": event.code, "reconnect": event.reconnect}
                if event.within is not None:  # a drain's close (4012): how soon to come back
                    closed["within"] = event.within
                self.record("closed", closed)

    def step(self, step: dict[str, Any]) -> None:
        session = self.session
        if "at" in step:
            self.now = float(step["at"])
        if "subscribe" in step:
            ids = step.get("ids")
            expires = step.get("expires_at")
            session.add(
                step["subscribe"],
                step["token"],
                tuple(ids) if ids is not None else None,
                expires_at=float(expires) if expires is not None else None,
                renewable=step.get("renewable", True),
                backfill=step.get("backfill", False),
                now=self.now,
            )
        elif "unsubscribe" in step:
            session.remove(step["unsubscribe"], self.now)
        elif "renewed" in step:
            session.set_token(step["renewed"], step["token"], now=self.now)
        elif "ping" in step:
            assert session.ping(step["ping"], self.now) == step.get("sent", True)
        elif "open" in step:
            self.closing = False
            session.connection_made(self.now)
        elif "receive" in step:
            session.receive(msgpack.packb(step["receive"]), self.now)
        elif "receive_vector" in step:
            session.receive((VECTORS / f"{step['receive_vector']}.bin").read_bytes(), self.now)
        elif "receive_text" in step:
            session.receive(step["receive_text"], self.now)
        elif "closed" in step:
            code, reason = step["closed"]
            session.connection_lost(code, reason)
        elif "connect_failed" in step:
            session.connect_failed(step["connect_failed"])
        elif "timer" in step:
            session.timer(self.now)
        elif "expect" in step:
            self.expect(step["expect"])
            return
        else:
            raise AssertionError(f"unknown step {step}")
        self.pump()

    def expect(self, want: dict[str, Any]) -> None:
        got, self.out = self.out, {}
        if "deadline" in want:
            assert self.session.deadline() == want["deadline"], "deadline"
        for kind in OUTPUTS:
            if kind not in want:
                assert kind not in got, f"unexpected {kind}: {got[kind]}"
            elif kind == "updates":
                check_updates(got.get(kind, []), want[kind])
            else:
                assert got.get(kind) == want[kind], kind


def check_updates(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want), f"{len(got)} updates, expected {len(want)}: {got}"
    for g, w in zip(got, want, strict=True):
        assert (g["sub"], g["sid"], g["changed"]) == (w["sub"], w["sid"], w["changed"]), g
        for name, value in w.get("state", {}).items():
            if name == "reason_starts":
                assert g["state"]["reason"].startswith(value), (g, w)
            else:
                assert g["state"][name] == value, (name, g, w)


def test_there_are_cases() -> None:
    assert len(CASES) >= 10


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case(path: Path) -> None:
    case = json.loads(path.read_text())
    runner = Runner(case.get("options", {}))
    for i, step in enumerate(case["steps"]):
        try:
            runner.step(step)
        except AssertionError as e:
            raise AssertionError(f"{path.name} step {i} {json.dumps(step)[:200]}: {e}") from e
    assert not runner.out, f"outputs never expected: {runner.out}"
