"""``pvwire login``: a token from the site's identity provider, kept for the clients.

A person signs in with the OAuth 2.0 device authorization grant (RFC 8628): ``pvwire login``
prints a URL and a code, the person approves it in any browser, and the token (with its refresh
token) is stored. A service uses its own client's secret (client credentials) instead:
``pvwire login --client-id ID --client-secret-file PATH``.

The token is stored in ``$XDG_CACHE_HOME/pvwire/token.json`` (``~/.cache/pvwire``), mode 0600,
with what renewing it needs: the refresh token, or for a service its client secret (a file only
its user can read, like the secret file it came from). Both clients use it when ``PVWIRE_TOKEN``
is not set, renewed when it has expired or is about to (``default_token``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import Unauthenticated

if TYPE_CHECKING:  # imported when used: `default_token` runs in every command, and must be quick
    import httpx

__all__ = ["LoginError", "cache_file", "default_token", "login", "stored_token"]

RENEW_MARGIN_S = 30.0  # renewed this long before it expires: a request in flight still carries it
TIMEOUT_S = 30.0


class LoginError(Unauthenticated):
    """The identity provider refused, or the stored token cannot be renewed: like a token the
    server refused, so callers (and the command's exit status, 4) treat both alike."""


def cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pvwire" / "token.json"


def _discover(http: httpx.Client, server: str, issuer: str, client_id: str) -> dict[str, str]:
    """The provider's issuer and endpoints: given, or as the pvwire server names them."""
    if not issuer:
        auth = http.get(server.rstrip("/") + "/auth.json").json()
        issuer = str(auth.get("issuer") or "")
        client_id = client_id or str(auth.get("clientId") or "")
        if not issuer:
            raise LoginError(f"{server} names no identity provider (give --issuer)")
    if not client_id:
        raise LoginError("no client id (give --client-id)")
    doc = http.get(issuer.rstrip("/") + "/.well-known/openid-configuration").json()
    if doc.get("issuer") != issuer:
        raise LoginError(f"the provider names issuer {doc.get('issuer')!r}, not {issuer!r}")
    return {"issuer": issuer, "client_id": client_id, "token_endpoint": doc["token_endpoint"],
            "device_endpoint": doc.get("device_authorization_endpoint", "")}  # fmt: skip


def _token_request(http: httpx.Client, endpoint: str, form: Mapping[str, str]) -> dict[str, Any]:
    r = http.post(endpoint, data=dict(form))
    body: dict[str, Any] = r.json()
    if r.status_code != 200:
        raise LoginError(f"{body.get('error', r.status_code)}: {body.get('error_description', '')}")
    return body


def login(
    server: str = "",
    *,
    issuer: str = "",
    client_id: str = "",
    client_secret: str = "",
    show: Callable[[str], None] = print,
    path: Path | None = None,
) -> dict[str, Any]:
    """Sign in and store the token; returns what was stored. Without a secret: the device grant
    (`show` is handed the URL and code to visit, and this waits until they are approved)."""
    import httpx

    with httpx.Client(timeout=TIMEOUT_S) as http:
        where = _discover(http, server, issuer, client_id)
        form = {"client_id": where["client_id"], "scope": "openid"}
        if client_secret:
            grant = {"grant_type": "client_credentials", "client_secret": client_secret}
            body = _token_request(http, where["token_endpoint"], form | grant)
        else:
            if not where["device_endpoint"]:
                raise LoginError(f"{where['issuer']} offers no device authorization grant")
            device = _token_request(http, where["device_endpoint"], form)
            url = device.get("verification_uri_complete") or device["verification_uri"]
            show(f"To sign in, visit {url} and enter the code {device['user_code']}")
            body = _poll(http, where["token_endpoint"], where["client_id"], device)
    stored = {**where, "client_secret": client_secret, **_times(body)}
    _store(stored, path or cache_file())
    return stored


def _poll(
    http: httpx.Client, endpoint: str, client_id: str, device: Mapping[str, Any]
) -> dict[str, Any]:
    interval = float(device.get("interval", 5))
    deadline = time.monotonic() + float(device.get("expires_in", 600))
    form = {"grant_type": "urn:ietf:params:oauth:grant-type:device_code",
            "device_code": device["device_code"], "client_id": client_id}  # fmt: skip
    while time.monotonic() < deadline:
        time.sleep(interval)  # RFC 8628 section 3.5: the provider sets the pace
        r = http.post(endpoint, data=form)
        body: dict[str, Any] = r.json()
        if r.status_code == 200:
            return body
        error = body.get("error")
        if error == "slow_down":
            interval += 5
        elif error != "authorization_pending":
            raise LoginError(f"{error}: {body.get('error_description', '')}")
    raise LoginError("the code expired before it was approved")


def _times(body: Mapping[str, Any]) -> dict[str, Any]:
    now = time.time()
    return {"access_token": body["access_token"], "expires_at": now + float(body["expires_in"]),
            "refresh_token": body.get("refresh_token", "")}  # fmt: skip


def _store(stored: Mapping[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Created 0600 before anything is written: never readable by others, not even briefly.
    fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(stored, f)
    os.replace(path.with_suffix(".tmp"), path)


def stored_token(path: Path | None = None) -> str | None:
    """The stored access token, renewed first when it expires within RENEW_MARGIN_S; None when
    no one logged in. Raises LoginError when renewal is refused (log in again)."""
    path = path or cache_file()
    try:
        stored = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    if time.time() < float(stored["expires_at"]) - RENEW_MARGIN_S:
        return str(stored["access_token"])
    form = {"client_id": stored["client_id"]}
    if stored.get("client_secret"):
        form |= {"grant_type": "client_credentials", "client_secret": stored["client_secret"]}
    elif stored.get("refresh_token"):
        form |= {"grant_type": "refresh_token", "refresh_token": stored["refresh_token"]}
    else:
        raise LoginError("the stored token expired and cannot be renewed: pvwire login")
    import httpx

    with httpx.Client(timeout=TIMEOUT_S) as http:
        body = _token_request(http, stored["token_endpoint"], form)
    renewed = {**stored, **_times(body)}
    if not body.get("refresh_token"):
        renewed["refresh_token"] = stored.get("refresh_token", "")
    _store(renewed, path)
    return str(renewed["access_token"])


def default_token() -> str | Callable[[], str | None] | None:
    """Where a client's token comes from when none is given: ``PVWIRE_TOKEN``, else the token
    ``pvwire login`` stored (renewed when it expires), else none (anonymous)."""
    env = os.environ.get("PVWIRE_TOKEN")
    if env is not None:
        return env
    return stored_token if cache_file().exists() else None
