"""Upstream backends: one per channel-id scheme (ca, pva, sim)."""

from .base import Backend, ChannelSink, Monitor

__all__ = ["Backend", "ChannelSink", "Monitor", "default_backends"]


def default_backends() -> dict[str, Backend]:
    """One backend per scheme. Imported lazily: importing aioca or p4p does no network I/O, but
    their contexts read the EPICS_* environment when first used, so build these after setting it.
    """
    from .ca import CaBackend
    from .pva import PvaBackend
    from .sim import SimBackend

    backends: list[Backend] = [CaBackend(), PvaBackend(), SimBackend()]
    return {b.scheme: b for b in backends}
