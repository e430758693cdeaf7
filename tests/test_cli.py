"""The ``pvwire`` command, run as a subprocess against a real server (fixture ``server_url``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pvwire_client.cli import parse_value

pytestmark = pytest.mark.ioc
PVWIRE = str(Path(sys.executable).with_name("pvwire"))


def run(server_url: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PVWIRE_URL": server_url}
    p = subprocess.run([PVWIRE, *args], env=env, capture_output=True, text=True, timeout=60)
    if ok:
        assert p.returncode == 0, p.stderr
        assert p.stderr == ""
    return p


@pytest.mark.parametrize(
    ("text", "value"),
    [("3", 3), ("-2.5", -2.5), ("[1, 2.5]", [1, 2.5]), ("On", "On"), ("[x", "[x"), ("1e3", 1e3)],
)
def test_parse_value(text: str, value: object) -> None:
    assert parse_value(text) == value and type(parse_value(text)) is type(value)


def test_get(server_url: str) -> None:
    out = run(server_url, "get", "ca://PVW:AO", "ca://PVW:MBBO").stdout.splitlines()
    assert out[0].startswith("ca://PVW:AO  ") and out[0].endswith(" mm")
    assert out[1].split()[0] == "ca://PVW:MBBO"


def test_get_json(server_url: str) -> None:
    doc = json.loads(run(server_url, "get", "--json", "ca://PVW:WF").stdout)
    assert doc["id"] == "ca://PVW:WF" and isinstance(doc["value"], list)
    assert doc["connection"] == "CONNECTED" and doc["units"] == "V"


def test_put_then_get(server_url: str) -> None:
    run(server_url, "put", "ca://PVW:AO", "12.25")
    out = run(server_url, "get", "ca://PVW:AO").stdout
    assert "12.250 mm" in out
    run(server_url, "put", "ca://PVW:MBBO", "Off")
    assert json.loads(run(server_url, "get", "--json", "ca://PVW:MBBO").stdout)["display"] == "Off"
    doc = json.loads(run(server_url, "put", "--json", "ca://PVW:WF", "[7, 8, 9]").stdout)
    assert doc["value"][:3] == [7.0, 8.0, 9.0]


def test_monitor_count(server_url: str) -> None:
    out = run(server_url, "monitor", "ca://PVW:COUNTER", "--count", "3").stdout.splitlines()
    assert len(out) == 3
    for line in out:
        name, date, clock, value, *_ = line.split()
        assert name == "ca://PVW:COUNTER" and len(date) == 10 and ":" in clock
        float(value)


def test_monitor_json_duration(server_url: str) -> None:
    out = run(server_url, "monitor", "--json", "ca://PVW:COUNTER", "--duration", "1").stdout
    docs = [json.loads(line) for line in out.splitlines()]
    assert len(docs) >= 3 and all(d["id"] == "ca://PVW:COUNTER" for d in docs)
    assert "value" in docs[0]["changed"]


def test_info(server_url: str) -> None:
    out = run(server_url, "info", "ca://PVW:AO").stdout
    assert "units: mm" in out and "precision: 3" in out
    doc = json.loads(run(server_url, "info", "--json", "ca://PVW:AO").stdout)
    assert doc["metadata"]["description"] == "Test output"


def test_search(server_url: str) -> None:
    # The test server's catalogue lists ca://PVW:AO and ca://PVW:COUNTER.
    assert "ca://PVW:AO" in run(server_url, "search", "*PVW:AO").stdout.split()
    found = json.loads(run(server_url, "search", "--json", "*PVW:[AC]*").stdout)
    assert {"ca://PVW:AO", "ca://PVW:COUNTER"} <= set(found)


def test_unknown_pv_is_one_line_on_stderr(server_url: str) -> None:
    p = run(server_url, "get", "--timeout", "1", "ca://PVW:NOPE", ok=False)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith("pvwire: ca://PVW:NOPE: ") and p.stderr.count("\n") == 1


def test_unreachable_server_is_one_line_on_stderr() -> None:
    p = run("http://127.0.0.1:9", "get", "ca://PVW:AO", ok=False)
    assert p.returncode == 1 and p.stderr.startswith("pvwire: cannot reach")
    assert "Traceback" not in p.stderr
