"""One PV of one `/pvws/pv` client: what the host opened for it and what the client was sent,
in one record per PV (`Pv`), held by one table (`PvTable`) that the session, the hub (through
wire/attached.py) and the inspection pages all read."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..model import Metadata
from ..wire.tokens import Claims
from .encoder import ChannelState, Entry

__all__ = ["Opened", "Pv", "PvSource", "PvTable", "PvwsRefused"]


class PvSource(Protocol):
    """A one-channel view (core/view.py)."""

    @property
    def channels(self) -> Sequence[ChannelState]: ...


@dataclass(frozen=True, slots=True)
class Opened:
    view: PvSource
    claims: Claims  # the identity it was opened for: the hub checks it again when rules change
    may_write: bool  # the access rules let this identity write the channel


class PvwsRefused(Exception):
    """A PV name the host cannot open (bad name, not readable by this identity)."""


class Pv:
    """One subscribed PV of one client, and what that client has been sent of it."""

    __slots__ = (
        "array",
        "att",
        "ch",
        "claims",
        "entry",
        "failure",
        "image",
        "level",
        "meta",
        "name",
        "readonly",
        "severity",
        "shown",
        "view",
        "writes",
    )

    def __init__(self, name: str, att: int, opened: Opened) -> None:
        self.name = name
        self.att = att
        self.view = opened.view
        self.claims = opened.claims
        self.ch = opened.view.channels[0]  # the view's one channel, read at every update
        self.writes = opened.may_write
        self.array = False  # opened at the array rate
        self.image = False  # its value is an image: sent within the connection's image budget
        self.shown = False  # the client has a value (not a disconnect) of it
        self.meta: Metadata | None = None  # metadata last sent; None: nothing sent yet
        self.severity = ""
        self.level = -1  # the severity number of `severity`
        self.entry: Entry | None = None  # the encoder's, once acquired
        self.failure = ""  # the channel's failure last reported with an error ("": none)
        self.readonly: bool | None = None


class PvTable(Mapping[str, Pv]):
    """A connection's PVs by name, in subscription order (as pvws's `list` answers), over the
    session's records by attachment number (`by_att`: how the hub and the tick name them).
    Records enter and leave only through `add` and `remove`, so the two cannot drift apart."""

    __slots__ = ("_by_att", "_by_name", "by_att")

    def __init__(self, by_att: dict[int, Pv]) -> None:
        self._by_name: dict[str, Pv] = {}
        self._by_att = by_att
        self.by_att: Mapping[int, Pv] = by_att

    def __getitem__(self, name: str) -> Pv:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def add(self, pv: Pv) -> None:
        self._by_name[pv.name] = pv
        self._by_att[pv.att] = pv

    def remove(self, pv: Pv) -> None:
        del self._by_name[pv.name]
        del self._by_att[pv.att]
