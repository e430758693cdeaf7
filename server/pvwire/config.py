"""Server settings: defaults here, overridden by a TOML file, `PVWIRE_*` variables and flags."""

from __future__ import annotations

import logging
import os
import secrets
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .limits import integer, number

__all__ = ["CatalogueFile", "Settings", "read_catalogue"]

log = logging.getLogger("pvwire.catalogue")


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    default_scheme: str = "ca"
    image_scheme: str = "pva"  # of a name without a scheme in /mjpeg/{name} (cs-web-lib's URLs)
    tick_ms: float = 20.0  # nominal interval between frames under load (DESIGN.md section 4)
    heartbeat_s: float = number("heartbeat_s")  # proxies drop sockets idle for ~60 s
    # WebSocket ping from the server on every connection, both endpoints (uvicorn's keepalive;
    # 20 s unanswered then ends it). It is also what a pvws client's `ping` asks for.
    ws_ping_interval_s: float = number("ws_ping_interval_s")
    send_budget: int = integer("send_budget")  # per-connection queued bytes before conflation
    stall_timeout_s: float = number("stall_timeout_s")  # no send progress: 4008 SLOW
    linger_s: float = number("linger_s")  # an unwatched channel's monitor stays open this long
    # Limits: their defaults and what they bound are pvwire/limits.py's table.
    max_in_bytes: int = integer("max_in_bytes")  # a 10,000-channel ATTACH fits
    max_channels_per_subscription: int = integer("max_channels_per_subscription")
    max_channels_per_connection: int = integer("max_channels_per_connection")
    max_query_depth: int = integer("max_query_depth")
    token_ttl_s: float = number("token_ttl_s")
    token_keys: dict[str, str] = field(default_factory=dict)  # kid -> secret
    token_kid: str = ""
    write_rules: list[str] = field(default_factory=list)  # WRITE for everyone: rule shorthand
    access_rules: str = ""  # TOML rules file (access/rules.py); reloaded on change and SIGHUP
    admin_groups: list[str] = field(default_factory=list)  # see clients in `server`; else loopback
    audit_log: str = ""  # JSON lines, one per put (also logged to pvwire.audit)
    jwt_secret_file: str = ""  # HS256 shared secret
    jwks_file: str = ""  # RS256/ES256 public keys of the site's OIDC provider
    # An OIDC provider followed over HTTP(S): discovery, then its JWKS, fetched again every
    # oidc_refresh_s and on a key id not held (at most every oidc_min_interval_s).
    oidc_issuer: str = ""
    oidc_client_id: str = ""  # the public client the page signs in with (PKCE)
    oidc_refresh_s: float = number("oidc_refresh_s")
    oidc_min_interval_s: float = number("oidc_min_interval_s")
    # Plain http to an issuer off loopback: its keys could be replaced on the way.
    oidc_allow_http: bool = False
    jwt_issuer: str = ""
    # With an OIDC issuer, one of these two is required: the provider signs every client's
    # tokens with the same keys, so only `aud` or `azp` says a token is meant for pvwire.
    jwt_audience: str = ""
    jwt_authorized_parties: list[str] = field(default_factory=list)  # accepted `azp` values
    # The same holds of a JWKS file; this says a token for any audience is meant to count.
    jwt_any_audience: bool = False
    jwt_groups_claim: str = "groups"
    # The user name the rules, the audit file and (forward_identity) the IOC's ACF see; falls
    # back to `sub`. docs/ACCESS.md says why it is preferred_username and when to change it.
    jwt_user_claim: str = "preferred_username"
    jwt_leeway_s: float = number("jwt_leeway_s")  # clock skew allowed for exp and nbf
    # CIDRs whose user header counts, and behind which the client is the right-most
    # X-Forwarded-For entry that is none of them (access/forwarded.py).
    trusted_proxies: list[str] = field(default_factory=list)
    user_header: str = ""  # e.g. X-Remote-User, from trusted proxies only
    groups_header: str = ""  # comma-separated groups, from trusted proxies only
    # CA and PVA puts by a signed-in user travel on a circuit or connection carrying that user's
    # name, so the IOC's own access security decides (docs/ACCESS.md); anonymous ones are refused.
    forward_identity: bool = False
    forward_host_name: str = ""  # host name sent on those circuits and connections; empty: ours
    max_puts_per_s: float = number("max_puts_per_s")  # per identity, bursts of twice that
    # Image bytes per second to one /pvws/pv connection (docs/PVWS.md); 0: every frame whole.
    pvws_image_bytes_per_s: float = number("pvws_image_bytes_per_s")
    max_cost_per_s: float = number("max_cost_per_s")  # GraphQL cost per identity per second
    max_connections_per_address: int = integer("max_connections_per_address")
    # Connections of the process (api/connections.py), at most its descriptor limit less a
    # reserve; distinct upstream channels of one address, over all its endpoints.
    max_connections: int = integer("max_connections")
    max_channels_per_address: int = integer("max_channels_per_address")
    # MJPEG viewers from one address, a share of the process's mjpeg_max_viewers.
    mjpeg_viewers_per_address: int = integer("mjpeg_viewers_per_address")
    max_attachments_per_connection: int = integer("max_attachments_per_connection")
    catalogue: list[str] = field(default_factory=list)  # ids offered by search
    catalogue_file: str = ""  # more ids, one per line; read again when it changes
    allowed_origins: list[str] = field(default_factory=list)  # empty: any origin
    cors_origins: list[str] = field(default_factory=list)
    get_timeout_s: float = number("get_timeout_s")
    # Updates pvxs queues per PVA monitor, here and at the IOC.
    pva_queue_size: int = integer("pva_queue_size")
    sim_enabled: bool = True  # sim:// channels (demo, tests, benchmarks); off at a facility
    sim_max_rate: float = number("sim_max_rate")  # Hz per sim channel
    sim_max_length: int = integer("sim_max_length")  # elements per sim waveform or image
    sim_max_bytes_per_s: float = number("sim_max_bytes_per_s")  # per sim channel
    max_query_cost: int = integer("max_query_cost")  # fields (aliases count each) + list ids
    # Array elements in one GraphQL response; the stream has no such cap.
    max_graphql_elements: int = integer("max_graphql_elements")
    # Any HTTP request body, refused (413) before it is read or authenticated.
    max_request_bytes: int = integer("max_request_bytes")
    # Recent history (core/history/): one memory budget for every channel's buffers, 47 KiB
    # each, so the default holds ~2,700 channels; 0 switches history off.
    history_mb: float = number("history_mb")
    # Numeric arrays of at most this many elements get a history too, from the same budget
    # (larger per channel: core/history/arrays.py); 0: arrays get none.
    history_array_max: int = integer("history_array_max")
    # Ids (globs over the catalogue) whose history is recorded from start, with no subscriber.
    history_channels: list[str] = field(default_factory=list)
    # CONNECTING this long with no server answering: NOT_FOUND.
    not_found_s: float = number("not_found_s")
    # The Archiver Appliance retrieval API (aa/, docs/ARCHIVER.md): its prefix ("" switches
    # it off) and the samples it answers per identity per second.
    aa_prefix: str = "/retrieval"
    aa_points_per_s: float = number("aa_points_per_s")
    # The server's own figures as PVA PVs named PREFIX + clients, ... (status/); empty: none.
    status_prefix: str = ""
    # TLS on the listener (tls.py): PEM files, read again when they change and on SIGHUP.
    tls_cert: str = ""  # the certificate chain, leaf first
    tls_key: str = ""
    # SIGTERM (core/drain.py): /readyz says 503 and serving goes on for drain_delay_s, then
    # every WebSocket is closed, paced over drain_window_s, and the process exits.
    drain_delay_s: float = number("drain_delay_s")
    drain_window_s: float = number("drain_window_s")
    # The facility's archive behind the history (core/archive/, docs/ARCHIVER.md): Archiver
    # Appliance retrieval URLs, each `URL` (every channel) or `GLOB=URL` (channels whose id or
    # PV name matches), the first that matches a channel's; a list, so that the order is the
    # same from a flag, a variable or a TOML file.
    archivers: list[str] = field(default_factory=list)
    archive_timeout_s: float = number("archive_timeout_s")  # one request's archive reads
    archive_cache_mb: float = number("archive_cache_mb")  # archivers' answers kept
    instance: str = field(default_factory=lambda: os.uname().nodename)
    log_format: str = "text"  # or "json": one object per line, for sites that ship logs
    log_level: str = "info"

    @classmethod
    def load(cls, path: Path | None = None, env: dict[str, str] | None = None) -> Settings:
        """Defaults, then the TOML file, then PVWIRE_<FIELD> variables (lists comma-separated)."""
        settings = cls()
        if path is not None:
            settings.update(tomllib.loads(path.read_text()))
        env = dict(os.environ) if env is None else env
        for f in fields(cls):
            raw = env.get(f"PVWIRE_{f.name.upper()}")
            if raw is not None:
                settings.update({f.name: raw})
        if secret := env.get("PVWIRE_TOKEN_KEY"):
            settings.token_keys = {settings.token_kid or "k1": secret, **settings.token_keys}
        return settings

    def update(self, values: dict[str, Any]) -> None:
        types = {f.name: f.type for f in fields(self)}
        for key, value in values.items():
            key = key.replace("-", "_")
            if key not in types:
                raise ValueError(f"unknown setting {key!r}")
            current = getattr(self, key)
            if isinstance(value, str) and not isinstance(current, str):
                value = _parse(value, current)
            setattr(self, key, value)

    def signing_keys(self) -> tuple[dict[str, bytes], str]:
        """Keys for tokens; a random key for this process when none is configured.

        A random key means tokens work only with this process: fine for one server, but replicas
        must share a key (a Kubernetes Secret) so any of them can serve any token.
        """
        keys = {k: v.encode() for k, v in self.token_keys.items()}
        if not keys:
            keys = {"local": secrets.token_bytes(32)}
        kid = self.token_kid if self.token_kid in keys else sorted(keys)[-1]
        return keys, kid


def _parse(raw: str, like: Any) -> Any:
    if isinstance(like, bool):
        return raw.lower() in ("1", "true", "yes", "on")
    if isinstance(like, int):
        return int(raw)
    if isinstance(like, float):
        return float(raw)
    if isinstance(like, list):
        return [x.strip() for x in raw.split(",") if x.strip()]
    if isinstance(like, dict):
        pairs = (x.split("=", 1) for x in raw.split(",") if "=" in x)
        return {k.strip(): v.strip() for k, v in pairs}
    return raw


def read_catalogue(path: Path) -> list[str]:
    """Channel ids from a file: one per line, `#` starts a comment, blank lines are skipped.

    Raises OSError or UnicodeDecodeError when the file cannot be read as text.
    """
    ids = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if name := line.partition("#")[0].strip():
            ids.append(name)
    return ids


class CatalogueFile:
    """A catalogue file, read again when its modification time or size changes, or on request.

    A file that cannot be read keeps the ids loaded before, and says why once per change of the
    file (not once per poll), so a missing file does not flood the log.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ids: tuple[str, ...] = ()
        self.loaded = False  # ids came from the file at least once
        self._signature: tuple[int, int] | None = None  # (mtime ns, size) of what was read
        self._failed: object = None  # what the last failure saw, so it is logged once
        self._reload_requested = False

    def request_reload(self) -> None:
        """Read the file at the next poll even if it looks unchanged (SIGHUP). Signal-safe."""
        self._reload_requested = True
        self._failed = None  # an operator asking again hears again why it fails

    def poll(self) -> bool:
        """Read the file if it changed; True if the ids changed."""
        try:
            st = self.path.stat()
        except OSError as exc:
            self._fail(("stat", exc.errno), exc)
            return False
        signature = (st.st_mtime_ns, st.st_size)
        if signature == self._signature and not self._reload_requested:
            return False
        self._reload_requested = False
        try:
            ids = tuple(read_catalogue(self.path))
        except (OSError, UnicodeDecodeError) as exc:
            self._fail(signature, exc)
            return False
        self._signature, self._failed = signature, None
        changed = ids != self.ids or not self.loaded
        if changed:
            log.info("catalogue file %s: %d channel ids", self.path, len(ids))
        self.ids, self.loaded = ids, True
        return changed

    def _fail(self, seen: object, exc: Exception) -> None:
        if seen == self._failed:
            return
        self._failed = seen
        log.error(
            "catalogue file %s cannot be read (%s); keeping the %d ids loaded before",
            self.path,
            exc,
            len(self.ids),
        )
