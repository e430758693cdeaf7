"""`pvwire-server`: serve, run the demo IOC, or both for `make run`."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import importlib.util
import json
import logging
import logging.config
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from .limits import number
from .logs import TEXT_FORMAT, logging_config
from .loopback import apply_loopback_env

__all__ = ["build_parser", "main"]

DEV_PACKAGE = "pvwire_dev"  # the demo IOC: in the repository's dev install, not in the wheel
DEMO_COMMANDS = ("demo-ioc", "run-demo")


def _demo_setup(args: argparse.Namespace) -> None:
    """The demo commands need the demo IOC, which the server's wheel and image leave out: say
    where it comes from rather than fail with a traceback; then the demo's default prefix."""
    if importlib.util.find_spec(DEV_PACKAGE) is None:
        sys.exit(
            f"pvwire-server: {args.command} needs the demo IOC (the package {DEV_PACKAGE}), "
            "which comes with pvwire's source repository, not with its wheel or image: in a "
            "checkout, run `make run`, or install it there with `pip install -e .`"
        )
    from pvwire_dev.demo_ioc import DEMO_PREFIX

    if args.prefix is None:
        args.prefix = DEMO_PREFIX


def _settings(args: argparse.Namespace) -> Any:
    from .config import Settings

    settings = Settings.load(Path(args.config) if args.config else None)
    overrides = {
        "host": args.host,
        "port": args.port,
        "tick_ms": args.tick_ms,
        "default_scheme": args.default_scheme,
        "stall_timeout_s": args.stall_timeout,
        "send_budget": args.send_budget,
        "heartbeat_s": args.heartbeat,
        "linger_s": args.linger,
        "not_found_s": args.not_found_s,
        "history_mb": args.history_mb,
        "history_array_max": args.history_array_max,
        "aa_prefix": args.aa_prefix,
        "aa_points_per_s": args.aa_points_per_s,
        "archive_timeout_s": args.archive_timeout,
        "archive_cache_mb": args.archive_cache_mb,
        "access_rules": args.access_rules,
        "audit_log": args.audit_log,
        "jwt_secret_file": args.jwt_secret_file,
        "jwks_file": args.jwks_file,
        "oidc_issuer": args.oidc_issuer,
        "oidc_client_id": args.oidc_client_id,
        "jwt_issuer": args.jwt_issuer,
        "jwt_audience": args.jwt_audience,
        "jwt_groups_claim": args.jwt_groups_claim,
        "jwt_user_claim": args.jwt_user_claim,
        "user_header": args.user_header,
        "groups_header": args.groups_header,
        "catalogue_file": args.catalogue_file,
        "status_prefix": args.status_prefix,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "drain_delay_s": args.drain_delay,
        "drain_window_s": args.drain_window,
        "log_format": args.log_format,
        "log_level": args.log_level,
    }
    settings.update({k: v for k, v in overrides.items() if v is not None})
    if args.write_rule:
        settings.write_rules = [*settings.write_rules, *args.write_rule]
    if args.catalogue:
        settings.catalogue = [*settings.catalogue, *args.catalogue]
    if args.history_channels:
        settings.history_channels = [*settings.history_channels, *args.history_channels]
    if args.archiver:
        settings.archivers = [*settings.archivers, *args.archiver]
    if args.admin_group:
        settings.admin_groups = [*settings.admin_groups, *args.admin_group]
    if args.trusted_proxy:
        settings.trusted_proxies = [*settings.trusted_proxies, *args.trusted_proxy]
    if args.jwt_authorized_party:
        settings.jwt_authorized_parties = [
            *settings.jwt_authorized_parties,
            *args.jwt_authorized_party,
        ]
    if args.oidc_allow_http:
        settings.oidc_allow_http = True
    if args.jwt_any_audience:
        settings.jwt_any_audience = True
    if args.no_sim:
        settings.sim_enabled = False
    if args.forward_identity:
        settings.forward_identity = True
    if args.token_key:
        settings.token_keys = {**settings.token_keys, "cli": args.token_key}
        settings.token_kid = "cli"
    return settings


def _check_catalogue_file(settings: Any) -> None:
    """A catalogue file named at start must be readable: a typo in its path should stop the
    server with a clear message, not leave search quietly short of names."""
    from .config import read_catalogue

    if settings.catalogue_file:
        try:
            read_catalogue(Path(settings.catalogue_file))
        except (OSError, UnicodeDecodeError) as exc:
            sys.exit(f"pvwire-server: catalogue file {settings.catalogue_file}: {exc}")


def _check_bearer_keys(settings: Any) -> None:
    """An OIDC issuer or a JWKS file that would accept any client's tokens, or an issuer whose
    keys are fetched in the clear, stops the server at start with the option to set, not at the
    first token. An HS256 secret is pvwire's own: without an audience, a warning."""
    from .access.oidc import check_audience, check_issuer

    audience, parties = settings.jwt_audience, settings.jwt_authorized_parties
    any_audience = settings.jwt_any_audience
    try:
        if settings.oidc_issuer:
            check_issuer(
                settings.oidc_issuer, audience, parties, settings.oidc_allow_http, any_audience
            )
        if settings.jwks_file:
            check_audience(f"--jwks-file {settings.jwks_file}", audience, parties, any_audience)
    except ValueError as exc:
        sys.exit(f"pvwire-server: {exc}")
    if settings.jwt_secret_file and not (audience or parties or any_audience):
        logging.getLogger("pvwire.access").warning(
            "--jwt-secret-file %s: tokens are accepted whatever their audience; if another "
            "service signs with this secret too, its tokens count here: give pvwire's tokens "
            "an audience and set --jwt-audience (or --jwt-authorized-party)",
            settings.jwt_secret_file,
        )


def _check_tls(settings: Any) -> None:
    """A certificate and key that cannot serve stop the server at start, saying why."""
    from .tls import tls_context

    if bool(settings.tls_cert) != bool(settings.tls_key):
        sys.exit("pvwire-server: --tls-cert and --tls-key go together")
    if settings.tls_cert:
        try:
            tls_context(Path(settings.tls_cert), Path(settings.tls_key))
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            sys.exit(f"pvwire-server: TLS certificate {settings.tls_cert}, key "
                     f"{settings.tls_key}: {exc}")  # fmt: skip


def _check_port_free(host: str, port: int) -> None:
    """Stop before printing or starting anything when another program holds the port."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                sys.exit(f"pvwire-server: cannot listen on {host}:{port}: {exc.strerror}")
            other = port + 12 if port < 65_000 else 8092
            sys.exit(
                f"pvwire-server: port {port} on {host} is already in use by another program.\n"
                f"Pick another port: `make run PORT={other}`, `--port {other}`, "
                f"or PVWIRE_PORT={other}."
            )


def _ignore_sighup_until_served() -> None:
    """Without a handler SIGHUP would end the process at once (uvicorn handles only INT and
    TERM), as `systemctl reload` should be harmless. The app's lifespan installs the handler
    that reloads (`Hub.reload`); until then, while the app starts, SIGHUP does nothing: the
    files are being read anyway. A handler, not SIG_IGN, which child processes (IOCs) would
    inherit. With --workers, uvicorn's supervisor answers SIGHUP by restarting the workers,
    which read them afresh."""
    signal.signal(signal.SIGHUP, lambda *_: None)


def serve(settings: Any, workers: int = 1) -> None:
    import uvicorn

    from .logs import logging_config

    common: dict[str, Any] = dict(
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        # uvicorn's websockets-sansio, with several frames in one write (pvws/wsprotocol.py).
        ws="pvwire.pvws.wsprotocol:WebSocketProtocol",
        # uvicorn's httptools with deadlines and connections counted at accept
        # (api/http_protocol.py); by name, so that every worker of --workers loads it too.
        http="pvwire.api.http_protocol:HttpProtocol",
        # Browsers ask for per-message deflate; it cut 64 KB frames from 13,500/s to 623/s.
        ws_per_message_deflate=False,
        ws_max_size=settings.max_in_bytes,
        ws_ping_interval=settings.ws_ping_interval_s,
        ws_ping_timeout=number("ws_ping_timeout_s"),
        log_level=settings.log_level,
        log_config=logging_config(settings.log_format, settings.log_level),
        access_log=False,
        timeout_graceful_shutdown=round(number("shutdown_grace_s")),
        # Off: uvicorn would take the client's address from X-Forwarded-For (trusting 127.0.0.1
        # by default) before pvwire looks. --trusted-proxy alone decides (access/forwarded.py).
        proxy_headers=False,
    )
    if settings.tls_cert:
        from .tls import listener_context

        # pvwire's own context, whose pair is read again on change (tls.py).
        common.update(ssl_certfile=settings.tls_cert, ssl_keyfile=settings.tls_key,
                      ssl_context_factory=listener_context)  # fmt: skip
        # uvloop, with handshakes under pvwire's deadline (api/tls_handshakes.py).
        common.update(loop="pvwire.api.tls_handshakes:Loop")
    if workers > 1:
        if not settings.token_keys:
            sys.exit(
                "pvwire-server: --workers needs a shared token key (--token-key or "
                "PVWIRE_TOKEN_KEY) so every worker accepts every token"
            )
        from .app import SETTINGS_ENV, WORKERS_ENV

        os.environ[SETTINGS_ENV] = json.dumps(dataclasses.asdict(settings))
        os.environ[WORKERS_ENV] = str(workers)
        uvicorn.run("pvwire.app:app_from_env", factory=True, workers=workers, **common)
        return
    from .app import create_app

    _ignore_sighup_until_served()
    app = create_app(settings)
    uvicorn.run(app, **common)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pvwire-server", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def server_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
        p.add_argument("--port", type=int, help="port to listen on (default 8080)")
        p.add_argument("--config", help="TOML settings file")
        p.add_argument("--tick-ms", type=float, help="frame interval under load (default 20)")
        p.add_argument("--default-scheme", choices=["ca", "pva", "sim"])
        p.add_argument("--write-rule", action="append", help="glob of writable channel ids")
        p.add_argument("--catalogue", action="append", help="channel id offered by search")
        p.add_argument(
            "--catalogue-file",
            metavar="PATH",
            help="file of channel ids offered by search, one per line, # comments; "
            "read again when it changes or on SIGHUP",
        )
        p.add_argument("--token-key", help="HMAC key for stream tokens (or PVWIRE_TOKEN_KEY)")
        p.add_argument("--stall-timeout", type=float, help="seconds before 4008 SLOW")
        p.add_argument("--send-budget", type=int, help="bytes queued per client")
        p.add_argument("--heartbeat", type=float, help="seconds of silence before HEARTBEAT")
        p.add_argument("--linger", type=float, help="seconds an unwatched monitor stays open")
        p.add_argument("--not-found-s", type=float, help="seconds before NOT_FOUND (default 5)")
        p.add_argument("--no-sim", action="store_true", help="switch sim:// channels off")
        p.add_argument(
            "--history-mb",
            type=float,
            help="memory for recent history, all channels together (default 128, ~2,700 "
            "channels; 0 = off)",
        )
        p.add_argument(
            "--history-array-max",
            type=int,
            metavar="N",
            help="keep the recent history of numeric arrays of at most N elements too (up to "
            "1,024; from the same --history-mb; default 0 = arrays keep none)",
        )
        p.add_argument(
            "--aa-prefix",
            metavar="PATH",
            help="where the Archiver Appliance retrieval API is served (default /retrieval; "
            "'' = off; docs/ARCHIVER.md)",
        )
        p.add_argument(
            "--aa-points-per-s",
            type=float,
            help="samples that API answers per identity per second (default 1,000,000)",
        )
        p.add_argument(
            "--archiver",
            action="append",
            metavar="[GLOB=]URL",
            help="the facility's Archiver Appliance retrieval URL, read for the past older "
            "than the recent history: for every channel, or GLOB=URL for the channels whose id "
            "or PV name matches (repeatable, the first match wins; docs/ARCHIVER.md)",
        )
        p.add_argument(
            "--archive-timeout",
            type=float,
            metavar="S",
            help="longest one request waits for its archivers (default 5 s): then its archive "
            "part is missing, and said so",
        )
        p.add_argument(
            "--archive-cache-mb",
            type=float,
            help="memory for archivers' answers kept for repeated reads (default 64)",
        )
        p.add_argument(
            "--history-channels",
            action="append",
            metavar="GLOB",
            help="channel id, or glob over the catalogue, recorded from start (repeatable)",
        )
        p.add_argument("--access-rules", help="TOML access rules (reloaded on change, SIGHUP)")
        p.add_argument("--audit-log", help="JSON-lines file: one line per put, allowed or not")
        p.add_argument("--admin-group", action="append", help="group that may see clients")
        p.add_argument("--jwt-secret-file", help="HS256 secret for bearer JWTs")
        p.add_argument("--jwks-file", help="JWKS (RS256/ES256 public keys) for bearer JWTs")
        p.add_argument("--oidc-issuer", help="OIDC provider whose keys (discovered, refreshed "
                       "on rotation) check bearer JWTs; its URL is the required `iss`")  # fmt: skip
        p.add_argument("--oidc-client-id", help="public client the page signs in with (PKCE)")
        p.add_argument("--oidc-allow-http", action="store_true", help="allow an http:// "
                       "issuer off loopback (its keys travel unprotected)")  # fmt: skip
        p.add_argument("--jwt-issuer", help="required `iss` of bearer JWTs")
        p.add_argument("--jwt-audience", help="required `aud` of bearer JWTs (with "
                       "--oidc-issuer or --jwks-file, this or --jwt-authorized-party is "
                       "required)")  # fmt: skip
        p.add_argument("--jwt-authorized-party", action="append", metavar="CLIENT_ID",
                       help="client whose tokens are accepted, by `azp` (repeatable)")  # fmt: skip
        p.add_argument("--jwt-any-audience", action="store_true", help="accept tokens of any "
                       "audience from --oidc-issuer or --jwks-file (else one of the two above "
                       "is required)")  # fmt: skip
        p.add_argument("--jwt-groups-claim", help="claim holding the groups (default groups)")
        p.add_argument("--jwt-user-claim", help="claim naming the user, as the rules and the "
                       "IOC see it (default preferred_username; docs/ACCESS.md)")  # fmt: skip
        p.add_argument("--trusted-proxy", action="append", help="CIDR of a proxy whose "
                       "--user-header and X-Forwarded-For are believed (repeatable)")  # fmt: skip
        p.add_argument("--user-header", help="header a trusted proxy puts the user name in")
        p.add_argument("--groups-header", help="header with comma-separated groups (proxy)")
        p.add_argument(
            "--forward-identity",
            action="store_true",
            help="CA and PVA puts of a signed-in user carry the user's name to the IOC, whose "
            "access security then decides; anonymous CA and PVA puts are refused "
            "(PVWIRE_FORWARD_IDENTITY)",
        )
        p.add_argument(
            "--status-prefix",
            metavar="PREFIX",
            help="serve the server's own figures as PVA PVs PREFIX + clients, channels, ... "
            "(docs/OPERATIONS.md section 7a; PVWIRE_STATUS_PREFIX)",
        )
        p.add_argument("--tls-cert", metavar="PEM", help="serve https and wss with this "
                       "certificate chain (leaf first); read again when it changes or on "
                       "SIGHUP (PVWIRE_TLS_CERT)")  # fmt: skip
        p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key "
                       "(PVWIRE_TLS_KEY)")  # fmt: skip
        p.add_argument("--drain-delay", type=float, metavar="S", help="seconds serving on "
                       "after SIGTERM, /readyz answering 503 (default 5; "
                       "PVWIRE_DRAIN_DELAY_S)")  # fmt: skip
        p.add_argument("--drain-window", type=float, metavar="S", help="seconds over which "
                       "WebSockets are then closed, paced (default 20; "
                       "PVWIRE_DRAIN_WINDOW_S)")  # fmt: skip
        p.add_argument("--workers", type=int, default=1, help="worker processes (same port)")
        p.add_argument(
            "--log-level", choices=["debug", "info", "warning", "error"], help="default info"
        )
        p.add_argument(
            "--log-format",
            choices=["text", "json"],
            help="text (default) or json: one JSON object per line",
        )
        p.add_argument(
            "--loopback", action="store_true", help="keep EPICS traffic on 127.0.0.1 (tests, demos)"
        )

    server_options(sub.add_parser("serve", help="run the server"))
    demo = sub.add_parser("demo-ioc", help="run the demo IOC (CA and PVA) until interrupted")
    prefix_help = "the demo records' name prefix (default PVWIRE:DEMO:)"
    demo.add_argument("--prefix", help=prefix_help)
    run = sub.add_parser("run-demo", help="demo IOC + server + page (what `make run` does)")
    server_options(run)
    run.add_argument("--prefix", help=prefix_help)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command in DEMO_COMMANDS:
        _demo_setup(args)

    if args.command == "demo-ioc":
        from pvwire_dev.demo_ioc import ports_or_default, start_demo_ioc

        logging.basicConfig(level=logging.INFO, format=TEXT_FORMAT)
        apply_loopback_env()
        ports = ports_or_default()
        ioc = start_demo_ioc(args.prefix, ports)
        print(
            f"demo IOC {args.prefix}* on CA port {ports.ca_server}, PVA port "
            f"{ports.pva_server}; clients need:",
            flush=True,
        )
        for k, v in ports.client_env().items():
            if k.startswith("EPICS_") and ("ADDR_LIST" in k or "PORT" in k):
                print(f"  {k}={v}", flush=True)
        _wait_for_signal()
        ioc.stop()
        return

    if args.loopback or args.command == "run-demo":
        apply_loopback_env()
    settings = _settings(args)
    try:
        logging.config.dictConfig(logging_config(settings.log_format, settings.log_level))
    except ValueError as exc:
        sys.exit(f"pvwire-server: {exc}")
    _check_port_free(settings.host, settings.port)
    _check_catalogue_file(settings)
    _check_bearer_keys(settings)
    _check_tls(settings)
    if args.command == "serve":
        serve(settings, args.workers)
        return

    from pvwire_dev.demo_ioc import (
        demo_catalogue,
        demo_write_rules,
        ports_or_default,
        start_demo_ioc,
    )

    ports = ports_or_default()
    ioc = start_demo_ioc(args.prefix, ports)
    os.environ.update(ports.client_env())
    settings.write_rules = [*settings.write_rules, *demo_write_rules(args.prefix)]
    settings.catalogue = [*settings.catalogue, *demo_catalogue(args.prefix)]
    url = f"http://{settings.host}:{settings.port}"
    print(
        f"\n  demo page   {url}/\n  GraphiQL    {url}/graphql\n  stream      "
        f"ws://{settings.host}:{settings.port}/stream\n  metrics     {url}/metrics\n"
        f"  demo IOC    {args.prefix}* (CA port {ports.ca_server}, PVA port "
        f"{ports.pva_server})\n",
        flush=True,
    )
    try:
        serve(settings, args.workers)
    finally:
        ioc.stop()


def _wait_for_signal() -> None:
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()


if __name__ == "__main__":
    main()
