"""The tick's fan-out to clients of one message per channel (_fanout.c; built by `make`), as
core/tick.py and pvws/session.py do it in Python where it is not built."""

from collections.abc import Callable, Mapping
from typing import Any

RECORD_SLOTS: tuple[str, ...]
"""The slots of a client's record of one channel that `Splicer` reads, in its order."""

CHANNEL_SLOTS: tuple[str, ...]
"""The Channel slots `Splicer` reads, in its order."""

ENTRY_SLOTS: tuple[str, ...]
"""The slots of the shared entry of a channel's state that `Splicer` reads, in its order."""

def collect(
    attachments: Mapping[Any, None],
    touched: list[Any],
    view: Any,
    fallback: Callable[..., bool],
) -> None:
    """Each (client, att) of `attachments` to its client: appended to the client's `collected`
    list slot where its class declares one (the client into `touched` when it was empty), else
    `fallback(client, att, view)`, its truth putting the client into `touched`."""

class Splicer:
    """Reads the slots of instances of exactly `record_cls`, `channel_cls` and `entry_cls`."""

    def __init__(
        self,
        record_cls: type,
        channel_cls: type,
        entry_cls: type,
        connected: object,
        value_bit: int,
    ) -> None: ...
    def splice(
        self,
        atts: list[int],
        records: Mapping[int, Any],
        paced: bool,
        slow: Callable[[int], bytes | str | None],
    ) -> tuple[bytes, int]:
        """The WebSocket frames of `atts`' updates, in order, and how many: each record's plain
        value copied from its entry's shared frame, anything else `slow(att)`'s."""
