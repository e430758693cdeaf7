"""`pvws/session.py` in memory: one text per channel state and variant shared by every client, and
`/stream`'s flow control (merge while behind, then the latest state)."""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field

import numpy as np
from pvwire.model import VALUE, ConnState, Metadata
from pvwire.pvws.encoder import PvwsEncoder
from pvwire.pvws.frames import read_text_frame
from pvwire.pvws.pv import Opened, PvSource, PvwsRefused
from pvwire.pvws.session import MAX_HELD_ERRORS, PvwsSession, about
from pvwire.wire.session import SessionLimits
from pvwire.wire.tokens import Claims


@dataclass
class FakeChannel:
    id: str = "pva://x"
    value: object = 1.5
    seconds: int = 100
    nanoseconds: int = 5
    severity: int = 0
    meta: Metadata = field(default_factory=lambda: Metadata("float64", 1, "d", "mm", 2))
    state: ConnState = ConnState.CONNECTED
    updates: int = 1
    known: int = VALUE
    fault: str = ""

    def set(self, value: object, severity: int = 0) -> None:
        self.value, self.severity, self.updates = value, severity, self.updates + 1


@dataclass
class FakeView:
    channels: list[FakeChannel]


class FakeHost:
    def __init__(self, ch: FakeChannel) -> None:
        self.view = FakeView([ch])

    def open(self, name: str, session: PvwsSession, att: int, array: bool) -> Opened:
        if name.startswith("bad"):
            raise PvwsRefused("no such PV")
        view: PvSource = self.view
        return Opened(view, Claims((name,), "LATEST", 0.0, 0, 0), may_write=False)

    def close(self, view: PvSource, session: PvwsSession, att: int) -> None:
        pass


def drain(s: PvwsSession) -> list[str]:
    out = []
    while (t := s.next_text()) is not None:
        out.append(t)
        s.sent(len(t))
    return out


def session(ch: FakeChannel, encoder: PvwsEncoder, budget: int = 1 << 20) -> PvwsSession:
    return PvwsSession(
        1, "", FakeHost(ch), encoder, SessionLimits(send_budget=budget), lambda: None
    )


def test_a_connection_holds_at_most_max_channels_pvs() -> None:
    ch = FakeChannel()
    s = PvwsSession(1, "", FakeHost(ch), PvwsEncoder(), SessionLimits(max_channels=2), lambda: None)
    s.receive('{"type":"echo"}')  # a client that reads errors
    s.receive('{"type":"subscribe","pvs":["a","b","c"]}')
    texts = [json.loads(t) for t in drain(s)]
    errors = [t["message"] for t in texts if t["type"] == "error"]
    assert list(s.pvs) == ["a", "b"] and s.channel_count == 2
    assert len(errors) == 1 and errors[0].startswith("Cannot subscribe to c: ")
    assert "max_channels_per_connection" in errors[0]
    s.receive('{"type":"clear","pvs":["a"]}')  # room again
    s.receive('{"type":"subscribe","pvs":["c"]}')
    assert list(s.pvs) == ["b", "c"]


def test_the_hub_reads_attachments_and_claims_from_the_pvs_themselves() -> None:
    s = session(FakeChannel(), PvwsEncoder())
    s.receive('{"type":"subscribe","pvs":["a","b","c"]}')
    s.receive('{"type":"clear","pvs":["b"]}')
    s.end_attachment(1, 4403, "may not read a")  # as a rules reload ends one
    assert list(s.pvs) == ["c"] and s.channel_count == 1
    assert dict(s.claims) == {3: s.pvs["c"].claims} and s.claims[3].ids == ("c",)
    assert dict(s.attachments) == {3: s.pvs["c"].view}
    s.close()
    assert not s.pvs and not s.attachments and not s.claims and s.channel_count == 0


def test_clients_share_one_text_per_state_and_variant() -> None:
    ch, encoder = FakeChannel(), PvwsEncoder()
    a, b = session(ch, encoder), session(ch, encoder)
    for s in (a, b):
        s.receive('{"type":"subscribe","pvs":["x"]}')
    first_a, first_b = drain(a), drain(b)
    assert first_a == first_b and json.loads(first_a[0])["units"] == "mm"
    ch.set(2.0, severity=1)
    texts = []
    for s in (a, b):
        s.collect(1, object())
        s.flush_tick()
        texts.append(s.next_text())
    assert texts[0] == texts[1]
    assert json.loads(texts[0] or "")["severity"] == "MINOR"
    assert encoder.encoded == 2  # one first message, one update


def test_behind_merges_then_sends_the_latest_state() -> None:
    ch, encoder = FakeChannel(value=np.arange(4, dtype=np.float64)), PvwsEncoder()
    s = session(ch, encoder, budget=10)
    s.receive('{"type":"subscribe","pvs":["w"]}')  # first message fills the tiny budget
    for v in range(3):
        ch.set(np.full(4, float(v)))
        s.collect(1, object())
        s.flush_tick()
    assert s.behind and s.conflated == 2
    texts = drain(s)
    assert len(texts) == 2  # the first message, then one with the latest state
    last = json.loads(texts[-1])
    assert np.frombuffer(base64.b64decode(last["b64dbl"]), "<f8").tolist() == [2.0] * 4


def test_uint8_arrays_travel_as_pvws_sends_them_over_ca_and_pva() -> None:
    """PVA ubyte[] (and sim's) as b64int VUByteArray; CA's DBR_CHAR as b64byt VByteArray."""
    data = np.array([0, 255, 1], dtype=np.uint8)
    for channel_id, vtype, member, dtype in (
        ("pva://x", "VUByteArray", "b64int", "<i4"),
        ("sim://image?dtype=uint8", "VUByteArray", "b64int", "<i4"),
        ("ca://x", "VByteArray", "b64byt", "u1"),
    ):
        ch = FakeChannel(id=channel_id, value=data, meta=Metadata("uint8", 3))
        s = session(ch, PvwsEncoder())
        s.receive('{"type":"subscribe","pvs":["x"]}')
        first = json.loads(drain(s)[0])
        assert first["vtype"] == vtype, channel_id
        assert np.frombuffer(base64.b64decode(first[member]), dtype).tolist() == [0, 255, 1]


def test_a_client_that_only_subscribed_one_pv_gets_errors_once_it_sends_more() -> None:
    """Grafana's live proxy: one subscribe of one PV, every message taken for data."""
    ch = FakeChannel()
    s = session(ch, PvwsEncoder())
    s.receive('{"type":"subscribe","pvs":["bad1"]}')
    assert drain(s) == [] and not s.reads_errors
    s.receive('{"type":"echo","n":1}')  # anything else: the held error, then the answer
    texts = [json.loads(t) for t in drain(s)]
    assert texts == [
        {"type": "error", "message": "Cannot subscribe to bad1: no such PV"},
        {"type": "echo", "n": 1},
    ]
    s.receive('{"type":"subscribe","pvs":["bad2"]}')
    assert json.loads(drain(s)[0])["type"] == "error"


def test_clients_that_read_errors_get_them_at_once() -> None:
    for first in (
        '{"type":"subscribe","pvs":["bad","x"]}',  # two PVs (cs-web-lib: its heartbeat too)
        '{"type":"subscribe","pvs":[]}',
        '{"type":"monitor","pvs":{"a":"bad","b":"x"}}',
        '{"type":"write","pv":"bad","value":1}',  # a write's failure answers the write
        '{"type":"list"}',
    ):
        s = session(FakeChannel(), PvwsEncoder())
        s.receive(first)
        s.receive('{"type":"subscribe","pvs":["bad"]}')
        kinds = [json.loads(t)["type"] for t in drain(s)]
        assert kinds.count("error") >= 1 and s.reads_errors, first


def test_held_errors_are_bounded() -> None:
    s = session(FakeChannel(), PvwsEncoder())
    s.receive('{"type":"subscribe","pvs":["bad0"]}')
    for i in range(1, MAX_HELD_ERRORS + 5):
        s.end_attachment(0, 4403, "unused")  # no such attachment: nothing held
        s.write_failed(f"failure {i}")
    assert drain(s) == [] and s.errors_dropped == 5
    s.receive('{"type":"list"}')
    kinds = [json.loads(t)["type"] for t in drain(s)]
    assert kinds == ["error"] * MAX_HELD_ERRORS + ["list"]


def test_a_subscribe_past_max_per_subscribe_is_refused_whole_and_others_go_on() -> None:
    ch = FakeChannel()
    s = PvwsSession(
        1, "", FakeHost(ch), PvwsEncoder(), SessionLimits(), lambda: None, max_per_subscribe=3
    )
    s.receive('{"type":"subscribe","pvs":["held","other"]}')
    drain(s)
    s.receive('{"type":"subscribe","pvs":["a","b","c","d"]}')
    texts = [json.loads(t) for t in drain(s)]
    assert texts == [
        {
            "type": "error",
            "message": "Cannot subscribe to 4 PVs in one message: the most is 3 "
            "(max_channels_per_subscription)",
        }
    ]
    assert list(s.pvs) == ["held", "other"]
    s.receive('{"type":"subscribe","pvs":["a","b","c"]}')  # at the bound: opened
    assert list(s.pvs) == ["held", "other", "a", "b", "c"]


def test_names_wait_for_the_opener_and_open_as_it_asks() -> None:
    ch = FakeChannel()
    calls: list[PvwsSession] = []
    s = PvwsSession(
        1, "", FakeHost(ch), PvwsEncoder(), SessionLimits(), lambda: None, opener=calls.append
    )
    names = [f"n{i}" for i in range(25)]
    s.receive(json.dumps({"type": "subscribe", "pvs": names}))
    assert calls == [s] and s.opening == 25 and not s.pvs  # nothing opened in `receive`
    assert s.open_pending(10) == 10
    assert list(s.pvs) == names[:10] and s.opening == 15
    assert [json.loads(t)["pv"] for t in drain(s)] == names[:10]  # answered as they open
    s.receive('{"type":"write","pv":"n20","value":1}')  # a write opens its PV first
    assert "n20" in s.pvs and s.opening == 14
    s.receive('{"type":"clear","pvs":["n12"]}')  # cleared before it opened: never opens
    s.receive('{"type":"list"}')
    texts = drain(s)
    assert json.loads(texts[0])["pv"] == "n20"
    listed = json.loads(texts[-1])["pvs"]
    assert listed == [*names[:10], "n20", *(n for n in names[10:] if n not in ("n12", "n20"))]
    assert s.open_pending(100) == 13 and s.opening == 0
    assert list(s.pvs) == listed


def test_waiting_names_count_toward_the_connection_s_pvs() -> None:
    ch = FakeChannel()
    s = PvwsSession(
        1, "", FakeHost(ch), PvwsEncoder(), SessionLimits(max_channels=2), lambda: None,
        opener=lambda _: None,
    )  # fmt: skip
    s.receive('{"type":"echo"}')
    s.receive('{"type":"subscribe","pvs":["a","b","c"]}')
    errors = [json.loads(t)["message"] for t in drain(s) if '"error"' in t]
    assert s.opening == 2 and len(errors) == 1 and errors[0].startswith("Cannot subscribe to c")


def test_the_queue_and_bytes_sent_count_utf8_bytes_not_characters() -> None:
    text = "température 25 °C, ΔT ≤ 0.5 ✓"
    ch = FakeChannel(value=text, meta=Metadata("string", 1, "s"))
    s = session(ch, PvwsEncoder())
    s.receive('{"type":"subscribe","pvs":["s"]}')
    update = s._flow._out._items[0]  # the one frame queued: the text's UTF-8 bytes
    message, end = read_text_frame(update)
    assert json.loads(message)["text"] == text and end == len(update)
    size = len(update)
    assert size > len(message)
    assert s.queued_bytes == size
    frames = s.next_frames()
    assert frames is not None
    s.frames_written(len(frames))
    assert (s.bytes_sent, s.queued_bytes) == (size, 0)
    # The same over the one-text-per-write path.
    ch.set(text + "!")
    s.collect(1, object())
    s.flush_tick()
    second = len(s._flow._out._items[0])
    assert s.queued_bytes == second
    sent = s.next_text()
    assert sent is not None and len(sent) < second
    s.sent(len(sent))
    assert (s.bytes_sent, s.queued_bytes) == (size + second, 0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def image_session(ch: FakeChannel, clock: Clock, rate: float) -> PvwsSession:
    return PvwsSession(
        1, "", FakeHost(ch), PvwsEncoder(), SessionLimits(), lambda: None, clock=clock,
        image_bytes_per_s=rate,
    )  # fmt: skip


def tick(s: PvwsSession) -> list[dict[str, object]]:
    s.collect(1, object())
    s.flush_tick()
    return [json.loads(t) for t in drain(s)]


def test_image_frames_are_paced_to_the_connection_s_budget_newest_first() -> None:
    meta = Metadata("uint16", 64, "")
    ch, clock = FakeChannel(value=np.zeros((8, 8), np.uint16), meta=meta), Clock()
    s = image_session(ch, clock, rate=1000.0)
    s.receive('{"type":"subscribe","pvs":["img"]}')
    first = [json.loads(t) for t in drain(s)]
    assert first[0]["vtype"] == "VUShortArray"
    size = len(s._encoder.text("img", ch, True, True, True).encode())
    assert size > 300  # a frame owes its bytes: the next waits size/rate s
    for v in (1, 2, 3):  # frames come faster than the budget: held, the newest kept
        ch.set(np.full((8, 8), v, np.uint16))
        clock.now += 0.05
        assert tick(s) == []
    assert s.images_held == 2
    clock.now += size / 1000.0  # paid off
    ch.set(np.full((8, 8), 4, np.uint16))
    sent = tick(s)
    assert len(sent) == 1
    pixels = np.frombuffer(base64.b64decode(str(sent[0]["b64int"])), "<i4")
    assert pixels.tolist() == [4] * 64  # whole, and the newest


def test_a_held_image_that_stops_changing_still_goes_out() -> None:
    meta = Metadata("uint16", 64, "")
    ch, clock = FakeChannel(value=np.zeros((8, 8), np.uint16), meta=meta), Clock()
    s = image_session(ch, clock, rate=1000.0)
    s.receive('{"type":"subscribe","pvs":["img"]}')
    drain(s)
    ch.set(np.full((8, 8), 7, np.uint16))
    assert tick(s) == []  # held: the first frame is not paid off yet
    clock.now += 10.0
    s.housekeeping(clock.now)
    sent = [json.loads(t) for t in drain(s)]
    assert len(sent) == 1
    assert np.frombuffer(base64.b64decode(str(sent[0]["b64int"])), "<i4").tolist() == [7] * 64


def test_images_are_not_paced_with_a_budget_of_0_nor_are_1d_arrays() -> None:
    for value, rate in ((np.zeros((8, 8), np.uint16), 0.0), (np.zeros(64, np.uint16), 1.0)):
        ch, clock = FakeChannel(value=value, meta=Metadata("uint16", 64, "")), Clock()
        s = image_session(ch, clock, rate=rate)
        s.receive('{"type":"subscribe","pvs":["a"]}')
        drain(s)
        for v in range(3):
            ch.set(np.full(value.shape, v, np.uint16))
            assert len(tick(s)) == 1


def test_the_opener_opens_for_a_time_per_pass_taking_turns() -> None:
    from pvwire.core.opener import Opener

    ticks = iter(range(1_000_000))  # each reading of the clock a unit later
    opener = Opener(budget_s=2.5, turn=10, clock=lambda: float(next(ticks)))
    ch = FakeChannel()
    big, small = (
        PvwsSession(n, "", FakeHost(ch), PvwsEncoder(), SessionLimits(), lambda: None,
                    opener=lambda _: None)
        for n in (1, 2)
    )  # fmt: skip
    big.receive(json.dumps({"type": "subscribe", "pvs": [f"b{i}" for i in range(100)]}))
    small.receive(json.dumps({"type": "subscribe", "pvs": [f"s{i}" for i in range(5)]}))
    opener._waiting.extend((big, small))
    opener._queued.update((1, 2))
    opener.one_pass()  # three turns fit: 10 of the big one, the small one's 5, 10 more
    assert (len(big.pvs), len(small.pvs)) == (20, 5)
    passes = 1
    while big.opening:
        opener.one_pass()
        passes += 1
    assert len(big.pvs) == 100 and not opener._waiting and passes == 4  # 30 a pass alone
    stalled = Opener(budget_s=0.0, turn=10, clock=lambda: 0.0)  # no time: still one turn
    late = PvwsSession(3, "", FakeHost(ch), PvwsEncoder(), SessionLimits(), lambda: None,
                       opener=lambda _: None)  # fmt: skip
    late.receive(json.dumps({"type": "subscribe", "pvs": [f"l{i}" for i in range(15)]}))
    stalled._waiting.append(late)
    stalled._queued.add(3)
    stalled.one_pass()
    assert len(late.pvs) == 10


def test_a_failure_names_the_pv_once_as_the_client_asked_for_it() -> None:
    why = "sim://x: unknown sim function 'x'"
    assert about("sim://x", why) == why
    assert about("x", "loc://x: this server keeps at most 2 local PVs") == (
        "x: this server keeps at most 2 local PVs"
    )
    spaced = 'loc://s("a b"): expected NAME'
    assert about('loc://s("a b")', spaced) == spaced
    assert about("ca://X", "no server answered") == "ca://X: no server answered"


def test_first_values_wait_for_the_send_budget_and_each_pv_gets_one() -> None:
    """A client that subscribes many PVs and reads nothing holds its budget, not their values."""
    ch, budget = FakeChannel(), 1000
    s = session(ch, PvwsEncoder(), budget=budget)
    names = [f"pv{i}" for i in range(100)]
    s.receive(json.dumps({"type": "subscribe", "pvs": names}))
    one = len(s._encoder.text("pv99", ch, True, True, True).encode())
    assert 100 * one > 3 * budget  # all the first values would overrun it
    assert s.queued_bytes <= budget + one and s.behind
    ch.set(2.5)  # a change while behind of a PV still waiting: merged into its first value
    s.collect(51, object())
    s.flush_tick()
    assert s.conflated == 1
    got = [json.loads(t) for t in drain(s)]
    assert [t["pv"] for t in got] == names  # one first value each, in subscribe order
    assert all("units" in t for t in got)  # each is a whole first value, metadata included
    assert got[50]["value"] == 2.5 and not s.behind and s.queued_bytes == 0


def test_a_catch_up_queues_within_the_send_budget_too() -> None:
    ch, budget = FakeChannel(), 1000
    s = session(ch, PvwsEncoder(), budget=budget)
    s.receive(json.dumps({"type": "subscribe", "pvs": [f"pv{i}" for i in range(100)]}))
    one = len(s._encoder.text("pv99", ch, True, True, True).encode())
    sent = 0
    while (t := s.next_text()) is not None:
        s.sent(len(t))
        sent += 1
        assert s.queued_bytes <= budget + one
    assert sent == 100


def test_first_image_frames_go_within_a_second_s_budget_then_one_per_payoff() -> None:
    meta = Metadata("uint16", 64, "")
    ch, clock = FakeChannel(value=np.zeros((8, 8), np.uint16), meta=meta), Clock()
    s = image_session(ch, clock, rate=1000.0)
    names = [f"img{i}" for i in range(6)]
    s.receive(json.dumps({"type": "subscribe", "pvs": names}))
    size = len(s._encoder.text("img0", ch, True, True, True).encode())
    at_once = math.ceil(1000 / size)  # while the connection owes less than 1 s of budget
    assert 1 < at_once < len(names) - 1
    assert [json.loads(t)["pv"] for t in drain(s)] == names[:at_once]
    got: list[str] = []
    for _ in names[at_once:]:
        clock.now += size / 1000.0  # one frame's bytes paid: the next first frame goes
        s.housekeeping(clock.now)
        got += [json.loads(t)["pv"] for t in drain(s)]
    assert got == names[at_once:] and s.images_held == 0


class Channels:
    """A host of one FakeChannel per name."""

    def __init__(self, channels: dict[str, FakeChannel]) -> None:
        self.channels = channels

    def open(self, name: str, session: PvwsSession, att: int, array: bool) -> Opened:
        view: PvSource = FakeView([self.channels[name]])
        return Opened(view, Claims((name,), "LATEST", 0.0, 0, 0), may_write=False)

    def close(self, view: PvSource, session: PvwsSession, att: int) -> None:
        pass


def images_at_10_hz(shapes: dict[str, tuple[int, int]], seconds: float) -> dict[str, int]:
    """Images of `shapes` (uint16), each changed at every 0.1 s tick on one connection with the
    default budget (1.5 MB/s): frames each got, after the first."""
    clock = Clock()
    channels = {
        name: FakeChannel(value=np.zeros(shape, np.uint16), meta=Metadata("uint16", 64, ""))
        for name, shape in shapes.items()
    }
    s = PvwsSession(
        1, "", Channels(channels), PvwsEncoder(), SessionLimits(send_budget=1 << 30),
        lambda: None, clock=clock, image_bytes_per_s=1.5e6,
    )  # fmt: skip
    s.receive(json.dumps({"type": "subscribe", "pvs": list(shapes)}))
    drain(s)
    got = dict.fromkeys(shapes, 0)
    for k in range(round(seconds * 10)):
        clock.now += 0.1
        for att, (name, ch) in enumerate(channels.items(), 1):
            ch.set(np.full(shapes[name], k + 1, np.uint16))
            s.collect(att, object())
        s.flush_tick()
        for t in drain(s):
            got[json.loads(t)["pv"]] += 1
    return got


def test_small_images_within_the_budget_are_never_held() -> None:
    # Three 8 x 4 images, ~1 kB/s together against 1.5 MB/s: every frame of each goes.
    got = images_at_10_hz({"a": (4, 8), "b": (4, 8), "c": (4, 8)}, seconds=3.0)
    assert got == {"a": 30, "b": 30, "c": 30}


def test_a_small_image_beside_a_camera_keeps_its_rate() -> None:
    # A 512 x 512 uint16 camera (1.4 MB a frame, ~14 MB/s) takes the budget; an 8 x 4 image
    # beside it still gets every frame, and the camera what is left: about one a second.
    got = images_at_10_hz({"camera": (512, 512), "small": (4, 8)}, seconds=5.0)
    assert got["small"] == 50
    assert 3 <= got["camera"] <= 6


def test_thousands_of_held_images_each_go_in_turn() -> None:
    """5,000 images subscribed at once on a tiny budget: held in subscription order, each sent
    once as the budget allows, none twice, none lost."""
    meta = Metadata("uint16", 64, "")
    ch, clock = FakeChannel(value=np.zeros((8, 8), np.uint16), meta=meta), Clock()
    s = image_session(ch, clock, rate=1000.0)
    names = [f"img{i}" for i in range(5000)]
    s.receive(json.dumps({"type": "subscribe", "pvs": names}))
    got = [json.loads(t)["pv"] for t in drain(s)]
    while len(got) < len(names):
        clock.now += 10.0  # 10 s of budget: ~25 frames
        s.collect(1, object())  # a change of the first image: one more held frame each time
        s.flush_tick()
        sent = [json.loads(t)["pv"] for t in drain(s)]
        assert 0 < len(sent) < 100
        got += [pv for pv in sent if pv != "img0"]
    assert got == names


def test_every_update_queued_is_a_delivery_and_a_merged_one_is_not() -> None:
    ch, encoder = FakeChannel(), PvwsEncoder()
    s = session(ch, encoder)
    s.receive('{"type":"subscribe","pvs":["x"]}')
    drain(s)
    assert s.deliveries == 1  # the first value
    for v in range(3):
        ch.set(float(v))
        s.collect(1, object())
        s.flush_tick()
    assert s.deliveries == 4
    behind = session(FakeChannel(value=np.arange(4, dtype=np.float64)), encoder, budget=10)
    behind.receive('{"type":"subscribe","pvs":["w"]}')
    for _ in range(3):
        behind.collect(1, object())
        behind.flush_tick()
    drain(behind)  # the first value, then the catch-up with the latest state
    assert behind.conflated == 2 and behind.deliveries == 2
