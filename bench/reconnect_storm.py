"""A reconnect storm on one view, in process: N clients from one address are admitted and attach
the same token, then all leave, the newest first. Prints the event loop's time for each half.

    .venv/bin/python -m bench.reconnect_storm --clients 10000

The hub is the real one with tests/hub_doubles.py's backend (no IOC): what is timed is the hub's
own bookkeeping per client (admission, token, view, snapshot; then release), which must grow
linearly with the clients, not with their square.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import msgpack
from pvwire.config import Settings
from pvwire.core.hub import Hub
from pvwire.wire.session import Session, SessionLimits
from pvwire.wire.tokens import TokenSigner

from tests.hub_doubles import KEYS, FakeBackend


async def storm(clients: int) -> tuple[float, float]:
    backend = FakeBackend()
    settings = Settings(default_scheme="fake", linger_s=0.0)
    hub = Hub({"fake": backend}, settings, TokenSigner(KEYS, "k1"))
    hub.start()
    try:
        message = msgpack.packb([16, 1, hub.signer.issue(["fake://a", "fake://b"]).token])
        sessions = []
        started = time.perf_counter()
        for _ in range(clients):
            s = Session(
                hub.client_number(), "10.0.0.1", hub, b"\x91\x00", SessionLimits(), lambda: None
            )
            hub.add_session(s)
            s.receive(message)
            sessions.append(s)
        admitted = time.perf_counter()
        for s in reversed(sessions):
            hub.remove_session(s)
        return admitted - started, time.perf_counter() - admitted
    finally:
        await hub.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10_000)
    args = parser.parse_args()
    come, go = asyncio.run(storm(args.clients))
    print(f"{args.clients:,} clients on one view: admitted and attached in {come:.3f} s, "
          f"released in {go:.3f} s")  # fmt: skip


if __name__ == "__main__":
    main()
