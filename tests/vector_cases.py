"""The golden vector cases (protocol/vectors/) and how to build each one with the server encoder.

`python -m tests.vector_cases` rewrites protocol/vectors/*.bin and *.json from these cases.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from pvwire.model import ALARM, CONN, FULL, META, TIME, VALUE
from pvwire.wire import codec as wire

VECTORS = Path(__file__).resolve().parent.parent / "protocol" / "vectors"

T = {"seconds": 1700000000, "nanoseconds": 123456789}
META_FLOAT = {
    "type": "float64", "count": 1, "description": "Beam current", "units": "mA", "precision": 3,
    "form": "Default", "display": [0.0, 500.0], "control": [0.0, 450.0],
    "alarm": [{"$float": "NaN"}, 480.0], "warning": [{"$float": "NaN"}, 450.0], "writable": False,
}  # fmt: skip
META_ENUM = {"type": "enum", "count": 1, "description": "Mode", "choices": ["Off", "On", "Auto"],
             "writable": True}  # fmt: skip
DTYPE_SAMPLES: dict[str, list[Any]] = {
    "int8": [-128, 0, 127], "uint8": [0, 1, 255], "int16": [-32768, 0, 32767],
    "uint16": [0, 1, 65535], "int32": [-2147483648, 0, 2147483647], "uint32": [0, 1, 4294967295],
    "int64": [-(2**63), 0, 2**63 - 1], "uint64": [0, 1, 2**64 - 1],
    "float32": [-1.5, 0.0, 3.25], "float64": [-1.5, 0.0, 1e300],
}  # fmt: skip


def nd(dtype: str, data: list[Any], dims: list[int] | None = None) -> dict[str, Any]:
    return {"$ndarray": {"dtype": dtype, "dims": dims or [len(data)], "data": data}}


def e(sid: int, mask: int, **fields: Any) -> dict[str, Any]:
    return {"sid": sid, "mask": mask, **fields}


def history(
    att: int,
    sid: int,
    resolution: int,
    t: list[int],
    value: list[Any],
    severity: list[int],
    status: list[int],
    gap: list[int],
    low: list[Any] | None = None,
    high: list[Any] | None = None,
    elements: int = 0,
    reason: str | None = None,
) -> dict[str, Any]:
    """A HISTORY message; `elements` > 0: an array channel's, `value`, `min` and `max` flattened
    rows of that many elements (dims [rows, elements]); `reason`: why its rows end in a gap."""
    dims = [len(t), elements] if elements else None
    message = {"kind": "HISTORY", "att": att, "sid": sid, "resolution": resolution,
               "t": nd("int64", t), "value": nd("float64", value, dims),
               "min": nd("float64", low or value, dims), "max": nd("float64", high or value, dims),
               "severity": nd("uint8", severity), "status": nd("uint16", status),
               "gap": nd("uint8", gap)}  # fmt: skip
    return message if reason is None else {**message, "reason": reason}


def data(seq: int, *groups: tuple[int, list[dict[str, Any]]]) -> dict[str, Any]:
    return {"kind": "DATA", "seq": seq, "groups": [{"att": a, "entries": es} for a, es in groups]}


CASES: list[tuple[str, str, str, dict[str, Any]]] = [
    ("hello", "server", "HELLO, the first message on every connection",
     {"kind": "HELLO", "version": 1, "server": "pvwire/0.1.0 test", "tick_ms": 20,
      "heartbeat_ms": 15000, "max_in_bytes": 65536}),
    ("attached", "server", "ATTACHED: att 1 for a token of two channels",
     {"kind": "ATTACHED", "req": 7, "att": 1, "ids": ["ca://X:TEMP", "sim://sine"]}),
    ("snapshot", "server", "SNAPSHOT of a float with full metadata, an enum and a string",
     {"kind": "SNAPSHOT", "seq": 1, "att": 1, "entries": [
         e(0, FULL, value=21.5, serial=7, **T, severity=0, status=0, message="",
           metadata=META_FLOAT, state=1, reason=""),
         e(1, FULL, value=2, serial=1, **T, severity=0, status=0, message="",
           metadata=META_ENUM, state=1, reason=""),
         e(2, FULL, value="hello", serial=3, **T, severity=0, status=0, message="",
           metadata={"type": "string", "count": 1, "writable": True}, state=1, reason=""),
     ]}),
    ("snapshot_connecting", "server", "SNAPSHOT of a channel never connected yet: only CONN",
     {"kind": "SNAPSHOT", "seq": 1, "att": 2, "entries": [e(0, CONN, state=0, reason="")]}),
    ("data_float", "server", "DATA: a float64 value and its time",
     data(2, (1, [e(0, VALUE | TIME, value=21.625, serial=8, **T)]))),
    ("data_float_nan", "server", "DATA: a NaN float value",
     data(3, (1, [e(0, VALUE | TIME, value={"$float": "NaN"}, serial=9, **T)]))),
    ("data_int", "server", "DATA: integers, negative, large and small",
     data(4, (1, [e(0, VALUE | TIME, value=-5, serial=10, **T),
                  e(1, VALUE | TIME, value=2**40, serial=1000000, **T)]))),
    ("data_string", "server", "DATA: a string value with non-ASCII text",
     data(5, (1, [e(2, VALUE | TIME, value="Strahl ein \u2014 \u00b5A", serial=4, **T)]))),
    ("data_enum", "server", "DATA: an enum index (labels are in the metadata)",
     data(6, (1, [e(1, VALUE | TIME, value=0, serial=2, **T)]))),
    ("data_alarm", "server", "DATA: value over HIHI, alarm becomes MAJOR/HIHI",
     data(7, (1, [e(0, VALUE | TIME | ALARM, value=490.0, serial=11, **T, severity=2, status=3,
                    message="HIHI")]))),
    ("data_alarm_only", "server", "DATA: alarm alone changed (INVALID, with a PVA message)",
     data(8, (1, [e(0, ALARM, severity=3, status=17, message="UDF")]))),
    ("data_meta_change", "server", "DATA: metadata changed (CA DBE_PROPERTY: new units)",
     data(9, (1, [e(0, META, metadata={**META_FLOAT, "units": "uA"})]))),
    ("data_disconnect", "server", "DATA: the upstream server went away",
     data(10, (1, [e(0, CONN, state=2, reason="IOC disconnected")]))),
    ("data_reconnect", "server", "DATA: connected again, with a fresh value; serial restarted",
     data(11, (1, [e(0, VALUE | TIME | CONN, value=21.0, serial=1, **T, state=1, reason="")]))),
    ("data_failed", "server", "DATA: a channel that cannot be served",
     data(12, (1, [e(3, CONN, state=3, reason="unknown sim kind 'sinus'")]))),
    ("data_not_found", "server", "DATA: no IOC answered for 5 s; the server keeps searching",
     data(13, (1, [e(2, CONN, state=4, reason="not found (no IOC answered for 5 s)")]))),
    ("data_first_value", "server",
     "DATA: a channel's first value carries its alarm, even NO_ALARM with an empty message",
     data(14, (1, [e(0, VALUE | TIME | ALARM, value=1.5, serial=1, **T, severity=0, status=0,
                     message="")]))),
    *[(f"data_ndarray_{dt}", "server", f"DATA: a 1-D {dt} array",
       data(20, (1, [e(0, VALUE | TIME, value=nd(dt, xs), serial=5, **T)])))
      for dt, xs in DTYPE_SAMPLES.items()],
    ("data_ndarray_image", "server", "DATA: a 2x3 uint16 image, dims [height, width]",
     data(21, (1, [e(0, VALUE | TIME, value=nd("uint16", [1, 2, 3, 4, 5, 6], [2, 3]), serial=6,
                    **T)]))),
    ("data_ndarray_rgb1", "server",
     "DATA: a 2x2 uint8 RGB1 image, dims [height, width, 3], metadata colorMode RGB1",
     data(21, (1, [e(0, VALUE | TIME | META,
                     value=nd("uint8", [255, 0, 0, 0, 255, 0, 0, 0, 255, 9, 8, 7], [2, 2, 3]),
                     serial=6, **T, metadata={"type": "uint8", "colorMode": "RGB1"})]))),
    ("data_reduced_minmax", "server",
     "DATA: a 10-point float64 waveform reduced to 2 columns (maxColumns, section 4.6)",
     data(21, (1, [e(0, VALUE | TIME | META, value=nd("float64", [-1.0, 0.5, -0.25, 2.0], [4]),
                     serial=9, **T,
                     metadata={"type": "float64",
                               "reduced": {"method": "minmax", "from": [10]}})]))),
    ("data_reduced_subsample", "server",
     "DATA: a 4x5 uint16 image subsampled by 3 to 2x2 (maxPixels, section 4.6)",
     data(21, (1, [e(0, VALUE | TIME | META, value=nd("uint16", [0, 3, 15, 18], [2, 2]),
                     serial=9, **T,
                     metadata={"type": "uint16", "colorMode": "mono",
                               "reduced": {"method": "subsample", "from": [4, 5], "step": 3}})]))),
    ("data_ndarray_empty", "server", "DATA: an empty float64 waveform",
     data(22, (1, [e(0, VALUE | TIME, value=nd("float64", []), serial=7, **T)]))),
    ("data_ndarray_large", "server", "DATA: a 100-point float64 waveform (ext 16 header)",
     data(23, (1, [e(0, VALUE | TIME, value=nd("float64", [i / 4 for i in range(100)]),
                    serial=8, **T)]))),
    ("data_string_array", "server", "DATA: an array of strings",
     data(24, (1, [e(0, VALUE | TIME, value=["a", "bc", ""], serial=2, **T)]))),
    ("data_string_array_empty", "server", "DATA: an empty string array (a STRING waveform, NORD 0)",
     data(24, (1, [e(0, VALUE | TIME, value=[], serial=3, **T)]))),
    ("data_string_array_one", "server", "DATA: a string array of one element (not a str)",
     data(24, (1, [e(0, VALUE | TIME, value=["only"], serial=4, **T)]))),
    ("data_long_string", "server", "DATA: a long string (lsi, NAME.VAL$), str 16 header",
     data(24, (1, [e(0, VALUE | TIME, value="long " * 60 + "\u00b5A", serial=5, **T)]))),
    ("data_int_beyond_2_53", "server", "DATA: int64/uint64 scalars beyond 2^53, exact",
     data(24, (1, [e(0, VALUE | TIME, value=2**64 - 1, serial=1, **T),
                   e(1, VALUE | TIME, value=-(2**63), serial=1, **T),
                   e(2, VALUE | TIME, value=2**53 + 1, serial=1, **T)]))),
    ("data_float_infinity", "server", "DATA: infinities and a float32 maximum as float 64",
     data(24, (1, [e(0, VALUE | TIME, value={"$float": "Infinity"}, serial=6, **T),
                   e(1, VALUE | TIME, value={"$float": "-Infinity"}, serial=6, **T),
                   e(2, VALUE | TIME, value=3.4028234663852886e38, serial=6, **T)]))),
    ("data_struct", "server",
     "DATA: a generic structure: nested map, union (selected member's value or nil), "
     "structure array (array of maps), ndarray and string array fields",
     data(25, (1, [e(0, VALUE | TIME, value={
         "a": 1, "nested": {"m": 1.5, "flag": 1}, "union": 2.5, "empty_union": None,
         "items": [{"q": 1, "w": ["a"]}, {"q": 2, "w": []}],
         "variants": [1, "x", nd("float64", [0.5])],
         "samples": nd("int32", [-1, 2])}, serial=1, **T)]))),
    ("data_table", "server", "DATA: a PVA table as a map of columns",
     data(25, (1, [e(0, VALUE | TIME, value={"name": ["q1", "q2"],
                                             "k1": nd("float64", [0.5, -0.25])}, serial=3,
                    **T)]))),
    ("data_aligned_two_groups", "server",
     "DATA: two groups mixing scalars and arrays; nil items before each array entry put its data "
     "on a multiple of 8 bytes from the message's start (section 3, Padding)",
     data(70000,
          (1, [e(0, VALUE | TIME, value=1.5, serial=3, **T),
               e(1, VALUE | TIME, value=nd("float64", [0.5, -1.0, 2.25]), serial=4, **T),
               e(2, VALUE | TIME, value=nd("uint16", [1, 2, 3, 4, 5, 6], [2, 3]), serial=5,
                 **T)]),
          (300, [e(7, VALUE | TIME, value=nd("int32", [-7, 8]), serial=9, **T),
                 e(8, VALUE | TIME, value=nd("float32", [0.25]), serial=1, **T)]))),
    ("snapshot_aligned", "server",
     "SNAPSHOT of a float64 waveform and a uint8 image with metadata: each array's data padded "
     "to a multiple of 8 bytes (section 3, Padding)",
     {"kind": "SNAPSHOT", "seq": 3, "att": 2, "entries": [
         e(0, VALUE | TIME | META, value=nd("float64", [1.0, 2.0]), serial=2, **T,
           metadata={"type": "float64", "count": 2}),
         e(1, VALUE | META, value=nd("uint8", [1, 2, 3, 4], [2, 2]), serial=1,
           metadata={"type": "uint8", "colorMode": "mono"})]}),
    ("data_two_groups", "server", "DATA: changes for two attachments in one frame",
     data(26, (1, [e(0, VALUE | TIME, value=1.5, serial=12, **T)]),
              (2, [e(0, VALUE | TIME, value=7, serial=99, **T)]))),
    ("data_all_mode", "server", "DATA: ALL mode, three updates of one channel in order",
     data(27, (3, [e(0, VALUE | TIME, value=i, serial=i, **T) for i in (1, 2, 3)]))),
    ("data_many_entries", "server", "DATA: 20 entries (array 16 header), sids up to 300",
     data(28, (1, [e(s, VALUE | TIME, value=float(s), serial=1, **T)
                   for s in [*range(19), 300]]))),
    ("history_points", "server",
     "HISTORY: a channel's recorded updates before its snapshot, with a gap where it was away "
     "(section 2.8); each column's data padded to a multiple of 8 bytes",
     history(1, 0, 0, [1700000000_000000000, 1700000000_100000000, 1700000003_500000000,
                       1700000004_000000000],
             [1.0, 2.0, {"$float": "NaN"}, 0.5], [0, 1, 3, 0], [0, 4, 0, 0], [0, 0, 1, 0])),
    ("history_buckets", "server",
     "HISTORY: 10 s buckets (min, max, last, highest severity) of sid 2, older than the points",
     history(3, 2, 10_000_000_000, [1699999980_000000000, 1699999990_000000000],
             [4.5, 7.0], [0, 2], [0, 0], [0, 0], low=[-1.0, 5.0], high=[5.25, 9.0])),
    ("history_array", "server",
     "HISTORY of an array channel: value, min and max of ndim 2, a row of 3 elements per update, "
     "with a gap row of NaN (section 2.8)",
     history(1, 1, 0, [1700000000_000000000, 1700000000_100000000, 1700000001_000000000],
             [1.0, 2.0, 3.0, 1.5, 2.5, -3.5, *[{"$float": "NaN"}] * 3], [0, 2, 3], [0, 3, 0],
             [0, 0, 1], elements=3)),
    ("history_left_out", "server",
     "HISTORY: the gap row (status 1, left out) that ends a slow reader's backfill of a channel: "
     "its rows from this time to its snapshot were not sent (section 2.8)",
     history(1, 0, 0, [1700000005_000000000], [{"$float": "NaN"}], [3], [1], [1])),
    ("history_refill", "server",
     "HISTORY after a re-attach whose since is just before the rows left out: those rows, then "
     "rows the client has (from its snapshot at 9 s and DATA at 10 s), then a newer one",
     history(1, 0, 0, [1700000005_000000000, 1700000007_000000000, 1700000009_000000000,
                       1700000010_000000000, 1700000011_000000000],
             [5.0, 7.0, 9.0, 10.0, 11.0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0])),
    ("history_seam", "server",
     "HISTORY of updates after buckets: a gap row (status 2, seam) where the whole buckets end, "
     "the updates from there to the first point being in no row (section 2.8)",
     history(1, 0, 0, [1700000000_000000000, 1700000001_500000000, 1700000001_600000000],
             [{"$float": "NaN"}, 4.0, 4.5], [3, 0, 0], [2, 0, 0], [1, 0, 0])),
    ("history_gap_reason", "server",
     "HISTORY: the archive part of a channel could not be read: one gap row (status 3, archive) "
     "at the start, and the message's reason says why (section 2.8)",
     history(1, 0, 0, [1700000000_000000000], [{"$float": "NaN"}], [3], [3], [1],
             reason="the archiver arch.example.org:17668 did not answer within 5 s "
                    "(archive_timeout_s)")),
    ("detached", "server", "DETACHED answering DETACH req 3",
     {"kind": "DETACHED", "req": 3, "att": 1}),
    ("detached_by_server", "server", "DETACHED the server chose (req nil)",
     {"kind": "DETACHED", "req": None, "att": 2}),
    ("error", "server", "ERROR answering a bad DETACH",
     {"kind": "ERROR", "req": 4, "code": 4404, "message": "att 9 is not attached"}),
    ("error_no_req", "server", "ERROR for a message that could not be parsed",
     {"kind": "ERROR", "req": None, "code": 4400,
      "message": "a message must be an array starting with an integer kind"}),
    ("heartbeat", "server", "HEARTBEAT", {"kind": "HEARTBEAT"}),
    ("pong", "server", "PONG echoing a nonce", {"kind": "PONG", "nonce": 12345}),
    ("attach", "client", "ATTACH a token",
     {"kind": "ATTACH", "req": 1, "token": "pvw1.k1.e30.sig"}),
    ("attach_since", "client",
     "ATTACH again after a reconnect, saying per channel the newest backfill row it holds "
     "(ns; 0: none), so that only later rows come (section 2.8)",
     {"kind": "ATTACH", "req": 3, "token": "pvw1.k1.e30.sig",
      "since": [1700000000123456789, 0]}),
    ("detach", "client", "DETACH att 1", {"kind": "DETACH", "req": 2, "att": 1}),
    ("ping", "client", "PING with a nonce", {"kind": "PING", "nonce": 42}),
    ("ping_string_nonce", "client", "PING with a string nonce",
     {"kind": "PING", "nonce": "rtt-1"}),
    ("edge_float_infinity", "server", "DATA: Infinity and -Infinity values",
     data(29, (1, [e(0, VALUE | TIME, value={"$float": "Infinity"}, serial=13, **T),
                   e(1, VALUE | TIME, value={"$float": "-Infinity"}, serial=2, **T)]))),
]  # fmt: skip


# Vectors whose bytes the server's encoder does not produce, built by hand (see
# protocol/vectors/README.md):
# "accept": decoders must read them as `message`; "ignore": clients skip them without error;
# "reject": server->client, both clients refuse them (and close with 1002); client->server, the
# server answers `error` (ERROR 4400 with the req it could read) and keeps the connection.
HandBuilt = tuple[str, str, str, str, dict[str, Any], bytes]


def _p(obj: Any, single_float: bool = False) -> bytes:
    return bytes(msgpack.packb(obj, use_bin_type=True, use_single_float=single_float))


def _nd_ext(code: int, ndim: int, dims: list[int], data: bytes) -> msgpack.ExtType:
    head = bytes([code, ndim]) + b"".join(d.to_bytes(4, "little") for d in dims)
    return msgpack.ExtType(1, head + data)


def _data1(*entries: list[Any]) -> bytes:
    return _p([3, 2, [[1, list(entries)]]])


_T = [T["seconds"], T["nanoseconds"]]
_F64x3 = np.array([1.0, 2.0, 3.0], dtype="<f8").tobytes()
_ATTACH = _p([16, 6, "pvw1.k1.e30.sig"])


def _nested(levels: int) -> Any:
    """`levels` arrays, one inside the other, around the integer 1: [[...[1]...]]."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def _reject(name: str, description: str, data: bytes) -> HandBuilt:
    return (name, "server", description, "reject", {"reason": description}, data)


def _client_reject(name: str, description: str, req: int | None, data: bytes) -> HandBuilt:
    error = {"req": req, "code": 4400}
    return (name, "client", description, "reject", {"reason": description, "error": error}, data)


HAND_BUILT: list[HandBuilt] = [
    ("accept_float32_value", "server", "DATA: a float32 scalar (readers accept float 32 and 64)",
     "accept", {"message": data(2, (1, [e(0, VALUE | TIME, value=1.5, serial=8, **T)]))},
     _p([3, 2, [[1, [[0, 3, 1.5, 8, *_T]]]]], single_float=True)),
    ("accept_ndarray_ndim0", "server", "DATA: an ndarray of ndim 0 holds exactly one element",
     "accept", {"message": data(2, (1, [e(0, VALUE | TIME, value={"$ndarray": {
                                             "dtype": "float64", "dims": [], "data": [2.5]}},
                                         serial=8, **T)]))},
     _data1([0, 3, _nd_ext(9, 0, [], np.array([2.5], "<f8").tobytes()), 8, *_T])),
    ("accept_nil_padding", "server",
     "DATA whose entries array holds nil padding items around scalar entries, with a wider "
     "array header than its count needs (array 16 for 5 items): readers skip the nils",
     "accept", {"message": data(2, (1, [e(0, VALUE | TIME, value=1.5, serial=8, **T),
                                       e(1, VALUE | TIME, value=2.5, serial=9, **T)]))},
     b"\x93\x03\x02\x91\x92\x01\xdc\x00\x05\xc0" + _p([0, 3, 1.5, 8, *_T]) + b"\xc0\xc0"
     + _p([1, 3, 2.5, 9, *_T])),
    ("accept_extra_elements", "server", "HELLO with a trailing element a later version appended",
     "accept", {"message": {"kind": "HELLO", "version": 1, "server": "pvwire/9.9 test",
                            "tick_ms": 20, "heartbeat_ms": 15000, "max_in_bytes": 65536}},
     _p([0, 1, "pvwire/9.9 test", 20, 15000, 65536, "a later field"])),
    ("ignore_unknown_kind", "server", "a kind this version does not know (9): ignored",
     "ignore", {}, _p([9, 1, "from a later minor version"])),
    ("ignore_unknown_kind_high", "server", "a kind this version does not know (99): ignored",
     "ignore", {}, _p([99])),
    ("ignore_unknown_kind_nested", "server",
     "a kind this version does not know (9) with well-formed elements of any shape: ignored, "
     "its elements are not interpreted",
     "ignore", {}, _p([9, {"a": [1, "x", None]}, 2.5, [], {}])),
    _reject("reject_unknown_kind_invalid_utf8",
            "a kind this version does not know (9) holding a str that is not valid UTF-8: an "
            "unknown kind is ignored only when it is well formed (section 1)",
            b"\x92\x09\xa2\xc3\x28"),
    _reject("reject_unknown_kind_bin",
            "a kind this version does not know (9) holding a MessagePack bin (section 1: bin "
            "is not used in any message)", _p([9, b"\x01"])),
    ("accept_data_empty", "server",
     "DATA without groups (a server never sends one; a receiver reads it: it advances seq and "
     "changes nothing)", "accept", {"message": data(2)}, _p([3, 2, []])),
    ("accept_data_empty_group", "server",
     "DATA with a group of no entries (read; it changes nothing)", "accept",
     {"message": data(2, (1, []))}, _p([3, 2, [[1, []]]])),
    ("accept_data_duplicate_groups", "server",
     "DATA with two groups of one att (a server never sends it; a receiver applies them in "
     "order, as if they came in two DATA)", "accept",
     {"message": data(2, (1, [e(0, VALUE | TIME, value=1.5, serial=8, **T)]),
                         (1, [e(0, VALUE | TIME, value=2.5, serial=9, **T)]))},
     _p([3, 2, [[1, [[0, 3, 1.5, 8, *_T]]], [1, [[0, 3, 2.5, 9, *_T]]]]])),
    ("accept_nil_padding_edges", "server",
     "SNAPSHOT whose entries array has nil items before its first entry and after its last: "
     "padding may stand anywhere in the array", "accept",
     {"message": {"kind": "SNAPSHOT", "seq": 1, "att": 1,
                  "entries": [e(0, CONN, state=0, reason="")]}},
     _p([2, 1, 1, [None, None, [0, 16, 0, ""], None]])),
    ("accept_value_depth_64", "server",
     "DATA: a value of 64 nested arrays (the most a value may hold, section 4)", "accept",
     {"message": data(2, (1, [e(0, VALUE, value=_nested(64), serial=1)]))},
     _data1([0, 1, _nested(64), 1])),
    _reject("reject_value_depth_65", "a value of 65 nested arrays (section 4: at most 64)",
            _data1([0, 1, _nested(65), 1])),
    _reject("reject_metadata_key_type",
            "metadata whose known key `units` is an integer, not a str (section 5)",
            _data1([0, 8, {"units": 5}])),
    _reject("reject_metadata_writable_type",
            "metadata whose known key `writable` is the integer 1, not a bool (section 5)",
            _data1([0, 8, {"writable": 1}])),
    _reject("reject_reserved_mask_bit", "entry mask has reserved bit 5 set",
            _data1([0, 33, 1.5, 8])),
    _reject("reject_entry_too_short", "entry of mask 3 (VALUE|TIME) with 5 elements, not 6",
            _data1([0, 3, 1.5, 8, T["seconds"]])),
    _reject("reject_entry_too_long", "entry of mask 1 (VALUE) with 5 elements, not 4",
            _data1([0, 1, 1.5, 8, 0])),
    _reject("reject_ndarray_length", "ndarray dims [3] of float64 with 16 data bytes, not 24",
            _data1([0, 1, _nd_ext(9, 1, [3], _F64x3[:16]), 8])),
    _reject("reject_ndarray_dtype", "ndarray dtype code 10 (known: 0-9)",
            _data1([0, 1, _nd_ext(10, 1, [3], _F64x3), 8])),
    _reject("reject_ndarray_dims_truncated", "ndarray of ndim 2 with one dim in its header",
            _data1([0, 1, msgpack.ExtType(1, bytes([9, 2]) + (3).to_bytes(4, "little")), 8])),
    _reject("reject_unknown_ext", "MessagePack ext type 2 (only 1, ndarray, is defined)",
            _data1([0, 1, msgpack.ExtType(2, b"\x00"), 8])),
    _reject("reject_bool_value", "a boolean value (booleans travel as integers 0/1)",
            _data1([0, 1, True, 8])),
    _reject("reject_bin_value", "a MessagePack bin value (numeric arrays travel as ndarray ext)",
            _data1([0, 1, b"\x01\x02", 8])),
    _reject("reject_map_key_not_string", "a structure value with an integer map key",
            _data1([0, 1, {1: 2.5}, 8])),
    _reject("reject_invalid_utf8", "a str that is not valid UTF-8",
            b"\x94\x05\x01\xcd\x11\x34\xa2\xc3\x28"),
    _reject("reject_trailing_bytes", "HEARTBEAT followed by one more byte",
            _p([6]) + b"\xc0"),
    _reject("reject_truncated", "DATA cut short in its entry", _data1([0, 3, 1.5, 8, *_T])[:-3]),
    _reject("reject_not_array", "a map instead of an array", _p({"kind": 6})),
    _reject("reject_kind_not_uint", "kind -1", _p([-1])),
    _reject("reject_missing_field", "ERROR with 3 elements, not 4", _p([5, 4, 4404])),
    _reject("reject_nanoseconds_range", "entry nanoseconds 10^9",
            _data1([0, 2, T["seconds"], 1_000_000_000])),
    _reject("reject_severity_range", "entry severity 4 (0-3)", _data1([0, 4, 4, 0, ""])),
    _reject("reject_history_array_dims",
            "HISTORY whose value has dims [2, 3] but min [2, 2] (value, min and max share dims)",
            _p([8, 1, 0, 0, [
                _nd_ext(6, 1, [2], np.array([1, 2], "<i8").tobytes()),
                _nd_ext(9, 2, [2, 3], np.arange(6.0).astype("<f8").tobytes()),
                _nd_ext(9, 2, [2, 2], np.arange(4.0).astype("<f8").tobytes()),
                _nd_ext(9, 2, [2, 3], np.arange(6.0).astype("<f8").tobytes()),
                _nd_ext(1, 1, [2], bytes(2)), _nd_ext(3, 1, [2], bytes(4)),
                _nd_ext(1, 1, [2], bytes(2))]])),
    _reject("reject_history_reason_not_string",
            "HISTORY whose reason (its sixth element) is a number, not a string or nil",
            _p([8, 1, 0, 0, [
                _nd_ext(6, 1, [1], np.array([1], "<i8").tobytes()),
                *[_nd_ext(9, 1, [1], np.array([np.nan]).astype("<f8").tobytes())] * 3,
                _nd_ext(1, 1, [1], bytes([3])), _nd_ext(3, 1, [1], bytes(2)),
                _nd_ext(1, 1, [1], bytes([1]))], 5])),
    _reject("reject_metadata_not_map", "entry metadata an array, not a map",
            _data1([0, 8, ["units", "mA"]])),
    _reject("reject_group_extra_element", "DATA group [att, entries, 0] (groups are pairs)",
            _p([3, 2, [[1, [], 0]]])),
    _reject("reject_pong_nonce_float", "PONG nonce 1.5 (nonces are integers or strings)",
            _p([7, 1.5])),
    ("client_accept_extra_elements", "client",
     "ATTACH with since nil (not said) and a trailing element: read as ATTACH",
     "accept", {"message": {"kind": "ATTACH", "req": 9, "token": "pvw1.k1.e30.sig"}},
     _p([16, 9, "pvw1.k1.e30.sig", None, "a later field"])),
    _client_reject("client_reject_attach_since_negative",
                   "ATTACH whose since holds a negative time", 5,
                   _p([16, 5, "pvw1.k1.e30.sig", [1, -1]])),
    _client_reject("client_reject_unknown_kind", "kind 99 with req 7", 7, _p([99, 7])),
    _client_reject("client_reject_token_not_string", "ATTACH whose token is an integer", 5,
                   _p([16, 5, 42])),
    _client_reject("client_reject_trailing_bytes", "ATTACH followed by one more byte", 6,
                   _ATTACH + b"\xc0"),
    _client_reject("client_reject_detach_short", "DETACH without its att", 8, _p([17, 8])),
    _client_reject("client_reject_req_negative", "ATTACH with req -1 (no readable req)", None,
                   _p([16, -1, "t"])),
    _client_reject("client_reject_not_array", "a map instead of an array", None,
                   _p({"kind": 16})),
    _client_reject("client_reject_truncated", "ATTACH cut short", None, _ATTACH[:-2]),
    _client_reject("client_reject_ping_map_nonce", "PING whose nonce is a map (of str keys)",
                   None, _p([18, {"a": 2}])),
    _client_reject("client_reject_map_key_not_string",
                   "ATTACH with a trailing element (allowed) holding a map with an integer key "
                   "(every map has str keys, section 1): req still read", 4,
                   _p([16, 4, "pvw1.k1.e30.sig", None, {1: 2}])),
    _client_reject("client_reject_invalid_utf8",
                   "ATTACH whose token is a str that is not valid UTF-8: req still read", 3,
                   b"\x93\x10\x03\xa2\xc3\x28"),
]  # fmt: skip


def from_json(v: Any) -> Any:
    """A vector's JSON value as the Python value the encoder takes."""
    if isinstance(v, dict):
        if "$ndarray" in v:
            a = v["$ndarray"]
            dt = np.dtype(a["dtype"]).newbyteorder("<")
            return np.array([from_json(x) for x in a["data"]], dtype=dt).reshape(a["dims"])
        if "$float" in v:
            return float(v["$float"].replace("Infinity", "inf"))
        return {k: from_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [from_json(x) for x in v]
    return v


def _entries(ens: list[dict[str, Any]]) -> wire.Entries:
    bodies = []
    for en in ens:
        fields = {k: from_json(x) for k, x in en.items() if k not in ("sid", "mask")}
        bodies.append(wire.encode_entry_body(en["mask"], **fields))
    return wire.encode_entries([en["sid"] for en in ens], bodies)


def build(msg: dict[str, Any]) -> bytes:
    """The bytes of a vector's message, from the server's encoder (or msgpack for client kinds)."""
    k = msg["kind"]
    if k == "HELLO":
        return wire.encode_hello(msg["server"], msg["tick_ms"], msg["heartbeat_ms"],
                                 msg["max_in_bytes"])  # fmt: skip
    if k == "ATTACHED":
        return wire.encode_attached(msg["req"], msg["att"], msg["ids"])
    if k == "SNAPSHOT":
        return wire.encode_snapshot(msg["seq"], msg["att"], _entries(msg["entries"]))
    if k == "DATA":
        groups = [(g["att"], _entries(g["entries"])) for g in msg["groups"]]
        return wire.encode_data(msg["seq"], groups)
    if k == "DETACHED":
        return wire.encode_detached(msg["req"], msg["att"])
    if k == "ERROR":
        return wire.encode_error(msg["req"], msg["code"], msg["message"])
    if k == "HISTORY":
        columns = [from_json(msg[name]) for name, _ in wire.HISTORY_COLUMNS]
        return wire.encode_history(msg["att"], msg["sid"], msg["resolution"], columns,
                                   msg.get("reason"))  # fmt: skip
    if k == "HEARTBEAT":
        return wire.HEARTBEAT
    if k == "PONG":
        return wire.encode_pong(msg["nonce"])
    # Client kinds: the reference bytes are plain msgpack of the positional array.
    layout: dict[str, tuple[int, *tuple[str, ...]]]
    layout = {"ATTACH": (16, "req", "token"), "DETACH": (17, "req", "att"), "PING": (18, "nonce")}
    code, *names = layout[k]
    since = [msg["since"]] if "since" in msg else []  # ATTACH's optional field
    return bytes(msgpack.packb([code, *(msg[n] for n in names), *since]))


def write_all() -> None:
    VECTORS.mkdir(parents=True, exist_ok=True)
    for old in VECTORS.glob("*.bin"):
        old.unlink()
    for old in VECTORS.glob("*.json"):
        old.unlink()
    for name, direction, description, msg in CASES:
        doc = {"name": name, "description": description, "direction": direction, "message": msg}
        (VECTORS / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        (VECTORS / f"{name}.bin").write_bytes(build(msg))
    for name, direction, description, expect, extra, raw in HAND_BUILT:
        doc = {"name": name, "description": description, "direction": direction,
               "expect": expect, **extra}  # fmt: skip
        (VECTORS / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        (VECTORS / f"{name}.bin").write_bytes(raw)


def _check_json_safe() -> None:
    for _, _, _, msg in CASES:
        json.dumps(msg, allow_nan=False)  # NaN must be spelled {"$float": "NaN"}
    for *_, extra, _ in HAND_BUILT:
        json.dumps(extra, allow_nan=False)
    assert not any(math.isnan(x) for x in [0.0])


if __name__ == "__main__":
    _check_json_safe()
    write_all()
    print(f"wrote {len(CASES) + len(HAND_BUILT)} vectors to {VECTORS}", file=sys.stderr)
