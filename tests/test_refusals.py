"""Refused authentications are audited with their reason and the request's operation, counted by
reason, and bounded under a flood (access/refusals.py), in one process with a real audit file."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from pvwire.access import refusals as refusals_module
from pvwire.access.audit import AuditLog
from pvwire.access.identity import Authenticator, AuthError, JwtSettings
from pvwire.access.refusals import REASONS, RefusalLog
from pvwire.api.graphql_http import graphql_operation
from pvwire.api.metrics import render_metrics
from pvwire.core.hub import Hub

SECRET = "s" * 48
ISS, AUD = "https://sso.example.org/realms/ctrl", "pvwire"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def token(key: str = SECRET, **extra: Any) -> str:
    now = int(time.time())
    claims = {"sub": "u", "preferred_username": "mallory", "iss": ISS, "aud": AUD, "iat": now,
              "exp": now + 300, **extra}  # fmt: skip
    return jwt.encode(claims, key, "HS256")


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def authenticator(tmp_path: Path, refusals: RefusalLog) -> Authenticator:
    (tmp_path / "secret").write_text(SECRET)
    return Authenticator(
        JwtSettings(secret_file=str(tmp_path / "secret"), issuer=ISS, audience=AUD),
        trusted_proxies=["10.9.0.0/16"],
        user_header="X-Remote-User",
        refusals=refusals,
    )


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: token("x" * 48), "bad_signature"),
        (lambda: token(exp=int(time.time()) - 600), "expired"),
        (lambda: token(nbf=int(time.time()) + 600), "not_yet_valid"),
        (lambda: token(aud="other"), "wrong_audience"),
        (lambda: token(iss="https://evil"), "wrong_issuer"),
        (lambda: jwt.encode({"exp": int(time.time()) + 60}, "", "none"), "bad_algorithm"),
        (lambda: "not.a.jwt", "malformed_token"),
    ],
)
def test_each_refused_token_leaves_one_line_with_its_reason(
    tmp_path: Path, make: Any, reason: str
) -> None:
    audit = AuditLog(str(tmp_path / "audit.jsonl"))
    auth = authenticator(tmp_path, RefusalLog(audit.refusal))
    with pytest.raises(AuthError):
        auth.identify({"authorization": f"Bearer {make()}"}, "10.1.2.3", "mutation put")
    audit.close()
    (line,) = lines(tmp_path / "audit.jsonl")
    assert (line["event"], line["reason"], line["address"], line["operation"]) == (
        "auth_refused", reason, "10.1.2.3", "mutation put")  # fmt: skip
    assert line["time"].endswith("+00:00")
    assert auth.refusals.counts[reason] == 1
    assert sum(auth.refusals.counts.values()) == 1


def test_a_user_header_from_an_untrusted_address_is_ignored_and_audited(tmp_path: Path) -> None:
    audit = AuditLog(str(tmp_path / "audit.jsonl"))
    auth = authenticator(tmp_path, RefusalLog(audit.refusal))
    who = auth.identify({"x-remote-user": "root"}, "192.168.7.7", "pvws")
    assert who.anonymous
    trusted = auth.identify({"x-remote-user": "olga"}, "10.9.1.1", "pvws")
    assert trusted.user == "olga"
    audit.close()
    (line,) = lines(tmp_path / "audit.jsonl")
    assert (line["reason"], line["address"], line["user"], line["operation"]) == (
        "untrusted_proxy_header", "192.168.7.7", "root", "pvws")  # fmt: skip


def test_the_operation_is_asked_for_only_when_a_request_is_refused(tmp_path: Path) -> None:
    asked: list[int] = []

    def operation() -> str:
        asked.append(1)
        return "query get"

    auth = authenticator(tmp_path, RefusalLog())
    auth.identify({"authorization": f"Bearer {token()}"}, "10.1.2.3", operation)
    assert not asked
    with pytest.raises(AuthError):
        auth.identify({"authorization": f"Bearer {token('y' * 48)}"}, "10.1.2.3", operation)
    assert asked == [1]


def test_a_flood_of_bad_tokens_writes_a_bounded_number_of_lines_and_a_summary(
    tmp_path: Path,
) -> None:
    """10,000 forged tokens in 10 s (by a clock the test moves): at most `burst` lines, then one
    a second, and summaries that account for every refusal left out."""
    clock = Clock()
    audit = AuditLog(str(tmp_path / "audit.jsonl"))
    refusals = RefusalLog(audit.refusal, rate=1.0, burst=20, interval=10.0, clock=clock)
    auth = authenticator(tmp_path, refusals)
    forged = {"authorization": f"Bearer {token('z' * 48)}"}
    for _ in range(10_000):
        with pytest.raises(AuthError):
            auth.identify(forged, "10.6.6.6", "mutation put")
        clock.now += 0.001
    refusals.close()
    audit.close()
    found = lines(tmp_path / "audit.jsonl")
    written = [x for x in found if x["event"] == "auth_refused"]
    summaries = [x for x in found if x["event"] == "auth_refused_summary"]
    assert len(written) <= 20 + 10 + 1  # the burst, then 1/s over the 10 s
    assert 1 <= len(summaries) <= 2  # one per 10 s interval, and what close() had left
    assert len(written) + sum(x["suppressed"] for x in summaries) == 10_000
    assert {x["reason"] for x in summaries} == {"bad_signature"}
    assert refusals.counts["bad_signature"] == 10_000


def flooded(tmp_path: Path, then: str, address: str) -> list[dict[str, Any]]:
    """The lines written for 100 forged tokens from 10.6.6.6 (a burst of 5 lines), then one
    more refused token, `then`, from `address`."""
    written: list[dict[str, Any]] = []
    auth = authenticator(tmp_path, RefusalLog(written.append, burst=5, clock=Clock()))
    for bearer in [token("z" * 48)] * 100 + [then]:
        with pytest.raises(AuthError):
            auth.identify(
                {"authorization": f"Bearer {bearer}"}, "10.6.6.6" if bearer != then else address
            )
    return written


def test_each_reason_has_its_own_budget(tmp_path: Path) -> None:
    """A flood of one kind cannot hide another from the same address: the expired token's line
    is written."""
    written = flooded(tmp_path, token(exp=1), "10.6.6.6")
    assert [x["reason"] for x in written] == ["bad_signature"] * 5 + ["expired"]


def test_one_source_flooding_does_not_hide_another_sources_refusal(tmp_path: Path) -> None:
    """The same reason from another address still gets its line while the first floods."""
    written = flooded(tmp_path, token("y" * 48), "10.7.7.7")
    assert [x["address"] for x in written] == ["10.6.6.6"] * 5 + ["10.7.7.7"]


def test_sources_past_the_bound_are_forgotten_and_their_lines_left_out_still_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """refusal_log_sources buckets at most: the least recently refused goes first, and what it
    had left out is in the next summary."""
    monkeypatch.setattr(refusals_module, "SOURCES", 3)
    clock = Clock()
    written: list[dict[str, Any]] = []
    log = RefusalLog(written.append, burst=1, clock=clock)
    for address in ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"):
        for _ in range(3):  # one line, two left out, per address
            log.refused("expired", address, "query")
        assert len(log._buckets) <= 3
    log.close()
    lines_written = [x for x in written if x["event"] == "auth_refused"]
    summaries = [x for x in written if x["event"] == "auth_refused_summary"]
    assert [x["address"] for x in lines_written] == [f"10.0.0.{i}" for i in range(1, 6)]
    assert sum(x["suppressed"] for x in summaries) == 5 * 2
    assert log.counts["expired"] == 15


def test_rotating_sources_write_a_bounded_number_of_lines_per_reason() -> None:
    """10,000 refusals in 10 s (by a clock the test moves), each from an address never seen
    before, as a client rotating through 127.0.0.0/8 or its IPv6 /64 sends them: each source has
    a fresh bucket, so the reason's own bucket bounds the lines, to its burst plus its rate for
    the 10 s; the summaries account for every refusal left out, the counts are exact."""
    clock = Clock()
    written: list[dict[str, Any]] = []
    log = RefusalLog(written.append, clock=clock)
    for i in range(10_000):
        log.refused("bad_signature", f"127.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", "query")
        log.refused("expired", f"10.0.{i >> 8 & 255}.{i & 255}", "query")
        clock.now += 0.001
    log.close()
    for reason in ("bad_signature", "expired"):
        lines = [x for x in written if x["event"] == "auth_refused" and x["reason"] == reason]
        summaries = [x for x in written if x["event"] == "auth_refused_summary"
                     and x["reason"] == reason]  # fmt: skip
        assert len(lines) <= log.reason_burst + log.reason_rate * 10 + 1, (reason, len(lines))
        assert len(lines) >= log.reason_burst  # the burst itself is written
        assert 1 <= len(summaries) <= 2  # one per 10 s interval, and what close() had left
        assert len(lines) + sum(x["suppressed"] for x in summaries) == 10_000
        assert log.counts[reason] == 10_000


def test_one_source_s_flood_leaves_the_reason_room_for_another_source() -> None:
    """One address flooding for a minute takes its own rate of the reason's bucket, which
    refills faster: a refusal from another address is still written at the end."""
    clock = Clock()
    written: list[dict[str, Any]] = []
    log = RefusalLog(written.append, clock=clock)
    for _ in range(60_000):
        log.refused("bad_signature", "10.6.6.6", "query")
        clock.now += 0.001
    log.refused("bad_signature", "10.7.7.7", "query")
    lines = [x["address"] for x in written if x["event"] == "auth_refused"]
    assert lines[-1] == "10.7.7.7"
    assert lines.count("10.6.6.6") <= log.burst + log.rate * 60 + 1


def test_an_unknown_reason_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="not one of"):
        RefusalLog().refused("whatever", "10.0.0.1", "")


def test_metrics_count_refusals_by_reason_from_the_allow_list(hub: Hub) -> None:
    counts = dict.fromkeys(REASONS, 0) | {"expired": 3, "bad_signature": 12_345_678}
    snapshot = dataclasses.replace(hub.snapshot(detail=False), auth_refusals=counts)
    text = render_metrics(snapshot)
    assert 'pvwire_auth_refusals_total{reason="expired"} 3\n' in text
    assert 'pvwire_auth_refusals_total{reason="bad_signature"} 12345678\n' in text
    rows = [line for line in text.splitlines() if line.startswith("pvwire_auth_refusals_total")]
    assert len(rows) == len(REASONS)


@pytest.mark.parametrize(
    ("body", "operation"),
    [
        ({"query": "mutation($id: String!) { put(id: $id, value: 1) { ok } }"}, "mutation put"),
        ({"query": '{ get(id: "x") { value } }'}, "query get"),
        ({"query": 'query { a: get(id: "x") { value } }'}, "query get"),
        ({"query": 'mutation SetIt { put(id: "x", value: 1) { ok } }'}, "mutation SetIt"),
        ({"query": "query Q { x }", "operationName": "Q"}, "query Q"),
        ({"query": 12}, "graphql"),
        ([1, 2], "graphql"),
    ],
)
def test_the_graphql_operation_is_named(body: Any, operation: str) -> None:
    assert graphql_operation(json.dumps(body).encode(), {}) == operation


def test_a_get_request_and_an_unparsable_body_are_named_too() -> None:
    assert graphql_operation(b"", {"query": "{ server { version } }"}) == "query server"
    assert graphql_operation(b"\xff{", {}) == "graphql"
