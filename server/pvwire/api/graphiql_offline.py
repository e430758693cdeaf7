"""GraphiQL without the internet: strawberry's page, pointed at files this server serves.

Control-room networks are often offline; strawberry's page loads React and GraphiQL from unpkg.
`make` vendors those exact files (same bytes, so the page's integrity hashes still hold) into
`graphiql/` beside this module (server/graphiql/vendor.py); this module rewrites the URLs, and
opens the editor on a pvwire query instead of the stock welcome text, whose emoji the fonts of an
offline machine often lack (it showed as a box).
"""

from __future__ import annotations

import re
from pathlib import Path

from strawberry.http.ides import get_graphql_ide_html

__all__ = ["ASSETS", "ASSETS_PATH", "EXAMPLE_QUERY", "UNPKG", "offline_page", "strawberry_page"]

ASSETS = Path(__file__).parent.parent / "graphiql"  # server/pvwire/graphiql
ASSETS_PATH = "/graphiql-assets"
UNPKG = re.compile(r"https://unpkg\.com/(@?[^@/]+(?:/[^@/]+)?)@[^/]+/([^\"]+)")

# Lines short enough for the editor pane at 1400 px.
# ASCII only (offline fonts), and no backquote or "${": it goes into a JavaScript template literal.
EXAMPLE_QUERY = """\
# pvwire: read a channel and search names.
# Run: Ctrl-Enter or the play button.
# Ids: PV name (Channel Access), pva://NAME, sim://KIND.
# Write: mutation { put(id: "PVWIRE:DEMO:SP",
#          value: 12.5, wait: true) { ok error } }

{
  channel(id: "PVWIRE:DEMO:SINE") {
    id
    value
    display
    time { iso }
    alarm { severity message }
    connection
    metadata { units precision writable }
  }
  search(pattern: "PVWIRE:DEMO:*", limit: 20)
}
"""
_EXAMPLE = re.compile(r"const EXAMPLE_QUERY = `.*?`;", re.DOTALL)
_ICON = re.compile(r'<link\s+rel="icon"\s+href="[^"]*"\s*/>')


def strawberry_page() -> str:
    return get_graphql_ide_html(graphql_ide="graphiql")


def offline_page() -> str | None:
    """The page with every unpkg URL served locally, or None if the files are not vendored."""
    page = strawberry_page()
    missing = [m for m in UNPKG.finditer(page) if not (ASSETS / m.group(1) / m.group(2)).is_file()]
    if missing:
        return None
    page = UNPKG.sub(lambda m: f"{ASSETS_PATH}/{m.group(1)}/{m.group(2)}", page)
    page = _EXAMPLE.sub(lambda _: f"const EXAMPLE_QUERY = `{EXAMPLE_QUERY}`;", page, count=1)
    # The stock icon is an emoji too; the title names the server the page belongs to.
    page = _ICON.sub('<link rel="icon" href="data:,">', page, count=1)
    return page.replace("<title>Strawberry GraphiQL</title>", "<title>pvwire GraphiQL</title>", 1)
