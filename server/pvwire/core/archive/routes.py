"""Which archiver holds a channel's past: `--archiver` entries, `URL` for every channel or
`GLOB=URL` for the channels whose id (`ca://SR:BPM1`) or PV name (`SR:BPM1`) matches, the first
that matches wins, as the access rules' first match does.

A list of strings rather than a TOML table: the same entries, in the same order, come from a
flag, a `PVWIRE_ARCHIVERS` variable or a TOML file, and order is what decides."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

__all__ = ["Archiver", "Routes", "pv_name"]

# `GLOB=URL`: the URL is what follows the last `=` before its scheme (a glob may hold `://`).
_ENTRY = re.compile(r"(?:(?P<glob>.+)=)?(?P<url>https?://[^\s=]+)")
# Schemes whose names are EPICS PV names, as an archiver knows them.
_EPICS = ("ca://", "pva://")


@dataclass(frozen=True, slots=True)
class Archiver:
    """One archiver's retrieval URL (`http://arch.example.org:17668/retrieval`) and the glob of
    the channels it serves ("*": every one)."""

    url: str
    glob: str

    @property
    def name(self) -> str:
        """How a reason names it: its host and port, not its whole URL."""
        return self.url.split("://", 1)[1].split("/", 1)[0]


def pv_name(cid: str) -> str:
    """The name an archiver knows a channel by: a CA or PVA channel's PV name, else its id."""
    for scheme in _EPICS:
        if cid.startswith(scheme):
            return cid[len(scheme) :]
    return cid


class Routes:
    def __init__(self, entries: list[str]) -> None:
        self.archivers: list[Archiver] = []
        for entry in entries:
            found = _ENTRY.fullmatch(entry.strip())
            if found is None:
                raise ValueError(
                    f"--archiver {entry!r}: an Archiver Appliance retrieval URL "
                    "(http://host:17668/retrieval), or GLOB=URL"
                )
            url = found.group("url").rstrip("/")
            self.archivers.append(Archiver(url, found.group("glob") or "*"))

    def __bool__(self) -> bool:
        return bool(self.archivers)

    def route(self, cid: str) -> Archiver | None:
        """The archiver of canonical id `cid`, or None."""
        name = pv_name(cid)
        for a in self.archivers:
            if fnmatch.fnmatchcase(cid, a.glob) or fnmatch.fnmatchcase(name, a.glob):
                return a
        return None
