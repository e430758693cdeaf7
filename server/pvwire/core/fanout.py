"""The tick's fan-out to clients that take one message per channel (pvws), compiled where built
(core/_fanout.c): a client costs a splice of shared bytes per tick, not Python per channel.

- `COLLECT(attachments, touched, view, fallback)`: Ticker._emit's hand-out of a view's change to
  its attachments. A client class that declares a `collected` list slot is handed the att there
  (no Python call per attachment: with one view per PV per pvws client, this ran once per
  delivered update); any other client through `fallback`, i.e. its own `collect`.
- `Splicer`: one client's messages of a tick as WebSocket frames (pvws/session.py binds it to
  its record, the channel and the encoder's entry): the plain value of each PV copied from the
  frame its channel's state was encoded into once; anything else through the session's Python.

None where the module is not built (`make ext`): the same work then runs in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["COLLECT", "SPLICER"]


Collect = Callable[[Mapping[Any, None], list[Any], Any, Callable[..., bool]], None]

COLLECT: Collect | None = None
SPLICER: type[_fanout.Splicer] | None = None  # bound by pvws/session.py to its classes
try:
    from . import _fanout
except ImportError:  # not built: `make ext` builds it
    pass
else:
    COLLECT = _fanout.collect
    SPLICER = _fanout.Splicer
