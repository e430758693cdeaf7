"""Channel ids: `ca://NAME`, `pva://NAME`, `sim://KIND...`; a bare name takes the default scheme."""

from __future__ import annotations

from collections.abc import Collection

from .errors import BadChannelId
from .limits import MAX_ID_LENGTH

__all__ = ["MAX_ID_LENGTH", "parse_id"]


def parse_id(channel_id: str, default_scheme: str, schemes: Collection[str]) -> tuple[str, str]:
    """(scheme, name) of an id; raises BadChannelId with the reason."""
    text = channel_id.strip()
    if not text:
        raise BadChannelId("empty channel id")
    if len(text) > MAX_ID_LENGTH:
        raise BadChannelId(f"channel id longer than {MAX_ID_LENGTH} characters")
    scheme, sep, name = text.partition("://")
    if not sep:
        scheme, name = default_scheme, text
    if scheme not in schemes:
        known = ", ".join(sorted(schemes))
        raise BadChannelId(f"unknown scheme {scheme!r} in {channel_id!r} (known: {known})")
    if not name or any(c.isspace() for c in name):
        raise BadChannelId(f"{channel_id!r} has no usable name (empty or containing spaces)")
    return scheme, name
