"""Where the Python clients' token comes from when none is given (pvwire_client/login.py):
PVWIRE_TOKEN, else the token `pvwire login` stored, else anonymous. Against Keycloak:
tests/test_keycloak.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pvwire_client.login import LoginError, cache_file, default_token, stored_token

PVWIRE = str(Path(sys.executable).with_name("pvwire"))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("PVWIRE_TOKEN", raising=False)
    return tmp_path / "pvwire" / "token.json"


def store(path: Path, **fields: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    base = {"issuer": "http://idp", "client_id": "c", "access_token": "t1",
            "token_endpoint": "http://127.0.0.1:9/token"}  # fmt: skip
    path.write_text(json.dumps({**base, **fields}))


def test_the_cache_is_under_xdg_cache_home(cache: Path) -> None:
    assert cache_file() == cache


def test_nobody_logged_in_is_anonymous(cache: Path) -> None:
    assert default_token() is None
    assert stored_token() is None


def test_pvwire_token_wins_over_the_stored_one(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store(cache, expires_at=time.time() + 600)
    monkeypatch.setenv("PVWIRE_TOKEN", "from-env")
    assert default_token() == "from-env"
    monkeypatch.delenv("PVWIRE_TOKEN")
    source = default_token()
    assert callable(source) and source() == "t1"


def test_an_expired_token_without_a_way_to_renew_it_says_log_in_again(cache: Path) -> None:
    store(cache, expires_at=time.time() - 1, refresh_token="", client_secret="")
    with pytest.raises(LoginError, match="pvwire login"):
        stored_token()


def test_a_refused_renewal_is_not_authenticated_for_the_command(cache: Path) -> None:
    """Exit status 4 with the hint to log in, not a traceback."""
    store(cache, expires_at=time.time() - 1, refresh_token="", client_secret="")
    done = subprocess.run([PVWIRE, "get", "--server", "http://127.0.0.1:9", "sim://x"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 4, done.stderr
    assert "pvwire login" in done.stderr
