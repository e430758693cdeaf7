"""Copy the files strawberry's GraphiQL page loads from unpkg into the server package.

Reads the page's unpkg URLs and integrity hashes, copies each file from this folder's
node_modules (installed by `npm ci` from package-lock.json) to server/pvwire/graphiql/, and checks
its sha384 against the page, so the page served offline loads exactly the files it expects.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import sys
from pathlib import Path

from pvwire.api.graphiql_offline import ASSETS, UNPKG, strawberry_page

HERE = Path(__file__).resolve().parent


def main() -> int:
    page = strawberry_page()
    tags = re.findall(r'(?:src|href)="(https://unpkg\.com/[^"]+)"\s+integrity="([^"]+)"', page)
    if not tags:
        print("no unpkg assets found in strawberry's GraphiQL page", file=sys.stderr)
        return 1
    for url, integrity in tags:
        match = UNPKG.match(url)
        assert match, url
        package, path = match.group(1), match.group(2)
        source = HERE / "node_modules" / package / path
        digest = "sha384-" + base64.b64encode(hashlib.sha384(source.read_bytes()).digest()).decode()
        if digest != integrity:
            print(f"{source}: sha384 differs from the page's integrity for {url}", file=sys.stderr)
            return 1
        target = ASSETS / package / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    print(f"GraphiQL: {len(tags)} files vendored into {ASSETS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
