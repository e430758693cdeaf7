"""The ``pvwire`` command, run as a subprocess against a real server (fixture ``server_url``)."""

from __future__ import annotations

import ast
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest
from pvwire_client.cli import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_WRITE_DENIED, parse_value
from pvwire_client.cliformat import change_json, channel_problem, state_json
from pvwire_client.climonitor import Watch
from pvwire_client.entry import ALARM, CONN, META, TIME, VALUE
from pvwire_client.state import CONNECTED, FAILED, NOT_FOUND, ChannelState

pytestmark = [pytest.mark.ioc, pytest.mark.usefixtures("epics_env")]
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
    out = run(server_url, "monitor", "--json", "ca://PVW:COUNTER", "--duration", "5").stdout
    docs = [json.loads(line) for line in out.splitlines()]
    assert len(docs) >= 3 and all(d["id"] == "ca://PVW:COUNTER" for d in docs)
    assert "value" in docs[0]["changed"]


def test_monitor_asks_for_arrays_reduced_for_display(server_url: str) -> None:
    # A 10,000-point waveform with --max-columns 100 arrives as 100 (min, max) pairs; the first
    # line's metadata says how it was reduced (PROTOCOL.md section 4.6).
    wf = "sim://waveform?length=10000"
    out = run(server_url, "monitor", "--json", wf, "--max-columns", "100", "--count", "1").stdout
    doc = json.loads(out)
    assert len(doc["value"]) == 200
    assert doc["metadata"]["reduced"]["method"] == "minmax"
    assert doc["metadata"]["reduced"]["from"] == [10000]
    whole = json.loads(run(server_url, "monitor", "--json", wf, "--count", "1").stdout)
    assert len(whole["value"]) == 10000 and "reduced" not in whole["metadata"]


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


def test_unknown_pv_is_named_once_on_stderr(server_url: str) -> None:
    for name in ("ca://PVW:NOPE", "PVW:NOPE"):  # with and without the default scheme
        p = run(server_url, "get", "--timeout", "1", name, ok=False)
        assert p.returncode == EXIT_NOT_FOUND and p.stdout == ""
        assert p.stderr.startswith(f"{name}: not found (") and p.stderr.count("\n") == 1
        assert p.stderr.count("PVW:NOPE") == 1, p.stderr


def test_get_reads_what_it_can_and_exits_by_the_worst_problem(server_url: str) -> None:
    p = run(server_url, "get", "--timeout", "3", "ca://PVW:AO", "ca://PVW:NOPE", ok=False)
    assert p.returncode == EXIT_NOT_FOUND and p.stdout.startswith("ca://PVW:AO  ")
    p = run(server_url, "get", "--timeout", "1", "ca://PVW:NOPE", "bad://x", ok=False)
    assert p.returncode == EXIT_ERROR and len(p.stderr.splitlines()) == 2
    assert p.stderr.splitlines()[1].count("bad://x") == 1


def test_unreachable_server_is_one_line_on_stderr() -> None:
    p = run("http://127.0.0.1:9", "get", "ca://PVW:AO", ok=False)
    assert p.returncode == 1 and p.stderr.startswith("pvwire: cannot reach")
    assert "Traceback" not in p.stderr


def test_put_denied_names_the_channel_once(server_url: str) -> None:
    p = run(server_url, "put", "ca://TEST:NOT:WRITABLE", "1", ok=False)
    assert p.returncode == EXIT_WRITE_DENIED and p.stdout == ""
    assert p.stderr.startswith("pvwire: ") and p.stderr.count("TEST:NOT:WRITABLE") == 1


def test_importing_the_command_leaves_out_numpy_httpx_and_asyncio() -> None:
    # `pvwire get` in a shell loop must start fast; these imports took 0.3 s of its 0.45 s.
    code = "import sys, pvwire_client.cli; print(sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(out.stdout))
    assert "pvwire_client.cli" in loaded
    assert not loaded & {"numpy", "httpx", "asyncio", "h11", "msgpack", "pvwire_client.transport"}


def test_monitor_reports_each_problem_once_and_remembers_who_is_missing() -> None:
    watch = Watch()
    nope = ChannelState("ca://NOPE")
    assert watch.see(nope) is None  # connecting: nothing to say yet
    nope.state, nope.reason = NOT_FOUND, "not found (no IOC answered for 5 s)"
    assert watch.see(nope) == "ca://NOPE: not found (no IOC answered for 5 s)"
    assert watch.see(nope) is None  # the same state again: already reported
    bad = ChannelState("ca://BAD", state=FAILED, reason="no wire form for <U1")
    assert watch.see(bad) == "ca://BAD: failed (no wire form for <U1)"
    ok = ChannelState("ca://OK", value=1.0, state=CONNECTED)
    assert watch.see(ok) is None
    assert sorted(watch.missing) == ["ca://BAD", "ca://NOPE"]
    # The PV appeared later: no longer missing.
    nope.state, nope.reason = CONNECTED, ""
    assert watch.see(nope) is None and watch.missing == ["ca://BAD"]


def test_problem_lines_say_not_found_once_whatever_the_reason_says() -> None:
    bare = ChannelState("ca://X", state=NOT_FOUND)
    assert channel_problem(bare) == "ca://X: not found"
    other = ChannelState("ca://X", state=NOT_FOUND, reason="no IOC answered for 5 s")
    assert channel_problem(other) == "ca://X: not found (no IOC answered for 5 s)"
    assert channel_problem(ChannelState("ca://X", state=FAILED)) == "ca://X: failed"


def test_monitor_of_a_missing_pv_says_not_found_keeps_watching_and_exits_3(
    server_url: str,
) -> None:
    # The server sends NOT_FOUND (PROTOCOL.md section 3, state 4) after its search time.
    env = {**os.environ, "PVWIRE_URL": server_url}
    cmd = [PVWIRE, "monitor", "ca://PVW:NOPE", "ca://PVW:COUNTER", "--duration", "60"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[tuple[str, str]] = queue.Queue()
    for name, pipe in (("out", p.stdout), ("err", p.stderr)):
        threading.Thread(target=_pump, args=(name, pipe, lines), daemon=True).start()
    try:
        seen = _until(lines, lambda k, line: k == "err", 30)
        assert seen[-1][1].startswith("ca://PVW:NOPE: not found (no IOC answered for "), seen
        # It keeps watching: the other channel goes on printing.
        later = _until(
            lines, lambda k, line: k == "out" and line.startswith("ca://PVW:COUNTER "), 10
        )
        p.send_signal(signal.SIGTERM)  # ends a monitor like --duration does
        assert p.wait(30) == EXIT_NOT_FOUND
    finally:
        p.kill()
        p.wait()
    later += _until(lines, lambda k, line: k == "eof-err", 10)
    assert not [line for k, line in later if k == "err"], "the problem is reported once"


def _pump(name: str, pipe: IO[str], lines: queue.Queue[tuple[str, str]]) -> None:
    with pipe:  # closed by its only reader, at the end
        for line in pipe:
            lines.put((name, line.rstrip("\n")))
    lines.put((f"eof-{name}", ""))


def _until(
    lines: queue.Queue[tuple[str, str]], done: Callable[[str, str], bool], timeout: float
) -> list[tuple[str, str]]:
    """Lines read until one satisfies ``done`` (included); fails after ``timeout`` seconds."""
    seen: list[tuple[str, str]] = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            item = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"timed out after {timeout} s; read {seen[-10:]}") from None
        seen.append(item)
        if done(*item):
            return seen


def test_monitor_json_lines_carry_what_changed_and_metadata_only_when_it_changes(
    server_url: str,
) -> None:
    env = {**os.environ, "PVWIRE_URL": server_url}
    cmd = [PVWIRE, "monitor", "--json", "ca://PVW:CHG", "ca://PVW:COUNTER", "--duration", "60"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[tuple[str, str]] = queue.Queue()
    for name, pipe in (("out", p.stdout), ("err", p.stderr)):
        threading.Thread(target=_pump, args=(name, pipe, lines), daemon=True).start()
    counter: list[dict[str, Any]] = []

    def doc(kind: str, line: str, channel: str) -> bool:
        if kind != "out":
            return False
        d = json.loads(line)
        if d["id"] == "ca://PVW:COUNTER":
            counter.append(d)
        return bool(d["id"] == channel)

    try:
        seen = _until(lines, lambda k, line: doc(k, line, "ca://PVW:CHG"), 30)
        first = json.loads(seen[-1][1])
        # A channel's first line holds everything known, as `pvwire get --json` does.
        assert set(first) - {"changed"} == set(state_json(ChannelState("x")))
        assert first["units"] == "mm" and first["metadata"]["precision"] == 2
        _until(lines, lambda k, line: doc(k, line, "") or len(counter) >= 4, 30)
        # Later lines of the counter: its new value and time, no metadata.
        assert counter[0]["metadata"]["units"] == "counts"
        for d in counter[1:]:
            assert d["changed"] == ["time", "value"], d
            assert set(d) == {"id", "changed", "value", "display", "serial", "conflated", "time",
                              "seconds", "nanoseconds"}  # fmt: skip
        run(server_url, "put", "ca://PVW:CHG.EGU", "um")
        seen = _until(lines, lambda k, line: doc(k, line, "ca://PVW:CHG"), 30)
        change = json.loads(seen[-1][1])
        assert "metadata" in change["changed"] and "value" not in change["changed"]
        assert change["units"] == "um" and change["metadata"]["units"] == "um"
        assert change["display"] == f"{first['value']:.2f} um"
    finally:
        run(server_url, "put", "ca://PVW:CHG.EGU", "mm")
        p.kill()
        p.wait()


def test_monitor_count_counts_values_not_metadata_lines(server_url: str) -> None:
    """--count N stops after N values: a line that only says the units changed is printed and
    not counted (it was, and `--count 2` then ended before the second value)."""
    env = {**os.environ, "PVWIRE_URL": server_url}
    cmd = [PVWIRE, "monitor", "--json", "ca://PVW:CHG", "--count", "2", "--duration", "60"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[tuple[str, str]] = queue.Queue()
    for name, pipe in (("out", p.stdout), ("err", p.stderr)):
        threading.Thread(target=_pump, args=(name, pipe, lines), daemon=True).start()
    seen: list[tuple[str, str]] = []
    try:
        seen += _until(lines, lambda k, line: k == "out", 30)  # the first value
        run(server_url, "put", "ca://PVW:CHG.EGU", "um")
        seen += _until(lines, lambda k, line: k == "out" and '"metadata"' in line, 30)
        assert p.poll() is None, seen  # the units line did not end it
        run(server_url, "put", "ca://PVW:CHG", "1.25")
        seen += _until(lines, lambda k, line: k == "eof-out", 60)
        assert p.wait(60) == 0, seen
    finally:
        run(server_url, "put", "ca://PVW:CHG.EGU", "mm")
        run(server_url, "put", "ca://PVW:CHG", "0")
        p.kill()
        p.wait()
    out = [json.loads(line) for kind, line in seen if kind == "out"]
    values = [d for d in out if "value" in d["changed"]]
    assert [d["value"] for d in values] == [0.0, 1.25], out
    assert any(d["changed"] == ["metadata"] for d in out), out


def test_change_json_names_only_what_changed() -> None:
    s = ChannelState("ca://X", value=1.5, serial=3, seconds=1700000000, nanoseconds=5000,
                     severity=2, status=3, message="", metadata={"units": "A", "precision": 1},
                     state=CONNECTED)  # fmt: skip
    full = change_json(s, VALUE | TIME | ALARM | META | CONN)
    assert {k: v for k, v in full.items() if k != "changed"} == state_json(s)
    assert full["changed"] == ["alarm", "connection", "metadata", "time", "value"]
    assert change_json(s, ALARM) == {
        "id": "ca://X", "changed": ["alarm"], "severity": "MAJOR", "status": "HIHI", "message": ""
    }  # fmt: skip
    assert change_json(s, TIME)["time"] == "2023-11-14T22:13:20.000005+00:00"
    assert change_json(s, CONN) == {
        "id": "ca://X", "changed": ["connection"], "connection": "CONNECTED", "reason": ""
    }  # fmt: skip
