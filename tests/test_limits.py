"""The limits the server enforces are one table (server/pvwire/limits.py): the code reads it, and
PROTOCOL.md's section 11 and the GraphQL schema's descriptions are generated from it."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import fields
from pathlib import Path

from pvwire import limits
from pvwire.config import Settings
from pvwire.wire.session import SessionLimits
from pvwire_client import wire

from scripts.generate_protocol import PROTOCOL, protocol_text, schema_text
from tests.server_process import ServerProcess
from tests.stream_client import RawStream

ROOT = Path(__file__).resolve().parents[1]


def test_protocol_md_holds_the_current_table() -> None:
    text = PROTOCOL.read_text()
    assert protocol_text(text) == text, "regenerate: python scripts/generate_protocol.py"


def test_schema_file_is_what_the_generator_writes() -> None:
    path = ROOT / "protocol" / "schema.graphql"
    assert path.read_text() == schema_text(), "regenerate: python scripts/generate_protocol.py"


def test_every_setting_limit_is_a_settings_default() -> None:
    defaults = {f.name: getattr(Settings(), f.name) for f in fields(Settings)}
    for limit in limits.LIMITS:
        if limit.setting:
            assert defaults[limit.name] == limit.value, limit.name


def test_the_session_defaults_are_the_table_s() -> None:
    s = SessionLimits()
    assert (s.max_attachments, s.max_channels, s.send_budget, s.stall_timeout) == (
        limits.default("max_attachments_per_connection"),
        limits.default("max_channels_per_connection"),
        limits.default("send_budget"),
        limits.default("stall_timeout_s"),
    )


def test_the_schema_describes_the_limits_the_server_enforces() -> None:
    text = schema_text()
    for name in ("max_rate_hz", "max_columns", "min_pixels", "token_ttl_s", "max_id_length",
                 "max_channels_per_subscription", "max_query_depth", "max_query_cost"):  # fmt: skip
        assert limits.shown(name) in text, name


async def test_the_attachment_limit_is_the_table_s_over_a_real_stream(
    server: ServerProcess,
) -> None:
    """The 1,001st ATTACH on one connection is refused with 4413, as section 11 says."""
    query = 'mutation { subscribe(ids: ["sim://counter"]) { token } }'
    body = json.dumps({"query": query}).encode()
    request = urllib.request.Request(
        f"{server.url}/graphql", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        token = json.loads(r.read())["data"]["subscribe"]["token"]
    s = await RawStream.connect(server.ws_url)
    try:
        most = limits.integer("max_attachments_per_connection")
        for req in range(1, most + 2):
            await s.send(16, req, token)
        answers = 0
        while answers < most + 1:
            msg = await s.recv(60)
            if isinstance(msg, wire.Attached | wire.Error):
                answers += 1
        assert isinstance(msg, wire.Error), msg
        assert (msg.req, msg.code) == (most + 1, 4413)
    finally:
        await s.close()
