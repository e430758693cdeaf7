"""The tick's routing and splicing (_tick.c; built by `make`), as core/tick.py and core/view.py
do them in Python where it is not built."""

from collections.abc import Callable
from typing import Any

CHANNEL_SLOTS: tuple[str, ...]
"""The Channel slots `Router` reads (and `dirty`, `history`, which it clears), in its order."""

VIEW_SLOTS: tuple[str, ...]
"""The View slots `Router` reads (and `pending`, into which it merges, and `routed`, which it
marks), in its order."""

class Router:
    """Reads and writes the slots of instances of exactly `channel_cls` and `view_cls`."""

    def __init__(self, channel_cls: type, view_cls: type, meta: int) -> None: ...
    def route(
        self,
        dirty: list[Any],
        active: dict[Any, None],
        add_one: Callable[[Any, int, int, Any], bool],
        token: object,
        handed: list[tuple[Any, int]],
    ) -> None:
        """The tick's changes into its views' `pending`: each LATEST view holding a dirty
        channel marked with `token` and merging its channels' masks in one pass; each ALL-mode
        view through add_one, its (view, sid) then appended to `handed`. Every channel's `dirty`
        0 after, or all left set on an error (the views in `handed` had their change)."""
    def forget(self) -> None:
        """The tick is over: let go of its changes, which `splice` uses until then."""
    def splice(self, view: Any, masks: dict[int, int]) -> tuple[bytes, tuple[tuple[int, int], ...]]:
        """A LATEST view's entries without a reduction for `masks`: their bytes, and where each
        entry with an array starts and where its array's data starts."""
