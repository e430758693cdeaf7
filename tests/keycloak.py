"""A real identity provider for the tests: Keycloak (`make keycloak` unpacks it under .cache/),
in dev mode on 127.0.0.1 with free ports, from the realm file beside this module.

Realm `pvwire-test`: users `operator` (group operators) and `visitor` (group visitors), a public
client `pvwire-page` (code flow + PKCE, redirects to any 127.0.0.1 port), a public client
`pvwire-cli` (device grant), a confidential client `pvwire-service` (client credentials, its
service account in operators). Their access tokens carry `aud: pvwire` and `groups`, and live
120 s. `pvwire-other` is another application of the same realm (client credentials, service
account in operators, no audience mapper): its tokens are signed with the same keys, but are not
meant for pvwire.

Costs measured on this machine (2 cores, shared with other jobs): ~500 MB of memory; 83-90 s to
start the first time after `make keycloak` (it builds its configuration), then 34 s on a quiet
machine and 75 s under load. Hence one per test session, started only by the tests that ask.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections import deque
from pathlib import Path
from threading import Thread
from typing import Any

import httpx
import jwt
from pvwire_dev.ioc import free_port

__all__ = ["OTHER", "OTHER_SECRET", "REALM", "Keycloak", "keycloak_home"]

ROOT = Path(__file__).resolve().parent.parent
REALM = "pvwire-test"
REALM_FILE = Path(__file__).parent / "keycloak" / "realm-pvwire.json"
ADMIN, ADMIN_PASSWORD = "admin", "admin-for-tests-only"
SERVICE, SERVICE_SECRET = "pvwire-service", "pvwire-service-secret-for-tests"
OTHER, OTHER_SECRET = "pvwire-other", "pvwire-other-secret-for-tests"
USERS = {"operator": "operator-pass", "visitor": "visitor-pass"}


def keycloak_home() -> Path:
    found = sorted((ROOT / ".cache" / "keycloak").glob("keycloak-*/bin/kc.sh"))
    if not found:
        raise RuntimeError("Keycloak is not installed: run `make keycloak`")
    return found[-1].parent.parent


class Keycloak:
    def __init__(self) -> None:
        self.home = keycloak_home()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.issuer = f"{self.url}/realms/{REALM}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: deque[str] = deque(maxlen=400)
        self.start_seconds = 0.0

    def start(self, timeout: float = 300.0) -> None:
        # A fresh database each time: the realm is imported again, and no key rotated by an
        # earlier run survives.
        shutil.rmtree(self.home / "data" / "h2", ignore_errors=True)
        imports = self.home / "data" / "import"
        imports.mkdir(parents=True, exist_ok=True)
        shutil.copy(REALM_FILE, imports / REALM_FILE.name)
        env = {**os.environ, "KC_BOOTSTRAP_ADMIN_USERNAME": ADMIN,
               "KC_BOOTSTRAP_ADMIN_PASSWORD": ADMIN_PASSWORD}  # fmt: skip
        cmd = [str(self.home / "bin" / "kc.sh"), "start-dev", "--import-realm",
               "--http-host", "127.0.0.1", "--http-port", str(self.port),
               "--http-management-port", str(free_port())]  # fmt: skip
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._proc = proc

        def pump() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                self._log.append(raw.decode(errors="replace").rstrip())

        Thread(target=pump, daemon=True).start()
        discovery = f"{self.issuer}/.well-known/openid-configuration"
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"Keycloak exited ({proc.returncode}):\n{self.log()}")
            try:
                if httpx.get(discovery, timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Keycloak not ready in {timeout} s:\n{self.log()}")
            time.sleep(0.5)  # polling a child process's readiness, not synchronising a test
        self.start_seconds = time.monotonic() - started

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()  # kc.sh hands the signal to its java process
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the session started above: kc.sh and java
            proc.wait(30)
        if proc.stdout:
            proc.stdout.close()

    def log(self) -> str:
        return "\n".join(self._log)

    # --- tokens --------------------------------------------------------------------------------

    @property
    def token_endpoint(self) -> str:
        return f"{self.issuer}/protocol/openid-connect/token"

    def service_token(self, client: str = SERVICE, secret: str = SERVICE_SECRET) -> dict[str, Any]:
        """Client credentials of `pvwire-service` (its service account is an operator), or of
        another confidential client."""
        form = {"grant_type": "client_credentials", "client_id": client,
                "client_secret": secret}  # fmt: skip
        r = httpx.post(self.token_endpoint, data=form, timeout=30)
        r.raise_for_status()
        token: dict[str, Any] = r.json()
        return token

    # --- the admin REST API --------------------------------------------------------------------

    def admin(self) -> httpx.Client:
        r = httpx.post(
            f"{self.url}/realms/master/protocol/openid-connect/token",
            data={"grant_type": "password", "client_id": "admin-cli", "username": ADMIN,
                  "password": ADMIN_PASSWORD},
            timeout=30,
        )  # fmt: skip
        r.raise_for_status()
        headers = {"Authorization": f"Bearer {r.json()['access_token']}"}
        return httpx.Client(base_url=f"{self.url}/admin/realms/{REALM}", headers=headers,
                            timeout=30)  # fmt: skip

    def active_signing_kid(self) -> str:
        with self.admin() as admin:
            keys = admin.get("/keys").json()
        kid: str = keys["active"]["RS256"]
        return kid

    def rotate_rs256(self) -> str:
        """What an administrator does to rotate: a new RS256 key, active and first by priority,
        then the old ones disabled. Returns the new key id."""
        with self.admin() as admin:
            providers = admin.get(
                "/components", params={"type": "org.keycloak.keys.KeyProvider"}
            ).json()
            old = [p for p in providers if p["providerId"] in ("rsa-generated", "rsa")
                   and "enc" not in p["name"]]  # fmt: skip
            created = admin.post("/components", json={
                "name": f"rsa-rotated-{time.time_ns()}", "providerId": "rsa-generated",
                "providerType": "org.keycloak.keys.KeyProvider", "parentId": REALM,
                "config": {"priority": ["1000"], "enabled": ["true"], "active": ["true"],
                           "algorithm": ["RS256"], "keySize": ["2048"]},
            })  # fmt: skip
            created.raise_for_status()
            for p in old:
                p["config"]["enabled"] = ["false"]
                p["config"]["active"] = ["false"]
                admin.put(f"/components/{p['id']}", json=p).raise_for_status()
        return self.active_signing_kid()


def dump(token: str) -> dict[str, Any]:
    """A JWT's claims, unverified (for assertions about what the provider issued)."""
    claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
    return claims


def main() -> None:
    """`python -m tests.keycloak`: start one, print `{"url", "issuer"}` as a JSON line, stop
    at EOF on stdin (the TypeScript browser tests drive it so)."""
    import sys

    kc = Keycloak()
    try:
        kc.start()
    except RuntimeError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        raise SystemExit(1) from None
    try:
        print(json.dumps({"url": kc.url, "issuer": kc.issuer, "start_s": kc.start_seconds}),
              flush=True)  # fmt: skip
        sys.stdin.read()
    finally:
        kc.stop()


if __name__ == "__main__":
    main()
