"""pvws' browser client at `/pvws/js/pvws.js` and `/pvws/js/base64.js`.

Pages written for pvws load its client scripts from the pvws server itself: dbwr's view page
adds `<script src=".../pvws/js/base64.js">` and `.../pvws/js/pvws.js?V=...` and then calls
`new PVWS(url, ...)`. Without them the page stays blank. The scripts (in `js/`) are
pvwire's own, with the API those pages call; docs/PVWS.md describes it.

They are sent as `application/javascript`: Chromium refuses a cross-origin script of another
type (ERR_BLOCKED_BY_ORB), and dbwr usually runs on another origin than its pvws server.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, PlainTextResponse, Response

__all__ = ["SCRIPTS", "router"]

FOLDER = Path(__file__).resolve().parent / "js"
SCRIPTS = ("pvws.js", "base64.js")
MEDIA_TYPE = "application/javascript"


def router() -> APIRouter:
    r = APIRouter()

    @r.get("/pvws/js/{name}", response_model=None)
    async def script(name: str) -> Response:
        if name not in SCRIPTS:  # a fixed list: no path from the URL reaches the file system
            return PlainTextResponse(f"no script {name!r} here", status_code=404)
        # Revalidated on each load (ETag), so a page gets a new version at once; dbwr also adds
        # `?V=...` to the URL of pvws.js for the same reason.
        headers = {"Cache-Control": "no-cache"}
        return FileResponse(FOLDER / name, media_type=MEDIA_TYPE, headers=headers)

    return r
