"""GraphiQL without the internet: strawberry's page, pointed at files this server serves.

Control-room networks are often offline; strawberry's page loads React and GraphiQL from unpkg.
`make` vendors those exact files (same bytes, so the page's integrity hashes still hold) into
`graphiql/` beside this module (server/graphiql/vendor.py); this module rewrites the URLs.
"""

from __future__ import annotations

import re
from pathlib import Path

from strawberry.http.ides import get_graphql_ide_html

__all__ = ["ASSETS", "ASSETS_PATH", "UNPKG", "offline_page", "strawberry_page"]

ASSETS = Path(__file__).parent.parent / "graphiql"  # server/pvwire/graphiql
ASSETS_PATH = "/graphiql-assets"
UNPKG = re.compile(r"https://unpkg\.com/(@?[^@/]+(?:/[^@/]+)?)@[^/]+/([^\"]+)")


def strawberry_page() -> str:
    return get_graphql_ide_html(graphql_ide="graphiql")


def offline_page() -> str | None:
    """The page with every unpkg URL served locally, or None if the files are not vendored."""
    page = strawberry_page()
    missing = [m for m in UNPKG.finditer(page) if not (ASSETS / m.group(1) / m.group(2)).is_file()]
    if missing:
        return None
    return UNPKG.sub(lambda m: f"{ASSETS_PATH}/{m.group(1)}/{m.group(2)}", page)
