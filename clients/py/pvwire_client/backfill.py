"""A channel's recorded past (HISTORY, PROTOCOL.md section 2.8) as channel states, one per row.

Pure: a decoded :class:`~.wire.History` and the channel's state in, states out. The live state
is never touched: serials, conflation counts and the snapshot baseline stay what the stream
makes them (section 2.5).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from .state import CONNECTED, DISCONNECTED, ChannelState
from .wire import History

__all__ = ["PAST_CHANGED", "past_states"]

NS = 1_000_000_000
PAST_CHANGED = frozenset({"value", "time", "alarm"})
_GAP_CHANGED = frozenset({"connection"})


def past_states(
    history: History, like: ChannelState, after: int = -1
) -> list[tuple[ChannelState, frozenset[str], int]]:
    """(state, changed, t) per row whose time ``t`` (ns) is later than ``after`` (the session
    hands on only rows the reader lacks: every row, by default).

    Each state is a copy of ``like`` (id, metadata, access) with the row's value, time and
    alarm; ``serial`` None (a past row is no stream update). A bucket row gives its last value
    stamped at the bucket's start. A gap row is a DISCONNECTED state with no value, its reason
    the message's when the server said why (the archive part is missing). An array
    channel's row is a float64 ndarray of its elements (a view of the message's column)."""
    out = []
    frames = history.value.ndim == 2
    t, severity, status, gap = (
        history.t.tolist(),
        history.severity.tolist(),
        history.status.tolist(),
        history.gap.tolist(),
    )
    value: Sequence[Any] = list(history.value) if frames else history.value.tolist()
    for i, ti in enumerate(t):
        if ti <= after:
            continue
        state = copy.copy(like)
        state.serial, state.conflated = None, 0
        state.seconds, state.nanoseconds = divmod(ti, NS)
        if gap[i]:
            # The message's reason belongs to its last row: the part the server could not have.
            why = history.reason if history.reason and i == len(t) - 1 else "history gap"
            state.value, state.state, state.reason = None, DISCONNECTED, f"no data ({why})"
            out.append((state, _GAP_CHANGED, ti))
            continue
        v = value[i]
        if frames:
            state.value = v
        else:
            state.value = int(v) if v.is_integer() and _integral(like) else v
        state.severity, state.status, state.message = severity[i], status[i], ""
        state.state, state.reason = CONNECTED, ""
        out.append((state, PAST_CHANGED, ti))
    return out


def _integral(like: ChannelState) -> bool:
    """History holds float64: an integer or enum channel's values come back as integers."""
    kind = like.metadata.get("type")
    return isinstance(kind, str) and ("int" in kind or kind == "enum")
