"""The attacks of tests/test_attacks.py at full size: `python -m bench.attacks [NAME ...]`.

Each attack gets a server of its own (a clean RSS to start from) and a bystander reading a 50 Hz
counter on another connection; printed as JSON: the attack's size, the server's RSS growth and
worst loop lag (its own metric), its CPU, and the bystander's gaps (p99, max).

    .venv/bin/python -m bench.attacks              # all of them, one after the other
    .venv/bin/python -m bench.attacks body backfill
    .venv/bin/python -m bench.attacks --list

The sizes are the issue's (one address, no credentials): a 1 GiB POST (and 512 MiB chunked);
20 sockets each ATTACHing a backfill of 1,000 channels recorded at 50 Hz for 25 s and reading
nothing; one pvws `subscribe` of 20,000 names; 30 MJPEG viewers of a 1024 x 1024 image at 30
`fps` values; 3,000 pvws writes at once; 10,000 attachments of one view dropped and re-made;
1,000 WebSockets through haproxy (TLS, as docs/OPERATIONS.md configures it) from one address,
each forging an X-Forwarded-For of its own; 100,000 refused requests (a bad bearer token), each
from a source address of its own in 127.0.0.0/8; 2,000 slow senders (headers, bodies, upgrades
trickled, WebSockets silent after HELLO); 100,000 channels of names no IOC has asked for through
`/stream`, pvws and GraphQL; 20,000 pvgets of such names over 100 connections; 1,000
WebSockets, each from another address of one IPv6 /64, as a trusted proxy forwards them (a
socket from the proxy's address writing `X-Forwarded-For`); 100 connections each asking for the
largest GraphQL answer (100,000 float64, ~2 MB) three times at once, pipelined, and reading
none. The slow senders, hoarders, pvget flood and slow readers come from an address of their
own (all of 127/8 is loopback), so that the bystander and the scrapes are another client.

The `pva-*` attacks are a hostile PVA server's against pvwire's own PVA client (a server with
--forward-identity, olga putting, tests/hostile_pva.py on loopback beside a legitimate p4p
server): the doubling type of ~830 bytes (42 cached levels); 65,536 PUT INIT replies nobody
asked for, each a type of 1,000 members under a cache key of its own (~390 MB); 1,000 MESSAGEs
of 1 MiB; and search answers forged from an address nobody searched while 20 puts search.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pvwire.limits import PVA_IDENTITY_MESSAGE_BYTES, integer, number
from pvwire.loopback import apply_loopback_env

from tests.attacks import (
    MIB,
    Bystander,
    Hoard,
    PvaPeers,
    PvaSizes,
    Watch,
    answer_request,
    backfill_attack,
    body_attack,
    forged_sockets,
    hoard_channels,
    in_64,
    metric,
    mjpeg_viewers,
    peer_refusals,
    pva_peers,
    pva_put,
    pva_server_args,
    pvget_flood,
    pvws_subscribe,
    pvws_write_burst,
    read_backfill,
    reconnect_storm,
    record_history,
    rotating_refusals,
    rss_bytes,
    search_hijack,
    slow_readers,
    slow_senders,
    stream_token,
)
from tests.certs import TestCA
from tests.eventually import eventually_async
from tests.hostile_pva import doubling_type
from tests.proxies import PROXY_SOURCE, Proxy
from tests.server_process import ServerProcess

PVA_FULL = PvaSizes(
    doubling_levels=42, unsolicited=65_536, unsolicited_members=1_000, messages=1_000,
    message_bytes=PVA_IDENTITY_MESSAGE_BYTES - 16, fresh_names=20,
)  # fmt: skip
PVA_TINY = PvaSizes(
    doubling_levels=20, unsolicited=20, unsolicited_members=10, messages=20, message_bytes=1024,
    fresh_names=2,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Sizes:
    body: int = 1024 * MIB
    chunked_body: int = 512 * MIB
    backfill_sockets: int = 20
    backfill_channels: int = 1_000
    backfill_rate_hz: float = 50.0
    backfill_rows: int = 1_000  # updates recorded per channel first (the raw ring holds 1,024)
    pvws_names: int = 20_000
    mjpeg_fps_values: int = 30
    mjpeg_image: str = "sim://image/bench?width=1024&height=1024&rate=20"
    mjpeg_frames: int = 40  # frames every viewer takes while measured
    writes: int = 3_000
    storm_connections: int = 40
    storm_attachments: int = 250
    forged_sockets: int = 1_000
    rotating_refusals: int = 100_000
    pva: PvaSizes = PVA_FULL
    slow_senders: int = 2_000  # over the four kinds
    hoard_names: int = 100_000
    hoard_extra: int = 1_000  # through pvws and GraphQL, once the stream holds what it may
    pvgets: int = 20_000
    pvget_connections: int = 100
    ipv6_sockets: int = 1_000
    slow_readers: int = 100  # all the connections one address may have
    readers_pipelined: int = 3


FULL = Sizes()
# Small enough for `make test` (bench/test_attacks_smoke.py): that each attack runs end to end.
TINY = Sizes(
    body=4 * MIB, chunked_body=4 * MIB, backfill_sockets=2, backfill_channels=5,
    backfill_rate_hz=50.0, backfill_rows=20, pvws_names=50, mjpeg_fps_values=3,
    mjpeg_image="sim://image/bench?width=64&height=64&rate=10", mjpeg_frames=3, writes=30,
    storm_connections=2, storm_attachments=5, forged_sockets=3, rotating_refusals=50,
    pva=PVA_TINY, slow_senders=4, hoard_names=20, hoard_extra=0,
    pvgets=30, pvget_connections=4, ipv6_sockets=3, slow_readers=1, readers_pipelined=2,
)  # fmt: skip

ATTACKER = "127.0.0.99"  # the slow senders', hoarders' and pvget flood's own address


Attack = Callable[[ServerProcess, Sizes], Coroutine[Any, Any, dict[str, Any]]]


async def body(server: ServerProcess, sizes: Sizes) -> dict[str, Any]:
    status = await asyncio.to_thread(body_attack, server, sizes.body, False)
    return {"size_mb": sizes.body // MIB, "status": status}


async def body_chunked(server: ServerProcess, sizes: Sizes) -> dict[str, Any]:
    status = await asyncio.to_thread(body_attack, server, sizes.chunked_body, True)
    return {"size_mb": sizes.chunked_body // MIB, "status": status}


async def backfill(server: ServerProcess, sizes: Sizes) -> dict[str, Any]:
    rate = sizes.backfill_rate_hz
    ids = [f"sim://counter/bf{i}?rate={rate:g}" for i in range(sizes.backfill_channels)]
    recorder = await record_history(server, ids, sizes.backfill_rows)
    try:
        token = stream_token(server, ids, backfill=60)
        # What the attack costs, not the recording before it (1,000 histories: 47 MiB).
        with Watch(server) as watch:
            attackers = await backfill_attack(server, token, sizes.backfill_sockets)
            try:
                t0 = time.monotonic()
                rows, _ = await read_backfill(server, token)
                read_s = time.monotonic() - t0
            finally:
                for ws in attackers:
                    ws.transport.abort()
    finally:
        await recorder.close()
    return {
        "cost": watch.cost,
        "sockets": sizes.backfill_sockets, "channels": sizes.backfill_channels,
        "rows_per_channel": sizes.backfill_rows, "reader_rows": sum(rows.values()),
        "reader_s": round(read_s, 2),
    }  # fmt: skip


async def pvws(server: ServerProcess, sizes: Sizes) -> dict[str, Any]:
    names = [f"sim://value/pvws{i}" for i in range(sizes.pvws_names)]
    t0 = time.monotonic()
    # Past the cap the server answers with an `error`; up to it, with every name's update.
    allowed = sizes.pvws_names <= integer("max_channels_per_subscription")
    updated, errors = await pvws_subscribe(server, names, expect_all=allowed, timeout=300)
    return {
        "names": sizes.pvws_names, "updated": len(updated), "errors": len(errors),
        "first_error": errors[0][:200] if errors else None, "s": round(time.monotonic() - t0, 2),
    }  # fmt: skip


async def mjpeg(server: ServerProcess, sizes: Sizes) -> dict[str, Any]:
    fps = [20 + i / 100 for i in range(sizes.mjpeg_fps_values)]
    viewers = await mjpeg_viewers(server, sizes.mjpeg_image, fps)
    try:
        await eventually_async(
            lambda: (
                all(v.frames >= sizes.mjpeg_frames for v in viewers)
                or any(v.task is not None and v.task.done() for v in viewers)
            ),
            "every viewer's frames",
            timeout=300,
        )
    finally:
        for v in viewers:
            assert v.task is not None
            v.task.cancel()
        await asyncio.gather(*(v.task for v in viewers if v.task), return_exceptions=True)
    return {
        "viewers": len(fps),
        "image": sizes.mjpeg_image,
        "frames": [v.frames for v in viewers],
        "statuses": sorted({v.status for v in viewers}),
    }


async def writes(server: ServerProcess, sizes: Sizes) -> dict[str, Any]:
    errors = await pvws_write_burst(server, "sim://value/bench_writes", sizes.writes)
    return {"writes": sizes.writes, "errors": len(errors)}


async def storm(server: ServerProcess, sizes: Sizes) -> dict[str, Any]:
    token = stream_token(server, ["sim://counter/storm?rate=1"])
    drop, back = await reconnect_storm(
        server, token, sizes.storm_connections, sizes.storm_attachments
    )
    return {
        "attachments": sizes.storm_connections * sizes.storm_attachments,
        "drop_cpu_s": round(drop, 2), "return_cpu_s": round(back, 2),
    }  # fmt: skip


async def forged_xff(server: ServerProcess, sizes: Sizes) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        proxy = Proxy("haproxy", server.port, TestCA(Path(tmp)))
        await asyncio.to_thread(proxy.start)
        try:
            url = proxy.url.replace("https://", "wss://") + "/stream"
            t0 = time.monotonic()
            opened = await forged_sockets(url, proxy.ssl_context(), sizes.forged_sockets,
                                          "127.0.0.9")  # fmt: skip
            seconds = time.monotonic() - t0
            await opened.close()
        finally:
            await asyncio.to_thread(proxy.stop)
    return {
        "sockets": sizes.forged_sockets, "admitted": len(opened.admitted),
        "refused_429": sum(1 for status, _ in opened.refused if status == 429),
        "s": round(seconds, 2),
    }  # fmt: skip


async def refusals(server: ServerProcess, sizes: Sizes) -> dict[str, Any]:
    t0 = time.monotonic()
    statuses = await rotating_refusals(server.port, sizes.rotating_refusals)
    return {"requests": sizes.rotating_refusals, "sources": sizes.rotating_refusals,
            "statuses": statuses, "s": round(time.monotonic() - t0, 2)}  # fmt: skip


# --- a hostile PVA server against pvwire's own PVA client ---------------------------------------

PvaAttack = Callable[[ServerProcess, PvaPeers, PvaSizes], Coroutine[Any, Any, dict[str, Any]]]


async def _hostile_put(server: ServerProcess, name: str) -> dict[str, Any]:
    before, logged = peer_refusals(server), server.output_bytes
    t0 = time.monotonic()
    result = await pva_put(server, name, 1.0, timeout=300)
    after = peer_refusals(server)
    return {
        "result": result[:160], "put_s": round(time.monotonic() - t0, 2),
        "log_bytes": server.output_bytes - logged,
        "refused": {r: n - before.get(r, 0) for r, n in after.items() if n > before.get(r, 0)},
    }  # fmt: skip


async def pva_doubling(server: ServerProcess, peers: PvaPeers, sizes: PvaSizes) -> dict[str, Any]:
    figures = await _hostile_put(server, "HOSTILE:DOUBLE")
    type_bytes = len(doubling_type(sizes.doubling_levels))
    return {"levels": sizes.doubling_levels, "type_bytes": type_bytes, **figures}


async def pva_unsolicited(
    server: ServerProcess, peers: PvaPeers, sizes: PvaSizes
) -> dict[str, Any]:
    figures = await _hostile_put(server, "HOSTILE:UNSOLICITED")
    return {"replies": sizes.unsolicited, "members": sizes.unsolicited_members, **figures}


async def pva_messages(server: ServerProcess, peers: PvaPeers, sizes: PvaSizes) -> dict[str, Any]:
    figures = await _hostile_put(server, "HOSTILE:MESSAGES")
    return {"messages": sizes.messages, "message_bytes": sizes.message_bytes, **figures}


async def pva_search(server: ServerProcess, peers: PvaPeers, sizes: PvaSizes) -> dict[str, Any]:
    names = [f"LEGIT:B{i}" for i in range(sizes.fresh_names)]
    before, refused = len(peers.legit.seen), peer_refusals(server).get("search_reply", 0)
    results = await search_hijack(server, peers, names)
    return {
        "puts": len(names), "ok": results.count("ok"),
        "legit_server_got": len(peers.legit.seen) - before - 1,  # LEGIT:X first
        "forged": peers.hostile.forged,
        "answers_dropped": peer_refusals(server).get("search_reply", 0) - refused,
    }  # fmt: skip


PVA_ATTACKS: dict[str, PvaAttack] = {
    "pva-doubling": pva_doubling,
    "pva-unsolicited": pva_unsolicited,
    "pva-messages": pva_messages,
    "pva-search": pva_search,
}


async def slow(server: ServerProcess, sizes: Sizes) -> dict[str, Any]:
    kinds = ("headers", "body", "upgrade", "silent")
    counts = {k: sizes.slow_senders // len(kinds) for k in kinds}
    senders = await slow_senders(server, counts, [ATTACKER])
    statuses: dict[str, int] = {}
    for s in senders:
        key = "4000" if (s.close_frame() or (0,))[0] == 4000 else str(s.status)
        statuses[key] = statuses.get(key, 0) + 1
    kept = [s.seconds for s in senders if s.status != 429]
    return {
        "senders": len(senders), "answers": statuses,
        "unclosed": sum(1 for s in senders if s.seconds is None),
        "held_longest_s": round(max((t for t in kept if t is not None), default=0.0), 2),
    }  # fmt: skip


async def hoard(server: ServerProcess, sizes: Sizes) -> dict[str, Any]:
    names = [f"ca://HOARD:{i:06d}" for i in range(sizes.hoard_names)]
    extra = [f"ca://HOARD:X{i:04d}" for i in range(sizes.hoard_extra)]
    held: dict[str, float] = {}

    async def meanwhile(h: Hoard) -> None:
        held.update(metric(server, "pvwire_upstream_channels"))

    per_token = integer("max_channels_per_subscription")
    h = await hoard_channels(server, ATTACKER, names, per_token, extra, meanwhile)
    return {
        "asked": sizes.hoard_names + 2 * sizes.hoard_extra, "attached": h.attached,
        "stream_refused": len(h.stream_errors), "pvws_refused": len(h.pvws_errors),
        "gets_refused": h.get_errors.count("TOO_MANY_CHANNELS"),
        "searching": held.get('{scheme="ca",state="searching"}', 0),
    }  # fmt: skip


async def pvgets(server: ServerProcess, sizes: Sizes) -> dict[str, Any]:
    names = [f"ca://FLOOD:{i}" for i in range(sizes.pvgets)]
    before = metric(server, "pvwire_gets_total")['{source="upstream"}']
    codes, seconds = await pvget_flood(
        server, ATTACKER, sizes.pvgets, sizes.pvget_connections, names
    )
    made = metric(server, "pvwire_gets_total")['{source="upstream"}'] - before
    return {"pvgets": sizes.pvgets, "answers": codes, "upstream_gets": made, "s": round(seconds, 2)}


async def ipv6_xff(server: ServerProcess, sizes: Sizes) -> dict[str, Any]:
    t0 = time.monotonic()
    opened = await forged_sockets(server.ws_url, None, sizes.ipv6_sockets, PROXY_SOURCE,
                                  forwarded=in_64)  # fmt: skip
    seconds = time.monotonic() - t0
    await opened.close()
    return {
        "sockets": sizes.ipv6_sockets, "sources": "one /64", "admitted": len(opened.admitted),
        "refused_429": sum(1 for status, _ in opened.refused if status == 429),
        "s": round(seconds, 2),
    }  # fmt: skip


async def unread(server: ServerProcess, sizes: Sizes) -> dict[str, Any]:
    assert server.pid is not None
    elements = integer("max_graphql_elements")
    request = answer_request(f"sim://waveform/bench_unread?length={elements}&rate=1")

    def dropped() -> float:
        return metric(server, "pvwire_request_timeouts_total").get('{phase="response"}', 0.0)

    before, rss0 = dropped(), rss_bytes(server.pid)
    t0 = time.monotonic()
    readers = await asyncio.to_thread(
        slow_readers, server, ATTACKER, sizes.slow_readers, request, sizes.readers_pipelined
    )
    try:
        await eventually_async(
            lambda: asyncio.to_thread(lambda: dropped() - before >= sizes.slow_readers),
            "every unread answer dropped",
            timeout=number("http_write_timeout_s") + 300,
        )
        seconds = time.monotonic() - t0
        # What is left a second after the last was dropped (the peak: `rss_growth_mb`).
        await asyncio.sleep(1)
        left = rss_bytes(server.pid) - rss0
    finally:
        for sock in readers:
            sock.close()
    return {
        "readers": sizes.slow_readers, "pipelined": sizes.readers_pipelined,
        "elements": elements, "dropped_after_s": round(seconds, 2),
        "rss_left_mb": round(left / MIB, 1),
    }  # fmt: skip


ATTACKS: dict[str, Attack] = {
    "body": body,
    "body-chunked": body_chunked,
    "backfill": backfill,
    "pvws": pvws,
    "mjpeg": mjpeg,
    "writes": writes,
    "storm": storm,
    "forged-xff": forged_xff,
    "refusals": refusals,
    "slow": slow,
    "hoard": hoard,
    "pvgets": pvgets,
    "ipv6-xff": ipv6_xff,
    "unread": unread,
}


def server_args(audit: Path, extra: list[str]) -> list[str]:
    return [
        "--write-rule", "sim://value*", "--audit-log", str(audit), "--log-level", "warning",
        "--stall-timeout", "120", "--trusted-proxy", f"{PROXY_SOURCE}/32", *extra,
    ]  # fmt: skip


def measure(name: str, sizes: Sizes = FULL, extra: list[str] | None = None) -> dict[str, Any]:
    """Run attack `name` against a server of its own (a clean RSS to start from)."""
    apply_loopback_env()
    with tempfile.TemporaryDirectory() as tmp:
        audit = Path(tmp) / "audit.jsonl"
        if name in PVA_ATTACKS:
            with pva_peers(sizes.pva) as peers:
                args = server_args(audit, [*pva_server_args(Path(tmp)), *(extra or [])])
                with ServerProcess(*args, env=peers.env) as server:
                    return attack(server, name, sizes, audit, peers)
        with ServerProcess(*server_args(audit, extra or [])) as server:
            return attack(server, name, sizes, audit)


def attack(
    server: ServerProcess, name: str, sizes: Sizes, audit: Path, peers: PvaPeers | None = None
) -> dict[str, Any]:
    """Run attack `name` against `server` (audit file `audit`; `peers` for the PVA attacks)
    with a bystander beside it; its figures with the server's cost and the bystander's gaps."""
    lines_before = audit.read_text().count("\n") if audit.exists() else 0
    bystander = Bystander(server)
    bystander.start()
    try:
        start = bystander.mark()
        with Watch(server) as watch:
            if name in PVA_ATTACKS:
                assert peers is not None, f"{name} needs the PVA peers its server searches"
                figures = asyncio.run(PVA_ATTACKS[name](server, peers, sizes.pva))
            else:
                figures = asyncio.run(ATTACKS[name](server, sizes))
        end = bystander.mark()
        # An attack that prepares first (backfill records) says what the attack cost.
        cost = figures.pop("cost", watch.cost)
        start = max(start, cost.started)
        try:
            gaps: dict[str, Any] = bystander.check(start, end)
        except AssertionError as exc:
            gaps = {"failed": str(exc)}
    finally:
        bystander.stop()
    lines = audit.read_text().count("\n") - lines_before if audit.exists() else 0
    return {
        "attack": name, **figures, **cost.as_dict(),
        "bystander": gaps, "audit_lines": lines,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.attacks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    known = [*ATTACKS, *PVA_ATTACKS]
    p.add_argument("names", nargs="*", help=f"attacks (default all): {', '.join(known)}")
    p.add_argument("--list", action="store_true", help="list the attacks")
    p.add_argument("--tiny", action="store_true", help="the smoke test's sizes")
    p.add_argument("--backfill-channels", type=int, help="channels recorded for `backfill`")
    a = p.parse_args(argv)
    if a.list:
        print("\n".join(known))
        return
    unknown = [n for n in a.names if n not in known]
    if unknown:
        p.error(f"unknown attack(s) {unknown}; known: {', '.join(known)}")
    sizes = TINY if a.tiny else FULL
    if a.backfill_channels:
        sizes = replace(sizes, backfill_channels=a.backfill_channels)
    for name in a.names or known:
        print(json.dumps(measure(name, sizes), default=str), flush=True)


if __name__ == "__main__":
    main()
