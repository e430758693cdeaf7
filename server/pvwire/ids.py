"""Channel ids: `ca://NAME`, `pva://NAME`, `sim://KIND...`; a bare name takes the default scheme.

A name may hold spaces: Phoebus and the web UIs written for pvws write `sim://sine(-10, 10, 0.2)`
and `loc://msg("Hello World")`. What protects the server is the length bound and printable text
(no control characters: a newline in an id would split log lines and audit records).
"""

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
    name = name.strip()
    if not name:
        raise BadChannelId(f"{channel_id!r} has no name after {scheme}://")
    if not name.isprintable():
        # isprintable() is False for control characters and for every space but U+0020.
        raise BadChannelId(
            f"{channel_id[:80]!r} holds a control character or a space other than U+0020; "
            f"a channel id is printable text of at most {MAX_ID_LENGTH} characters"
        )
    return scheme, name
