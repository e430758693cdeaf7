"""Every error code the server can send has an exception class of its own in the Python client,
so a script can catch what it means (`except NoHistory:`) rather than compare strings, and the
client's own codes never collide with the server's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pvwire_client import errors

SERVER = Path(__file__).resolve().parent.parent / "server" / "pvwire"
# `code = "X"` on an error class; `extensions={"code": "X"}` on a GraphQL error built in place.
CODE = re.compile(r'(?:^\s+code = |extensions=\{"code": )"([A-Z_]+)"', re.M)


def server_codes() -> set[str]:
    codes = {c for f in SERVER.rglob("*.py") for c in CODE.findall(f.read_text())}
    codes.discard("ERROR")  # the base class's: no server error is raised as that
    return codes


def test_the_server_s_codes_are_found() -> None:
    # The scan above is what the next tests rely on: it must see the codes we know of.
    assert {"NOT_FOUND", "UNAVAILABLE", "NO_HISTORY", "BAD_REQUEST", "TOO_LARGE"} <= server_codes()


@pytest.mark.parametrize("code", sorted(server_codes()))
def test_each_server_code_has_its_own_class(code: str) -> None:
    error = errors.error_for(code, "what went wrong", id="ca://X")
    assert type(error) is not errors.PvwireError, f"{code} has no class in pvwire_client.errors"
    assert type(error).code == error.code == code
    assert type(error).__name__ in errors.__all__
    assert error.id == "ca://X" and str(error) == "ca://X: what went wrong"


def test_the_client_s_own_codes_are_not_the_server_s() -> None:
    own = {errors.ServerUnavailable.code, errors.StreamClosed.code, errors.StreamRefused.code}
    assert not own & server_codes()
