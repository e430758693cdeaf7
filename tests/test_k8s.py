"""The Kubernetes manifests agree with the server they deploy, and every one is valid against the
Kubernetes API schemas (kubernetes-validate --strict, offline; no cluster here to apply them)."""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pvwire import limits
from pvwire.app import create_app
from pvwire.config import Settings
from pvwire.upstream.loc import LocBackend
from starlette.routing import Match, Mount

ROOT = Path(__file__).resolve().parent.parent / "k8s"
K8S = ROOT / "base"
GATEWAY = ROOT / "overlays" / "gateway"
MANIFESTS = sorted(p for p in ROOT.rglob("*.yaml") if p.name != "kustomization.yaml")
VALIDATE = Path(sys.executable).with_name("kubernetes-validate")


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((K8S / name).read_text())
    return doc


def test_kustomization_lists_every_manifest() -> None:
    listed = set(load("kustomization.yaml")["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert listed == present
    assert yaml.safe_load((ROOT / "kustomization.yaml").read_text())["resources"] == ["base"]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_manifest_is_valid_kubernetes(path: Path) -> None:
    p = subprocess.run(
        [str(VALIDATE), "--strict", "--quiet", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr


def overlay_docs() -> list[dict[str, Any]]:
    """The gateway overlay as kustomize builds it: the base's resources, the overlay's, and its
    patches merged in (they only touch ConfigMap data, a plain map merge)."""
    kust = yaml.safe_load((GATEWAY / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for resource in kust["resources"]:
        path = (GATEWAY / resource).resolve()
        if path.is_dir():
            base = yaml.safe_load((path / "kustomization.yaml").read_text())["resources"]
            docs += [yaml.safe_load((path / r).read_text()) for r in base]
        else:
            docs.append(yaml.safe_load(path.read_text()))
    for patch in kust["patches"]:
        change = yaml.safe_load((GATEWAY / patch["path"]).read_text())
        (target,) = [
            d for d in docs
            if (d["kind"], d["metadata"]["name"]) == (change["kind"], change["metadata"]["name"])
        ]  # fmt: skip
        assert change["kind"] == "ConfigMap" and set(change) == {
            "apiVersion",
            "kind",
            "metadata",
            "data",
        }
        target["data"].update(change["data"])
    return docs


def test_gateway_overlay_builds_valid_kubernetes(tmp_path: Path) -> None:
    listed = set(yaml.safe_load((GATEWAY / "kustomization.yaml").read_text())["resources"])
    present = {p.name for p in GATEWAY.glob("pvagw-*.yaml")}
    assert listed - {"../../base"} == present
    built = tmp_path / "gateway.yaml"
    built.write_text(yaml.safe_dump_all(overlay_docs()))
    p = subprocess.run(
        [str(VALIDATE), "--strict", "--quiet", str(built)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr


def test_gateway_overlay_points_pvwire_at_the_gateway(tmp_path: Path) -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in overlay_docs()}
    env = {k: str(v) for k, v in docs["ConfigMap", "pvwire-config"]["data"].items()}
    service = docs["Service", "pvagw"]
    (port,) = service["spec"]["ports"]
    assert env["EPICS_PVA_NAME_SERVERS"] == f"pvagw:{port['port']}"
    assert env["EPICS_PVA_AUTO_ADDR_LIST"] == "NO" and env["EPICS_PVA_ADDR_LIST"] == ""
    gw = docs["Deployment", "pvagw"]["spec"]
    pod = gw["template"]["spec"]
    assert gw["replicas"] == 1 and pod["hostNetwork"] is True
    assert service["spec"]["selector"] == gw["template"]["metadata"]["labels"]
    # The configuration is the one pvagw reads: let pvagw itself check it.
    conf = tmp_path / "gw.conf"
    conf.write_text(docs["ConfigMap", "pvagw-config"]["data"]["gw.conf"])
    (container,) = pod["containers"]
    assert container["command"][:3] == ["python", "-m", "p4p.gw"]
    assert container["command"][3] == f"{container['volumeMounts'][0]['mountPath']}/gw.conf"
    p = subprocess.run(
        [sys.executable, "-m", "p4p.gw", "--test-config", str(conf)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    assert Settings.load(env=env).default_scheme == "pva"


def test_config_map_names_only_real_settings() -> None:
    fields = {f"PVWIRE_{f.name.upper()}" for f in dataclasses.fields(Settings)}
    for key in load("configmap.yaml")["data"]:
        assert key.startswith("EPICS_") or key in fields, key
    data = load("configmap.yaml")["data"]
    assert data["EPICS_CA_AUTO_ADDR_LIST"] == "NO" and data["EPICS_PVA_AUTO_ADDR_LIST"] == "NO"


def test_settings_from_the_config_map_parse() -> None:
    env = {k: str(v) for k, v in load("configmap.yaml")["data"].items()}
    env["PVWIRE_TOKEN_KEY"] = "k"
    settings = Settings.load(env=env)
    assert settings.tick_ms == 20.0 and settings.write_rules == []
    assert settings.signing_keys()[0] == {"k1": b"k"}


def test_probes_and_ports_match_the_server() -> None:
    container = load("deployment.yaml")["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["args"][:1] == ["serve"] and "8080" in container["args"]
    secret = container["env"][0]
    assert secret["name"] == "PVWIRE_TOKEN_KEY" and secret["valueFrom"]["secretKeyRef"]


def test_selectors_agree() -> None:
    labels = load("deployment.yaml")["spec"]["template"]["metadata"]["labels"]
    assert load("service.yaml")["spec"]["selector"] == labels
    assert load("pdb.yaml")["spec"]["selector"]["matchLabels"] == labels
    assert load("hpa.yaml")["spec"]["scaleTargetRef"]["name"] == "pvwire"


@pytest.mark.parametrize("path", [ROOT, GATEWAY], ids=["base", "gateway"])
def test_kustomize_builds_valid_kubernetes(path: Path, tmp_path: Path) -> None:
    """What `kubectl apply -k` sends, rendered by kustomize itself (`make kustomize`)."""
    kustomize = ROOT.parent / ".tools" / "kustomize"
    assert kustomize.is_file(), "make kustomize"
    built = subprocess.run(
        [str(kustomize), "build", str(path)], capture_output=True, text=True, timeout=60
    )
    assert built.returncode == 0, built.stderr
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    if path == GATEWAY:  # the hand-made rendering above agrees with kustomize's
        canonical = functools.partial(json.dumps, sort_keys=True)
        assert sorted(map(canonical, docs)) == sorted(map(canonical, overlay_docs()))
    out = tmp_path / "built.yaml"
    out.write_text(built.stdout)
    p = subprocess.run(
        [str(VALIDATE), "--strict", "--quiet", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr


def routed(path: str, kind: str) -> bool:
    """Whether a route of the server as assembled, not the page (mounted last, it answers every
    other path), answers a GET or a WebSocket (`kind`) at `path`; no socket opened."""
    app = create_app(Settings(), backends={"loc": LocBackend()})
    *routes, page = app.router.routes
    assert isinstance(page, Mount) and page.path == ""
    scope = {"type": kind, "path": path, "root_path": "", "method": "GET", "headers": []}
    return any(r.matches(scope)[0] is Match.FULL for r in routes)


def ingress_backends(ingress: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(host, path, pathType, service:port name) of each of the Ingress' paths."""
    return [
        (rule["host"], p["path"], p["pathType"],
         f"{p['backend']['service']['name']}:{p['backend']['service']['port']['name']}")
        for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]
    ]  # fmt: skip


def test_ingress_reaches_every_path_over_tls() -> None:
    main, stream = load("ingress.yaml"), load("ingress-stream.yaml")
    service = load("service.yaml")
    (port,) = service["spec"]["ports"]
    backend = f"{service['metadata']['name']}:{port['name']}"
    # `/` is every path: the page answers whatever the other routes leave (app.py mounts it last).
    assert ingress_backends(main) == [("pvwire.example.org", "/", "Prefix", backend)]
    assert {b[3] for b in ingress_backends(stream)} == {backend}
    for ingress in (main, stream):  # one host, one certificate: the controller merges them
        assert ingress["spec"]["ingressClassName"] == "nginx"
        (tls,) = ingress["spec"]["tls"]
        assert tls == {"hosts": ["pvwire.example.org"], "secretName": "pvwire-tls"}
    # pvwire's own bound on a body is the one that answers (413 from it, not nginx's 1m).
    size = main["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-body-size"]
    assert size.endswith("m") and int(size[:-1]) * 2**20 == limits.default("max_request_bytes")


def test_ingress_streams_the_long_lived_paths_unbuffered() -> None:
    stream = load("ingress-stream.yaml")
    paths = {path: kind for _, path, kind, _ in ingress_backends(stream)}
    # The WebSockets by their exact paths (/pvws/pvget and the others stay with `/`), MJPEG by
    # its prefix: each one a route of the server.
    assert paths == {"/stream": "Exact", "/pvws/pv": "Exact", "/mjpeg": "Prefix"}
    assert routed("/stream", "websocket") and routed("/pvws/pv", "websocket")
    assert routed("/mjpeg/BL1:CAM1:Image1:Pva", "http") and not routed("/mjpeg", "http")
    notes = stream["metadata"]["annotations"]
    assert notes["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    quiet = max(limits.default("heartbeat_s"), limits.default("ws_ping_interval_s"))
    for timeout in ("proxy-read-timeout", "proxy-send-timeout"):
        assert int(notes[f"nginx.ingress.kubernetes.io/{timeout}"]) > 2 * quiet
