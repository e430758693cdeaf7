"""What each record of tests/dbs/alltypes.db arrives as, over CA and over PVA (PROTOCOL.md 4.4).

`EXPECT[name] = (ca, pva)`, each `(value, metadata type)`, or None where QSRV cannot serve the
record (ENUM arrays: a get fails with QSRV's error; a monitor gets an NTEnum of index 0 instead,
`QSRV_ENUM_ARRAY_MONITOR`). Array values are numpy arrays whose dtype is the one
the client must see; floats may be NaN. Values the records start with, before any put.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Expected = tuple[Any, str]

LONG_LSO = (
    "a long string over CA's forty-character limit, read whole over PVA and through NAME.VAL$"
)
LONG_LSI = "another string longer than forty characters, with non-ASCII: µA"
STRING39 = "thirty-nine characters, the CA maximum"


def a(values: list[Any], dtype: str) -> np.ndarray[Any, Any]:
    return np.array(values, dtype=dtype)


def _ca_cut(text: str) -> str:
    """CA DBR_STRING: at most 39 bytes (the IOC cuts the text)."""
    return text.encode()[:39].decode("utf-8", "ignore")


EXPECT: dict[str, tuple[Expected | None, Expected | None]] = {
    "AT:AI": ((1.25, "float64"), (1.25, "float64")),
    "AT:AO": ((2.5, "float64"), (2.5, "float64")),
    "AT:AO:NAN": ((float("nan"), "float64"), (float("nan"), "float64")),
    "AT:AO:INF": ((float("inf"), "float64"), (float("inf"), "float64")),
    "AT:AO:NINF": ((float("-inf"), "float64"), (float("-inf"), "float64")),
    "AT:BI": ((1, "enum"), (1, "enum")),
    "AT:BO": ((0, "enum"), (0, "enum")),
    "AT:MBBI:EMPTY": ((3, "enum"), (3, "enum")),
    "AT:MBBO:EMPTY": ((5, "int32"), (5, "uint16")),
    "AT:MBBI:16": ((15, "enum"), (15, "enum")),
    "AT:MBBO:16": ((15, "enum"), (15, "enum")),
    "AT:LSO": ((_ca_cut(LONG_LSO), "string"), (LONG_LSO, "string")),
    "AT:LSI": ((_ca_cut(LONG_LSI), "string"), (LONG_LSI, "string")),
    "AT:LSO.VAL$": ((LONG_LSO, "string"), (LONG_LSO, "string")),
    "AT:LSI.VAL$": ((LONG_LSI, "string"), (LONG_LSI, "string")),
    # CA has no 64-bit integer: the IOC serves DOUBLE and rounds beyond 2^53.
    "AT:INT64IN": ((9007199254740992.0, "float64"), (2**53 + 1, "int64")),
    "AT:INT64OUT": ((float(-(2**63) + 1), "float64"), (-(2**63) + 1, "int64")),
    "AT:WF:TEXT": (
        (a(list(b"text in a CHAR waveform\0"), "uint8"), "uint8"),
        (a(list(b"text in a CHAR waveform\0"), "int8"), "int8"),
    ),
    "AT:WF:STRING1": ((["only"], "string"), (["only"], "string")),
    "AT:WF:STRING0": (([], "string"), ([], "string")),
    "AT:COMPRESS": ((a([], "float64"), "float64"), (a([], "float64"), "float64")),
    "AT:HISTOGRAM": ((a([0] * 4, "float64"), "float64"), (a([0] * 4, "uint32"), "uint32")),
    "AT:MBBIDIRECT": ((5, "int32"), (5, "int32")),
    "AT:MBBODIRECT": ((165, "int32"), (165, "int32")),
    "AT:CALC": ((3.0, "float64"), (3.0, "float64")),
    "AT:CALCOUT": ((7.0, "float64"), (7.0, "float64")),
    "AT:SEL": ((20.0, "float64"), (20.0, "float64")),
    "AT:LONGIN": ((-123456, "int32"), (-123456, "int32")),
    "AT:LONGOUT": ((2147483647, "int32"), (2147483647, "int32")),
    "AT:STRINGIN": (("in text", "string"), ("in text", "string")),
    "AT:STRINGOUT": (("out text", "string"), ("out text", "string")),
    "AT:DFANOUT": ((2.5, "float64"), (2.5, "float64")),
    "AT:PERMISSIVE": ((3, "int32"), (3, "uint16")),
    "AT:SEQ": ((4, "int32"), (4, "int32")),
    "AT:PRINTF": (("v=5", "string"), ("v=5", "string")),
}

# FTVL -> (waveform INP, aai INP, CA dtype, PVA dtype); subArray holds waveform[1:3], aao is empty.
FTVLS: dict[str, tuple[list[Any], list[Any], str, str]] = {
    "CHAR": ([-128, 0, 127], [-1, 2], "uint8", "int8"),
    "UCHAR": ([0, 255, 1], [7, 8], "uint8", "uint8"),
    "SHORT": ([-32768, 0, 32767], [-3, 4], "int16", "int16"),
    "USHORT": ([0, 65535, 1], [5, 6], "int32", "uint16"),
    "LONG": ([-(2**31), 0, 2**31 - 1], [-7, 8], "int32", "int32"),
    "ULONG": ([0, 2**32 - 1, 1], [9, 10], "float64", "uint32"),
    "INT64": ([-(2**63) + 1, 2**53 + 1, 2**63 - 1], [-11, 12], "float64", "int64"),
    "UINT64": ([0, 2**63 - 1, 2**53 + 1], [13, 14], "float64", "uint64"),
    "FLOAT": ([1.5, -0.25, 3e38], [0.5, 1.5], "float32", "float32"),
    "DOUBLE": ([1e300, -2.5, 5e-324], [0.125, -0.5], "float64", "float64"),
    "STRING": (["a", "", STRING39], ["x", "yz"], "string", "string"),
    "ENUM": ([0, 1, 65535], [2, 3], "uint16", ""),
}


def _array(values: list[Any], dtype: str) -> Any:
    if dtype == "string":
        return list(values)
    if dtype == "uint8" and any(v < 0 for v in values):
        return np.array(values, dtype="int8").view("uint8")  # CA CHAR is unsigned
    return np.array(values, dtype="float64" if dtype == "float64" else dtype).astype(dtype)


for _ftvl, (_wf, _aai, _ca, _pva) in FTVLS.items():
    for _rec, _vals in (("WF", _wf), ("AAI", _aai), ("AAO", []), ("SA", _wf[1:3])):
        _ca_exp = (_array(_vals, _ca), _ca)
        # QSRV cannot serve ENUM arrays: the channel is FAILED with its reason.
        _pva_exp = (_array(_vals, _pva), _pva) if _pva else None
        EXPECT[f"AT:{_rec}:{_ftvl}"] = (_ca_exp, _pva_exp)

COUNTERS = ("AT:COUNTER1", "AT:COUNTER2")
QSRV_ENUM_ARRAY_MONITOR: Expected = (0, "enum")


def same_value(got: Any, want: Any) -> bool:
    """Exact equality with the type the protocol promises: dtype for arrays, NaN equal NaN."""
    if isinstance(want, np.ndarray):
        return (
            isinstance(got, np.ndarray)
            and got.dtype == want.dtype
            and got.shape == want.shape
            and np.array_equal(got, want, equal_nan=want.dtype.kind == "f")
        )
    if isinstance(want, float):
        if want != want:  # NaN
            return isinstance(got, float) and got != got
        return type(got) is float and got == want
    if isinstance(want, list):
        return isinstance(got, list) and got == want and all(type(x) is str for x in got)
    return type(got) is type(want) and got == want
