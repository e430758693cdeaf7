"""What one `/pvws/pv` client can make the server do, measured on the real server:

- `lag`: the server's event-loop lag (`pvwire_event_loop_lag_seconds`, worst of the last 10 s)
  while one client subscribes N writable sim PVs (no updates of their own, so only opening
  costs), in messages of PER names.
- `image`: frames and bytes per second that one client subscribed to a 512x512 uint16 image at
  10 Hz (the demo image's shape and rate) receives, with the server's default
  `pvws_image_bytes_per_s` or another (PVWIRE_PVWS_IMAGE_BYTES_PER_S=0: every frame).

    .venv/bin/python -m bench.pvws_bounds lag [--names 9000] [--per 9000]
    .venv/bin/python -m bench.pvws_bounds image [--seconds 20] [--budget BYTES_PER_S]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import time

from websockets.asyncio.client import connect

from tests.server_process import ServerProcess, server_args_for_tests


def loop_lag(server: ServerProcess) -> float:
    found = re.search(r"^pvwire_event_loop_lag_seconds (\S+)", server.metrics(), re.M)
    return float(found.group(1)) if found else float("nan")


async def lag(names: int, per: int) -> None:
    with ServerProcess(*server_args_for_tests()) as server:
        url = server.url.replace("http", "ws") + "/pvws/pv"
        async with connect(url, max_size=None) as ws:
            pvs = [f"sim://value/bench{i}" for i in range(names)]
            started = time.monotonic()
            await ws.send(json.dumps({"type": "echo"}))  # a client that reads errors
            for i in range(0, names, per):
                await ws.send(json.dumps({"type": "subscribe", "pvs": pvs[i : i + per]}))
            seen: set[str] = set()
            errors: list[str] = []
            refused = False  # a subscribe past max_channels_per_subscription: none opens
            while len(seen) + len(errors) < names and not refused:
                message = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if message["type"] == "update":
                    seen.add(message["pv"])
                elif message["type"] == "error":
                    errors.append(message["message"])
                    refused = "in one message" in message["message"]
            took = time.monotonic() - started
            print(
                f"{names:,} names in messages of {per:,}: {len(seen):,} opened, "
                f"{len(errors):,} errors {errors[:1]}, {took:.1f} s, "
                f"event-loop lag {loop_lag(server):.3f} s"
            )


async def image(seconds: float, budget: str | None) -> None:
    env = {} if budget is None else {"PVWIRE_PVWS_IMAGE_BYTES_PER_S": budget}
    pv = "sim://image?width=512&height=512"
    with ServerProcess(*server_args_for_tests(), env=env) as server:
        url = server.url.replace("http", "ws") + "/pvws/pv"
        async with connect(url, max_size=None) as ws:
            await ws.send(json.dumps({"type": "subscribe", "pvs": [pv]}))
            first = json.loads(await ws.recv())
            started = time.monotonic()
            frames = nbytes = 0
            last = first
            while time.monotonic() - started < seconds:
                text = await ws.recv()
                assert isinstance(text, str)
                nbytes += len(text.encode())
                frames += 1
                last = json.loads(text)
            took = time.monotonic() - started
            pixels = len(base64.b64decode(last["b64int"])) // 4
            print(
                f"budget {budget or 'default'}: {frames / took:.2f} frames/s, "
                f"{nbytes / took / 1e6:.2f} MB/s, {nbytes / max(frames, 1) / 1e6:.2f} MB a "
                f"frame, {pixels:,} pixels ({first.get('vtype')})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("lag")
    p.add_argument("--names", type=int, default=9_000)
    p.add_argument("--per", type=int, default=9_000)
    p = sub.add_parser("image")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--budget", default=None)
    args = parser.parse_args()
    if args.what == "lag":
        asyncio.run(lag(args.names, args.per))
    else:
        asyncio.run(image(args.seconds, args.budget))


if __name__ == "__main__":
    main()
