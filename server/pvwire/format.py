"""Values formatted for people, the way caget/camonitor and display managers show them."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .model import Metadata, Value

__all__ = ["format_value"]

ARRAY_PREVIEW = 5


def format_value(value: Value, meta: Metadata) -> str | None:
    """Precision and units applied; enums as their label; arrays as a short preview."""
    if value is None:
        return None
    if meta.choices is not None and isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value < len(meta.choices):
            return meta.choices[value]
        return f"{value} (no label)"
    if isinstance(value, np.ndarray):
        flat = value.ravel()
        items = " ".join(_number(x, meta.precision) for x in flat[:ARRAY_PREVIEW].tolist())
        more = " ..." if flat.size > ARRAY_PREVIEW else ""
        shape = "x".join(str(d) for d in value.shape)
        return _with_units(f"[{items}{more}] ({shape})", meta)
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return _with_units(_number(value, meta.precision), meta)
    if isinstance(value, list):
        return " ".join(str(x) for x in value)
    return str(value)


def _number(x: Any, precision: int | None) -> str:
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        if precision is not None and 0 <= precision <= 17:
            return f"{x:.{precision}f}"
        return f"{x:g}"
    return str(x)


def _with_units(text: str, meta: Metadata) -> str:
    return f"{text} {meta.units}" if meta.units else text
