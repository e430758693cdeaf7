"""The Kubernetes manifests agree with the server they deploy (no cluster here to apply them)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml
from pvwire.config import Settings

K8S = Path(__file__).resolve().parent.parent / "k8s"


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((K8S / name).read_text())
    return doc


def test_kustomization_lists_every_manifest() -> None:
    listed = set(load("kustomization.yaml")["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert listed == present


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
