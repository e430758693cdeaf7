"""Nothing one client asks for changes what another client receives or when: the issue's own
reproductions, over real WebSockets against the real server."""

from __future__ import annotations

import asyncio

from tests.server_process import ServerProcess
from tests.server_process import stream_token as token
from tests.stream_client import RawStream


async def test_a_throttled_client_does_not_slow_an_unrelated_fast_one(
    server: ServerProcess,
) -> None:
    slow = await RawStream.connect(server.ws_url)
    fast = await RawStream.connect(server.ws_url)
    try:
        # B first at one group per 20 s: before the fix the hub's next tick waited for B's due
        # time and A's 50 Hz counter arrived at about B's rate.
        await slow.attach(token(server, ["sim://ramp/iso"], maxRate=0.05))
        # B's channel opening and its first value; after that its next group is 20 s away.
        while not any(e.mask & 1 for g in (await slow.next_data()).groups for e in g.entries):
            pass
        await fast.attach(token(server, ["sim://counter/iso?rate=50"]))
        b_next = asyncio.ensure_future(slow.next_data(timeout=120))
        frames = 0
        # Before B's next group (20 s away) A must get its 50 Hz updates: 100 frames need only
        # 5 frames/s, far below the 50 it gets, so load cannot fail this; before the fix A got
        # about one frame per 2 s, about 10 before B's next group.
        while frames < 100 and not b_next.done():
            await fast.next_data(timeout=60)
            frames += 1
        assert frames == 100, f"A got only {frames} frames while B was held back"
        b_next.cancel()
    finally:
        await slow.close()
        await fast.close()
