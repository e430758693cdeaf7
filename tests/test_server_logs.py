"""The server's log: a client's mistake is one INFO line, a server fault has a traceback, and
`--log-format json` writes one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator

import pytest
from graphql import GraphQLError
from pvwire.errors import TypeMismatch
from pvwire.logs import JsonFormatter, log_graphql_errors

from tests.eventually import eventually
from tests.server_process import ServerProcess

DENIED_PUT = 'mutation { put(id: "sim://sine", value: 1) { ok } }'


def wait_for_log(server: ServerProcess, found: Callable[[list[str]], bool]) -> list[str]:
    """The server's output lines once `found` holds (the log is read by a thread)."""

    def lines() -> list[str] | None:
        seen = server.log().splitlines()
        return seen if found(seen) else None

    return eventually(lines, server.log)


@pytest.fixture(scope="module")
def text_server() -> Iterator[ServerProcess]:
    with ServerProcess("--log-level", "info") as server:
        yield server


def test_denied_put_is_one_info_line_without_traceback(text_server: ServerProcess) -> None:
    errors = text_server.graphql(DENIED_PUT)["errors"]
    assert errors[0]["extensions"]["code"] == "WRITE_DENIED"
    lines = wait_for_log(text_server, lambda ls: any("pvwire.graphql" in x for x in ls))
    graphql_lines = [x for x in lines if "pvwire.graphql" in x]
    assert len(graphql_lines) == 1
    expected = " INFO pvwire.graphql request error WRITE_DENIED at put: writes to sim://sine"
    assert expected in graphql_lines[0]
    assert not any("Traceback" in x or " ERROR " in x for x in lines), text_server.log()


def test_invalid_query_is_one_info_line(text_server: ServerProcess) -> None:
    text_server.graphql("query { nope }")
    lines = wait_for_log(text_server, lambda ls: any("'nope'" in x for x in ls))
    (line,) = [x for x in lines if "'nope'" in x]
    assert " INFO pvwire.graphql request error GRAPHQL_VALIDATION: Cannot query field" in line
    assert not any("Traceback" in x for x in lines)


def test_json_log_lines_parse() -> None:
    with ServerProcess("--log-level", "info", "--log-format", "json") as server:
        server.graphql(DENIED_PUT)
        lines = wait_for_log(server, lambda ls: any("WRITE_DENIED" in x for x in ls))
    docs = [json.loads(line) for line in lines]  # every line, uvicorn's included
    assert all({"time", "level", "logger", "message"} <= doc.keys() for doc in docs)
    assert any(doc["logger"] == "uvicorn.error" for doc in docs)
    (denied,) = [d for d in docs if d["logger"] == "pvwire.graphql"]
    assert denied["level"] == "INFO" and denied["code"] == "WRITE_DENIED"
    assert denied["path"] == "put" and denied["time"].endswith("Z")


def test_server_fault_logs_error_with_traceback(caplog: pytest.LogCaptureFixture) -> None:
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError as exc:
        fault = GraphQLError("division by zero", path=["server"], original_error=exc)
    mistake = GraphQLError("no", original_error=TypeMismatch("'abc' is not a number"))
    with caplog.at_level(logging.INFO, logger="pvwire.graphql"):
        log_graphql_errors([fault, mistake])
    error, info = caplog.records
    assert error.levelno == logging.ERROR and error.exc_info is not None
    assert error.getMessage() == "server fault at server: division by zero"
    assert info.levelno == logging.INFO and info.exc_info is None
    assert info.getMessage() == "request error TYPE_MISMATCH: no"


def test_json_formatter_keeps_extra_fields_and_traceback() -> None:
    try:
        raise KeyError("k")
    except KeyError:
        record = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, "f.py", 1, "a\nb %s", ("c",), sys.exc_info(), extra={"n": 3}
        )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["message"] == "a\nb c" and doc["n"] == 3 and doc["level"] == "ERROR"
    assert "KeyError: 'k'" in doc["traceback"]
