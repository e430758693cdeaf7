"""Distinct upstream channels held per client address, over all its connections and endpoints:
`/stream` attachments, `/pvws/pv` PVs, MJPEG feeds and gets of channels not monitored.

Each such channel is a Channel, a view, an upstream monitor and, for a name no IOC has, a search
that never ends. The bounds of one connection (`max_channels_per_connection`) times an address's
connections let one address hold ten million of them; `max_channels_per_address` bounds what
one address holds, whatever it holds them through. A channel counts once per address however
many of its connections hold it, and for each address that holds it (what others hold changes
nothing of one's own budget). An address counts by its bound key (access/bound_key.py): an
IPv6 client's /64.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..access.bound_key import bound_key

__all__ = ["AddressChannels"]


class AddressChannels:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, dict[str, int]] = {}  # bound key -> channel id -> its holders
        self.refused = 0  # takes refused since the start (metrics)

    def take(self, address: str, ids: Iterable[str]) -> str | None:
        """Hold `ids` for `address`: None, or why not (and then nothing is held)."""
        ids, key = tuple(ids), bound_key(address)
        held = self._held.get(key, {})
        new = {i for i in ids if i not in held}
        if new and len(held) + len(new) > self.limit:
            self.refused += 1
            return (
                f"{key} holds {len(held):,} upstream channels; {len(new):,} more would pass "
                f"its limit of {self.limit:,} (max_channels_per_address)"
            )
        held = self._held.setdefault(key, held)
        for i in ids:
            held[i] = held.get(i, 0) + 1
        return None

    def give_back(self, address: str, ids: Iterable[str]) -> None:
        """`address` holds `ids` once less (each as often as `take` held it)."""
        key = bound_key(address)
        held = self._held.get(key)
        if held is None:
            return
        for i in ids:
            left = held.pop(i, 1) - 1
            if left > 0:
                held[i] = left
        if not held:
            del self._held[key]

    def held_by(self, address: str) -> int:
        """Distinct channels `address` holds now."""
        return len(self._held.get(bound_key(address), ()))
