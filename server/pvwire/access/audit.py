"""The audit trail: one JSON line per put, allowed or denied, to a file and to `pvwire.audit`;
and the refused authentications (`refusal`, bounded by access/refusals.py), logged as warnings.

Unless CA puts carry the user's name (--forward-identity, docs/ACCESS.md), the IOC sees pvwire's
account for every put; this file is the record of who asked, and of who refused: pvwire's rules
or the IOC's access security (`refused_by`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from pathlib import Path
from typing import IO, Any

import numpy as np

from .identity import Identity

__all__ = ["AuditLog"]

log = logging.getLogger("pvwire.audit")

_SHOWN = 20  # array elements written before the rest is summarised


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        head = value.ravel()[:_SHOWN].tolist()
        return {"dtype": str(value.dtype), "shape": list(value.shape), "head": _jsonable(head)}
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [_jsonable(v) for v in value[:_SHOWN]]
        return [*items, f"... {len(value) - _SHOWN} more"] if len(value) > _SHOWN else items
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)[:200]


class AuditLog:
    def __init__(self, path: str = "") -> None:
        self._file: IO[str] | None = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - kept open

    def put(
        self,
        identity: Identity,
        channel: str,
        old: Any,
        new: Any,
        result: str,
        code: str,
        latency_s: float,
        wait: bool,
        refused_by: str = "",
    ) -> None:
        record = {
            "time": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            "user": identity.user or None,
            "groups": sorted(identity.groups),
            "auth": identity.source,
            "address": identity.address,
            "channel": channel,
            "old": _jsonable(old),
            "new": _jsonable(new),
            "result": result,
            "code": code,
            # Who refused: "pvwire" (its rules and limits) or "ioc" (the IOC's access security).
            "refused_by": refused_by or None,
            "latency_ms": round(latency_s * 1000.0, 3),
            "wait": wait,
        }
        self._write(record, logging.INFO)

    def refusal(self, record: dict[str, Any]) -> None:
        """A refused authentication (or a summary of those left out under a flood): a security
        event, so a warning in the log, where the default level shows it."""
        self._write(record, logging.WARNING)

    def _write(self, record: dict[str, Any], level: int) -> None:
        line = json.dumps(record, separators=(",", ":"), allow_nan=False)
        if self._file is not None:
            try:
                self._file.write(line + "\n")
            except OSError:
                log.exception("cannot write the audit file; the record follows in this log")
        log.log(level, "%s", line)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
