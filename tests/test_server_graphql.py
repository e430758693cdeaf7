"""The control plane over real HTTP: a real server process, the shared test IOC behind it."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import urllib.request

import pytest

from tests.server_process import ServerProcess

# A channel that exists connects within its timeout however busy the machine; the ones that do
# not wait it out, so they pass a shorter one.
CHANNEL = """query($id: String!, $timeout: Float! = 20) { channel(id: $id, timeout: $timeout) {
  id value display connection time { seconds nanoseconds iso }
  alarm { severity status message }
  metadata { type units precision description writable choices
             display { low high } control { low high } alarm { low high } warning { low high } }
} }"""


def test_channel_reads_value_and_metadata_over_ca(server: ServerProcess) -> None:
    doc = server.graphql(CHANNEL, {"id": "ca://PVW:AO"})
    assert "errors" not in doc, doc
    ch = doc["data"]["channel"]
    assert ch["id"] == "ca://PVW:AO" and ch["connection"] == "CONNECTED"
    meta = ch["metadata"]
    assert isinstance(ch["value"], float)
    assert meta["units"] and meta["precision"] is not None and meta["description"]
    assert meta["writable"] is True  # allowed by the test server's write rules
    assert ch["display"].endswith(meta["units"])
    assert ch["time"]["iso"].endswith("Z") and 0 <= ch["time"]["nanoseconds"] < 10**9


def test_bare_name_uses_the_default_scheme_and_pva_works(server: ServerProcess) -> None:
    bare = server.graphql(CHANNEL, {"id": "PVW:MBBO"})["data"]["channel"]
    assert bare["id"] == "ca://PVW:MBBO"
    assert bare["metadata"]["choices"] and bare["display"] in bare["metadata"]["choices"]
    pva = server.graphql(CHANNEL, {"id": "pva://PVW:AO"})["data"]["channel"]
    assert pva["connection"] == "CONNECTED" and pva["metadata"]["units"]


def test_unknown_pv_is_a_clear_not_found(server: ServerProcess) -> None:
    doc = server.graphql(CHANNEL, {"id": "ca://PVW:DOES_NOT_EXIST", "timeout": 2})
    (err,) = doc["errors"]
    assert err["extensions"]["code"] == "NOT_FOUND"
    assert "PVW:DOES_NOT_EXIST" in err["message"]


def test_bad_scheme_is_named(server: ServerProcess) -> None:
    doc = server.graphql(CHANNEL, {"id": "foo://X"})
    assert doc["errors"][0]["extensions"]["code"] == "BAD_CHANNEL_ID"
    assert "foo" in doc["errors"][0]["message"]


def test_channels_reports_failures_per_channel(server: ServerProcess) -> None:
    doc = server.graphql(
        'query { channels(ids: ["ca://PVW:AO", "ca://PVW:NOPE"], timeout: 3) '
        "{ id value error errorCode } }"
    )
    good, bad = doc["data"]["channels"]
    assert good["error"] is None and good["value"] is not None
    assert bad["errorCode"] == "NOT_FOUND" and "PVW:NOPE" in bad["error"]


def test_put_then_get_and_wait(server: ServerProcess) -> None:
    put = server.graphql('mutation { put(id: "ca://PVW:AO", value: 3.25, wait: true) { id ok } }')
    assert put["data"]["put"] == {"id": "ca://PVW:AO", "ok": True}
    ch = server.graphql(CHANNEL, {"id": "ca://PVW:AO"})["data"]["channel"]
    assert ch["value"] == pytest.approx(3.25)


@pytest.mark.parametrize(
    ("channel", "value", "code"),
    [
        ("ca://PVW:AO", '"not a number"', "TYPE_MISMATCH"),
        ("ca://PVW:MBBO", '"NoSuchLabel"', "TYPE_MISMATCH"),
        ("sim://sine", "1.0", "WRITE_DENIED"),
        ("ca://PVW:NOPE", "1.0", "NOT_FOUND"),
    ],
)
def test_put_errors_are_precise(server: ServerProcess, channel: str, value: str, code: str) -> None:
    doc = server.graphql(
        f'mutation {{ put(id: "{channel}", value: {value}, timeout: 2) {{ ok }} }}'
    )
    (err,) = doc["errors"]
    assert err["extensions"]["code"] == code, err


def test_put_many_reports_each_put(server: ServerProcess) -> None:
    doc = server.graphql(
        "mutation { putMany(puts: ["
        '{id: "ca://PVW:LONG", value: 42}, {id: "ca://PVW:AO", value: "x"},'
        '{id: "ca://PVW:STR", value: "hello there"}], wait: true) { id ok errorCode } }'
    )
    results = doc["data"]["putMany"]
    assert [r["ok"] for r in results] == [True, False, True]
    assert results[1]["errorCode"] == "TYPE_MISMATCH"


def test_enum_put_by_label(server: ServerProcess) -> None:
    meta = server.graphql(CHANNEL, {"id": "ca://PVW:MBBO"})["data"]["channel"]["metadata"]
    label = meta["choices"][1]
    doc = server.graphql(
        f'mutation {{ put(id: "ca://PVW:MBBO", value: "{label}", wait: true) {{ ok }} }}'
    )
    assert doc["data"]["put"]["ok"] is True
    ch = server.graphql(CHANNEL, {"id": "ca://PVW:MBBO"})["data"]["channel"]
    assert ch["value"] == 1 and ch["display"] == label


def test_subscribe_returns_token_and_sids(server: ServerProcess) -> None:
    doc = server.graphql(
        'mutation { subscribe(ids: ["PVW:AO", "sim://counter"], options: {maxRate: 5}) '
        "{ token expiresAt streamPath channels { sid id } } }"
    )
    reg = doc["data"]["subscribe"]
    assert reg["token"].startswith("pvw1.") and reg["streamPath"] == "/stream"
    assert reg["channels"] == [{"sid": 0, "id": "ca://PVW:AO"}, {"sid": 1, "id": "sim://counter"}]


@pytest.mark.parametrize(
    ("query", "complaint"),
    [
        ("query { channel(id: ", "Syntax Error"),
        ("query { nosuchfield }", "Cannot query field"),
        ("mutation { subscribe(ids: []) { token } }", "at least one channel"),
        ('mutation { subscribe(ids: ["a"], options: {maxRate: -1}) { token } }', "maxRate"),
        ('query { channel(id: "x", timeout: 0) { id } }', "timeout must be"),
    ],
)
def test_malformed_requests_get_errors_not_crashes(
    server: ServerProcess, query: str, complaint: str
) -> None:
    doc = server.graphql(query)
    assert any(complaint in e["message"] for e in doc["errors"]), doc
    assert server.graphql("query { server { version } }")["data"]["server"]["version"]


def test_oversized_queries_are_refused(server: ServerProcess) -> None:
    # Introspection is exempt from the depth limit; the token limit bounds any request.
    fields = " ".join(f"a{i}: server {{ version }}" for i in range(7000))
    doc = server.graphql(f"query {{ {fields} }}")
    assert any(
        "exceeds the limit" in e["message"] or "token" in e["message"].lower()
        for e in doc["errors"]
    ), doc["errors"][:1]
    assert server.graphql("query { server { version } }")["data"]["server"]["version"]


def test_search_finds_catalogue_sim_and_active(server: ServerProcess) -> None:
    found = server.graphql('query { search(pattern: "*PVW:*", limit: 50) }')["data"]["search"]
    assert "ca://PVW:AO" in found and "ca://PVW:COUNTER" in found
    sims = server.graphql('query { search(pattern: "sim://*") }')["data"]["search"]
    assert "sim://sine" in sims


def test_server_info_and_probes(server: ServerProcess) -> None:
    info = server.graphql("query { server { version uptime tickMs writesEnabled loopLagMs } }")
    s = info["data"]["server"]
    assert s["writesEnabled"] is True and s["tickMs"] == 20 and s["uptime"] > 0
    with urllib.request.urlopen(f"{server.url}/readyz") as r:
        assert json.loads(r.read())["ready"] is True
    text = server.metrics()
    assert "pvwire_clients " in text and "pvwire_tick_duration_seconds_bucket" in text


def test_graphiql_is_served(server: ServerProcess) -> None:
    req = urllib.request.Request(f"{server.url}/graphql", headers={"Accept": "text/html"})
    with urllib.request.urlopen(req) as r:
        assert "graphiql" in r.read().decode().lower()


def test_nan_limits_become_null(server: ServerProcess) -> None:
    meta = server.graphql(CHANNEL, {"id": "ca://PVW:STR"})["data"]["channel"]["metadata"]
    for key in ("display", "alarm", "warning"):
        limits = meta[key]
        assert limits is None or all(v is None or math.isfinite(v) for v in limits.values())


def test_graphiql_page_loads_nothing_from_the_internet(server: ServerProcess) -> None:
    req = urllib.request.Request(f"{server.url}/graphql", headers={"Accept": "text/html"})
    with urllib.request.urlopen(req) as r:
        page = r.read().decode()
    assert "unpkg.com" not in page and "https://" not in page.split("<body>")[0]
    assets = re.findall(r'(?:src|href)="(/graphiql-assets/[^"]+)"\s+integrity="([^"]+)"', page)
    assert len(assets) == 7
    for path, integrity in assets:
        with urllib.request.urlopen(f"{server.url}{path}") as r:
            body = r.read()
        # The browser refuses a file whose hash differs from the page's integrity attribute.
        digest = base64.b64encode(hashlib.sha384(body).digest()).decode()
        assert integrity == f"sha384-{digest}", path
