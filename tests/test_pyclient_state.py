"""pvwire_client.state: merging entries, conflated counts, formatting; and the close codes."""

from __future__ import annotations

import datetime as dt
import json
import math
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from pvwire_client import closecodes
from pvwire_client.state import CONNECTED, DISCONNECTED, NOT_FOUND, ChannelState
from pvwire_client.wire import ALARM, CONN, META, TIME, VALUE, Entry

ROOT = Path(__file__).resolve().parents[1]


def full(value: object, serial: int = 1, **meta: object) -> Entry:
    return Entry(0, 31, value, serial, 1700000000, 123456789, 0, 0, "", dict(meta), CONNECTED, "")


def test_snapshot_fills_everything() -> None:
    s = ChannelState("ca://X")
    changed = s.apply(full(21.5, 7, units="mA", precision=3))
    assert changed == {"value", "time", "alarm", "metadata", "connection"}
    assert (s.value, s.serial, s.conflated, s.time) == (21.5, 7, 0, (1700000000, 123456789))
    assert s.connected and s.connection == "CONNECTED"
    assert s.datetime == dt.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=dt.UTC)
    assert s.severity_name == "NO_ALARM" and s.status_name == "NO_ALARM"


def test_delta_changes_only_its_fields() -> None:
    s = ChannelState("ca://X")
    s.apply(full(1.0, 1, units="mA"))
    assert s.apply(Entry(0, VALUE | TIME, 2.0, 2, 1700000001, 0)) == {"value", "time"}
    assert s.apply(Entry(0, ALARM, severity=2, status=3, message="")) == {"alarm"}
    assert (s.severity_name, s.status_name) == ("MAJOR", "HIHI")
    assert s.metadata == {"units": "mA"} and s.value == 2.0
    # an entry repeating what is known changes nothing
    assert s.apply(Entry(0, ALARM, severity=2, status=3, message="")) == set()
    assert s.apply(Entry(0, META, metadata={"units": "A"})) == {"metadata"}
    assert s.metadata == {"units": "A"}  # replaced as a whole


def test_disconnect_keeps_the_last_value() -> None:
    s = ChannelState("ca://X")
    s.apply(full(5, 3))
    assert s.apply(Entry(0, CONN, state=DISCONNECTED, reason="IOC gone")) == {"connection"}
    assert (s.value, s.connected, s.reason, s.connection) == (5, False, "IOC gone", "DISCONNECTED")


def test_not_found_and_unknown_states() -> None:
    s = ChannelState("ca://NOPE")
    s.apply(Entry(0, CONN, state=4, reason="not found (no IOC answered for 5 s)"))
    assert s.connection == "NOT_FOUND" and s.reason.startswith("not found")
    s.apply(Entry(0, CONN, state=99, reason="from a later version"))
    assert s.state == DISCONNECTED and s.connection == "DISCONNECTED"


def test_conflated_counts_serial_jumps() -> None:
    s = ChannelState("sim://x")
    s.apply(full(0, 10))  # joining late is not conflation
    assert s.conflated == 0
    s.apply(Entry(0, VALUE, 1, 11))
    assert s.conflated == 0
    s.apply(Entry(0, VALUE, 2, 15))
    assert s.conflated == 3
    s.apply(Entry(0, VALUE, 3, 17))
    assert s.conflated == 4
    # the same serial again (a snapshot after reconnect with nothing new) is no update
    assert s.apply(full(3, 17)) == set()
    assert s.conflated == 4
    # a lower serial: the upstream monitor was reopened, the count restarts
    s.apply(Entry(0, VALUE, 9, 1))
    assert (s.conflated, s.serial) == (0, 1)


def test_array_values_always_count_as_changed_with_a_new_serial() -> None:
    s = ChannelState("ca://WF")
    a = np.arange(3.0)
    s.apply(Entry(0, VALUE, a, 1))
    assert s.apply(Entry(0, VALUE, a.copy(), 2)) == {"value"}


@pytest.mark.parametrize(
    ("value", "meta", "text"),
    [
        (21.5, {"units": "mA", "precision": 3}, "21.500 mA"),
        (21.5, {}, "21.5"),
        (1e-9, {"precision": 2, "form": "Exponential"}, "1.00e-09"),
        (math.nan, {"precision": 2}, "nan"),
        (7, {"units": "counts"}, "7 counts"),
        (255, {"form": "Hex"}, "0xff"),
        (2, {"choices": ["Off", "On", "Auto"]}, "Auto"),
        (5, {"choices": ["Off", "On"]}, "5"),
        ("héllo", {"units": "x"}, "héllo"),
        (None, {}, "<no value>"),
        (["a", "b"], {}, "a b"),
        (np.array([1.0, 2.5]), {"precision": 1, "units": "V"}, "[1.0 2.5] V"),
        (np.zeros((2, 3), np.uint16), {}, "<uint16 array 2x3>"),
        ({"name": ["q1"], "k1": np.array([0.5])}, {}, '{"name": ["q1"], "k1": [0.5]}'),
    ],
)
def test_format(value: object, meta: dict[str, object], text: str) -> None:
    s = ChannelState("x", value=value, metadata=meta)
    assert s.format() == text


def test_format_long_array_is_shortened() -> None:
    s = ChannelState("x", value=np.arange(100, dtype=np.int32))
    assert s.format() == "[0 1 2 3 4 5 6 7 8 9 ... 90 91 92 93 94 95 96 97 98 99] (100 elements)"


def test_label() -> None:
    s = ChannelState("x", value=1, metadata={"choices": ["Off", "On"]})
    assert s.label == "On"
    assert ChannelState("x", value=1).label is None


# --- close codes -----------------------------------------------------------------------------


def test_close_codes_copy_is_identical() -> None:
    packaged = resources.files("pvwire_client").joinpath("close_codes.json").read_bytes()
    assert packaged == (ROOT / "protocol" / "close_codes.json").read_bytes()


def test_close_code_classes() -> None:
    table = json.loads((ROOT / "protocol" / "close_codes.json").read_text())["codes"]
    for c in table:
        assert closecodes.is_reconnect(c["code"]) == (c["class"] == "reconnect")
        assert closecodes.name(c["code"]) == c["name"]
    # the spec's default for unlisted codes
    assert closecodes.is_reconnect(1002) and closecodes.is_reconnect(3000)
    assert not closecodes.is_reconnect(4001) and not closecodes.is_reconnect(4999)
    assert closecodes.name(4999) == "CODE_4999"


def test_not_found_is_a_state_with_a_reason_and_news() -> None:
    s = ChannelState("ca://NOPE")
    assert not s.has_news  # connecting, no value: nothing to show yet
    assert s.apply(Entry(0, CONN, state=NOT_FOUND, reason="not found (no IOC answered for 5 s)"))
    assert (s.connection, s.connected, s.has_news) == ("NOT_FOUND", False, True)
    assert s.apply(full(1.0)) and s.connected  # it appeared later


def test_metadata_repeating_unset_limits_is_no_change() -> None:
    # An unset limit side is NaN (PROTOCOL.md section 5); NaN != NaN, but a snapshot repeating
    # the same limits changes nothing (section 12), as in the TypeScript client.
    # Each decoded NaN is its own float object, as here (math.nan would compare equal by identity).
    s = ChannelState("ca://X")
    nan = "nan"
    assert s.apply(Entry(0, META, metadata={"display": [float(nan), 10.0], "units": "mA"})) == {
        "metadata"
    }
    assert s.apply(Entry(0, META, metadata={"display": [float(nan), 10.0], "units": "mA"})) == set()
    assert s.apply(Entry(0, META, metadata={"display": [0.0, 10.0], "units": "mA"})) == {"metadata"}
