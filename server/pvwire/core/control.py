"""The control plane's operations on channels: get, put (audited), search.

Gets on a monitored channel are answered from the cache, without an upstream round trip (the
Reflective Servers result: a cached get costs nothing upstream).
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import CatalogueFile
from ..errors import PvwireError, WriteDenied
from ..model import ConnState, Reading
from .registry import Registry

__all__ = ["Control", "ControlStats"]

log = logging.getLogger("pvwire.control")
audit = logging.getLogger("pvwire.audit")


@dataclass
class ControlStats:
    cache_gets: int = 0
    upstream_gets: int = 0
    puts: int = 0
    put_errors: int = 0


class Control:
    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self.stats = ControlStats()
        path = registry.settings.catalogue_file
        self.catalogue_file = CatalogueFile(Path(path)) if path else None
        self._file_ids: frozenset[str] = frozenset()  # the file's ids, resolved once per load
        self.poll_catalogue()

    def poll_catalogue(self) -> None:
        """Take in the catalogue file's new contents, if it changed (called every second)."""
        if self.catalogue_file is None or not self.catalogue_file.poll():
            return
        resolved, bad = set(), []
        for cid in self.catalogue_file.ids:
            try:
                resolved.add(self._registry.resolve(cid)[0])
            except PvwireError:
                bad.append(cid)
        if bad:
            log.warning(
                "catalogue file %s: left out %d entries that are not valid channel ids: %s",
                self.catalogue_file.path,
                len(bad),
                ", ".join(repr(b) for b in bad[:5]) + (" ..." if len(bad) > 5 else ""),
            )
        self._file_ids = frozenset(resolved)

    async def get(self, channel_id: str, timeout: float) -> tuple[str, Reading]:
        registry = self._registry
        canonical, backend, name = registry.resolve(channel_id)
        ch = registry.channels.get(canonical)
        reading = ch.reading() if ch is not None else None
        if reading is not None:
            self.stats.cache_gets += 1
        else:
            self.stats.upstream_gets += 1
            reading = await backend.get(name, timeout)
            reading.meta = reading.meta.for_client(registry.writes_allowed(canonical))
        return canonical, reading

    async def put(self, channel_id: str, value: Any, wait: bool, timeout: float, who: str) -> str:
        registry = self._registry
        canonical, backend, name = registry.resolve(channel_id)
        ch = registry.channels.get(canonical)
        old = ch.value if ch is not None and ch.state == ConnState.CONNECTED else "<not cached>"
        self.stats.puts += 1
        result = "ok"
        try:
            if not registry.writes_allowed(canonical):
                raise WriteDenied(
                    f"writes to {canonical} are not allowed by this server's write rules"
                    + ("" if registry.settings.write_rules else " (writes are disabled)")
                )
            await backend.put(name, value, wait, timeout)
        except PvwireError as exc:
            self.stats.put_errors += 1
            result = f"{exc.code}: {exc}"
            raise
        finally:
            audit.info(
                "put who=%s channel=%s old=%s new=%s wait=%s result=%s",
                who,
                canonical,
                _short(old),
                _short(value),
                wait,
                result,
            )
        return canonical

    def search(self, pattern: str, limit: int) -> list[str]:
        """Glob over the catalogue, active channels and sim kinds; a pattern without a scheme
        also matches names under any scheme."""
        registry = self._registry
        candidates: set[str] = set(registry.channels) | self._file_ids
        for cid in registry.settings.catalogue:
            try:
                candidates.add(registry.resolve(cid)[0])
            except PvwireError:
                log.warning("catalogue entry %r is not a valid channel id", cid)
        for scheme, backend in registry.backends.items():
            candidates.update(f"{scheme}://{name}" for name in backend.names())
        has_scheme = "://" in pattern
        found = sorted(
            cid
            for cid in candidates
            if fnmatch.fnmatchcase(cid, pattern)
            or (not has_scheme and fnmatch.fnmatchcase(cid.partition("://")[2], pattern))
        )
        return found[: max(0, limit)]


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
