"""Checking and converting a put value against a channel's type, shared by the backends.

Values are checked in pvwire before anything is sent, so a client gets a precise TypeMismatch
("cannot write 'abc' to ca://X (float64)") instead of the upstream library's generic failure
("Channel write request failed" from libca, "stod" from pvxs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import TypeMismatch

__all__ = ["coerce_put_value"]

_INT_RANGES: dict[str, tuple[int, int]] = {
    name: (int(np.iinfo(name).min), int(np.iinfo(name).max))
    for name in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
}
_FLOATS = ("float32", "float64")


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _mismatch(uri: str, value: object, type_name: str, why: str = "") -> TypeMismatch:
    suffix = f": {why}" if why else ""
    return TypeMismatch(f"cannot write {_show(value)} to {uri} ({type_name}){suffix}")


def _to_int(uri: str, value: object, type_name: str) -> int:
    out: int
    if isinstance(value, bool | int | np.integer):
        out = int(value)
    elif isinstance(value, float | np.floating):
        if not math.isfinite(value) or not float(value).is_integer():
            raise _mismatch(uri, value, type_name, "not an integer")
        out = int(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            out = int(text, 0)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                raise _mismatch(uri, value, type_name) from None
            if not math.isfinite(f) or not f.is_integer():
                raise _mismatch(uri, value, type_name, "not an integer") from None
            out = int(f)
    else:
        raise _mismatch(uri, value, type_name)
    low, high = _INT_RANGES.get(type_name, (-(2**63), 2**64 - 1))
    if not low <= out <= high:
        raise _mismatch(uri, value, type_name, f"out of range [{low}, {high}]")
    return out


def _to_float(uri: str, value: object, type_name: str) -> float:
    if isinstance(value, bool | int | float | np.integer | np.floating):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            raise _mismatch(uri, value, type_name) from None
    raise _mismatch(uri, value, type_name)


def _to_array(uri: str, value: object, type_name: str) -> np.ndarray[Any, Any]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | np.ndarray):
        value = [value]  # a scalar written to an array channel: one element
    try:
        arr = np.asarray(value)
    except (ValueError, OverflowError) as e:  # ragged lists and the like
        raise _mismatch(uri, value, type_name, str(e)) from None
    dtype = np.dtype(type_name)
    ints = _exact_ints(value) if dtype.kind in "iu" and arr.dtype.kind in "fO" else None
    if ints is not None:
        # Python ints beyond int64 (uint64 up to 2^64-1) make numpy pick float64 or object,
        # which would round them: check the range exactly, then build the array in its dtype.
        low, high = _INT_RANGES[type_name]
        if ints and (min(ints) < low or max(ints) > high):
            raise _mismatch(uri, value, type_name, f"out of range [{low}, {high}]")
        return np.array(ints, dtype=dtype)
    if arr.ndim > 1:
        arr = arr.reshape(-1)
    if arr.dtype.kind in "USO":
        try:
            arr = arr.astype(np.float64)
        except (ValueError, TypeError):
            raise _mismatch(uri, value, type_name) from None
    if arr.dtype.kind not in "biuf":
        raise _mismatch(uri, value, type_name)
    if dtype.kind in "iu" and arr.size:
        if arr.dtype.kind == "f" and not bool(np.all(np.mod(arr, 1) == 0)):
            raise _mismatch(uri, value, type_name, "not integers")
        low, high = _INT_RANGES[type_name]
        if arr.min() < low or arr.max() > high:
            raise _mismatch(uri, value, type_name, f"out of range [{low}, {high}]")
    # One bulk conversion (no per-element Python work); no copy when the dtype already matches.
    return arr.astype(dtype, copy=False)


def _exact_ints(value: object) -> list[int] | None:
    """`value` as a list of Python ints if it is a sequence of integers, else None."""
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        return None
    out: list[int] = []
    for x in value:
        if not isinstance(x, int | np.integer) or isinstance(x, bool):
            return None
        out.append(int(x))
    return out


def _to_enum(uri: str, value: object, choices: Sequence[str]) -> int:
    if isinstance(value, str):
        if value in choices:
            return list(choices).index(value)
        text = value.strip()
        if not text.lstrip("-").isdigit():
            labels = ", ".join(repr(c) for c in choices)
            raise TypeMismatch(
                f"cannot write {_show(value)} to {uri} (enum): valid labels are {labels}"
            )
        value = int(text)
    index = _to_int(uri, value, "enum")
    if not 0 <= index < max(len(choices), 1):
        labels = ", ".join(f"{i} {c!r}" for i, c in enumerate(choices))
        raise TypeMismatch(f"cannot write {_show(value)} to {uri} (enum): valid: {labels}")
    return index


def coerce_put_value(
    uri: str,
    value: object,
    type_name: str,
    is_array: bool,
    choices: Sequence[str] | None,
) -> Any:
    """`value` converted for a channel of metadata type `type_name`, or TypeMismatch.

    Enums take an index or a label (label -> index through `choices`); numeric channels take
    numbers or numeric strings; arrays take a sequence or numpy array, converted in bulk.
    Types this function does not know (struct, table) pass through unchanged.
    """
    if type_name == "enum":
        return _to_enum(uri, value, choices or ())
    if type_name == "string":
        if is_array:
            if isinstance(value, str):
                return [value]
            if isinstance(value, Sequence | np.ndarray):
                return [str(v) for v in value]
            raise _mismatch(uri, value, "string[]")
        if isinstance(value, str):
            return value
        if isinstance(value, bool | int | float | np.integer | np.floating):
            return str(value)
        raise _mismatch(uri, value, type_name)
    if type_name == "bool" and not is_array:
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        out = _to_int(uri, value, "uint8")
        if out not in (0, 1):
            raise _mismatch(uri, value, type_name)
        return bool(out)
    if type_name in _INT_RANGES or type_name in _FLOATS or type_name == "bool":
        if is_array:
            return _to_array(uri, value, "uint8" if type_name == "bool" else type_name)
        if type_name in _FLOATS:
            return _to_float(uri, value, type_name)
        return _to_int(uri, value, type_name)
    return value
