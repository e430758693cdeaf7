"""protocol/schema.graphql is the control plane's contract: it must equal what the server serves."""

from __future__ import annotations

from pathlib import Path

from pvwire.api.graphql import make_schema
from pvwire.config import Settings

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "protocol" / "schema.graphql"


def test_schema_file_equals_the_served_schema() -> None:
    text = SCHEMA_FILE.read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#")).strip()
    served = make_schema(Settings().max_query_depth).as_str().strip()
    assert body == served, "regenerate: python scripts/generate_protocol.py"
