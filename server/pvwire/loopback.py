"""The EPICS loopback-only network settings, read from the file shipped beside this module.

One source for the Makefile (which includes the same file) and for every process the project
starts: tests, benchmarks, the demo IOC and `pvwire-server serve --loopback`.
"""

from __future__ import annotations

import os
from functools import cache
from importlib import resources

__all__ = ["apply_loopback_env", "loopback_env"]


@cache
def loopback_env() -> dict[str, str]:
    """The settings as a mapping, e.g. {"EPICS_CA_AUTO_ADDR_LIST": "NO", ...}."""
    text = resources.files("pvwire").joinpath("epics-loopback.env").read_text()
    env: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def apply_loopback_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Set the loopback settings in `environ` (default: this process's environment).

    Must run before libca or pvxs create a context: they read the environment once.
    """
    target: dict[str, str] = os.environ if environ is None else environ  # type: ignore[assignment]
    for key, value in loopback_env().items():
        current = target.get(key, "")
        if key.endswith("ADDR_LIST") and current and _only_loopback(current):
            continue  # e.g. 127.0.0.1:25064, a test IOC's private port: already loopback
        target[key] = value
    return target


def _only_loopback(addr_list: str) -> bool:
    hosts = [a.rsplit(":", 1)[0] if a.count(":") == 1 else a for a in addr_list.split()]
    return all(h.startswith("127.") or h == "localhost" for h in hosts)
