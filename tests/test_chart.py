"""The Helm chart (charts/pvwire/) renders what k8s/ applies. `helm lint` and `helm template`
(helm built into .tools/ from the Go module proxy, `make helm`) with the default values, with every
option on (ci/all-values.yaml) and with every optional object off (ci/none-values.yaml); each
rendering valid against the Kubernetes API schemas (kubernetes-validate --strict, offline), and
the default one the same objects as kustomize's rendering of k8s/ (probes, ports, env, security
context, the Ingress), the gateway option the same as k8s/overlays/gateway/."""

from __future__ import annotations

import copy
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
from pvwire.config import Settings

from tests.kube import CHART, HELM, render, render_chart

ROOT = Path(__file__).resolve().parent.parent
VALIDATE = Path(sys.executable).with_name("kubernetes-validate")
VALUES = {
    "default": (),
    "all": ("-f", str(CHART / "ci" / "all-values.yaml")),
    "none": ("-f", str(CHART / "ci" / "none-values.yaml")),
}
HOST = "pvwire.controls.example.org"  # ci/all-values.yaml
# The labels helm adds to every object (and the release's instance to every selector).
CHART_LABELS = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
}
# The chart names the drain's settings in the pod's environment; k8s/ leaves them at the
# server's defaults (limits.py), which its grace period adds up (the drain contract's test).
DRAIN_ENV = {"PVWIRE_DRAIN_DELAY_S", "PVWIRE_DRAIN_WINDOW_S"}


@functools.cache
def rendered(values: str, *more: str) -> tuple[dict[str, Any], ...]:
    return tuple(render_chart(*VALUES[values], *more))


def by_name(docs: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): copy.deepcopy(d) for d in docs}


def pod(docs: tuple[dict[str, Any], ...], name: str = "pvwire") -> dict[str, Any]:
    spec: dict[str, Any] = by_name(docs)["Deployment", name]["spec"]["template"]["spec"]
    return spec


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def kubernetes_valid(text: str, tmp_path: Path) -> None:
    out = tmp_path / "rendered.yaml"
    out.write_text(text)
    p = subprocess.run(
        [str(VALIDATE), "--strict", "--quiet", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("values", VALUES)
def test_chart_lints(values: str) -> None:
    assert HELM.is_file(), "make helm"
    p = subprocess.run(
        [str(HELM), "lint", "--strict", str(CHART), *VALUES[values]],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in p.stdout


@pytest.mark.parametrize("values", VALUES)
def test_chart_renders_valid_kubernetes(values: str, tmp_path: Path) -> None:
    docs = rendered(values)
    kubernetes_valid(yaml.safe_dump_all(docs), tmp_path)
    kinds = sorted(d["kind"] for d in docs)
    if values == "none":
        assert kinds == ["ConfigMap", "Deployment", "Service"]
        assert by_name(docs)["Deployment", "pvwire"]["spec"]["replicas"] == 3
    else:
        assert {"HorizontalPodAutoscaler", "PodDisruptionBudget", "Ingress"} <= set(kinds)
        # The HPA owns the count: an upgrade must not reset it (and drain replicas to do so).
        assert "replicas" not in by_name(docs)["Deployment", "pvwire"]["spec"]


def plain(doc: dict[str, Any]) -> dict[str, Any]:
    """An object without what helm adds: its labels, the Service type's default, the image's
    pull policy, the ConfigMap's checksum on the pod template."""
    doc = copy.deepcopy(doc)

    def strip(node: Any) -> None:
        if isinstance(node, dict):
            for key in ("labels", "matchLabels", "selector"):
                if isinstance(node.get(key), dict):
                    for label in CHART_LABELS:
                        node[key].pop(label, None)
            node.pop("imagePullPolicy", None)
            for value in node.values():
                strip(value)
        elif isinstance(node, list):
            for value in node:
                strip(value)

    strip(doc)
    if doc["kind"] == "Service" and doc["spec"].get("type") == "ClusterIP":
        del doc["spec"]["type"]
    if doc["kind"] == "Deployment":
        meta = doc["spec"]["template"]["metadata"]
        meta.get("annotations", {}).pop("checksum/config", None)
        if meta.get("annotations") == {}:
            del meta["annotations"]
    return doc


def test_default_values_render_the_objects_of_k8s() -> None:
    """Object for object, field for field, what `kubectl apply -k k8s/` applies, but for what
    differs on purpose (named here)."""
    chart, k8s = by_name(rendered("default")), by_name(render(ROOT / "k8s"))
    assert set(chart) == set(k8s)
    # The count: k8s/ starts two replicas and its HPA keeps two at least; the chart leaves the
    # count to the HPA (starting at its minimum, two).
    hpa = chart["HorizontalPodAutoscaler", "pvwire"]["spec"]
    assert k8s["Deployment", "pvwire"]["spec"].pop("replicas") == hpa["minReplicas"]
    # The drain's settings: named in the chart, the defaults in k8s/ (the same numbers).
    for d in (chart, k8s):
        (container,) = d["Deployment", "pvwire"]["spec"]["template"]["spec"]["containers"]
        container["env"] = [e for e in container["env"] if e["name"] not in DRAIN_ENV]
    for key, doc in k8s.items():
        assert plain(chart[key]) == plain(doc), key


def test_chart_keeps_the_drain_contract() -> None:
    """preStop, then SIGTERM and the server's delay and window, then 10 s to exit: the grace
    period follows the values, so changing one keeps them agreeing."""
    cases = {"default": (5, 5, 20), "all": (8, 7, 45)}
    for values, (pre_stop, delay, window) in cases.items():
        spec = pod(rendered(values))
        (container,) = spec["containers"]
        assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", str(pre_stop)]
        assert env(container)["PVWIRE_DRAIN_DELAY_S"] == str(delay)
        assert env(container)["PVWIRE_DRAIN_WINDOW_S"] == str(window)
        assert spec["terminationGracePeriodSeconds"] == pre_stop + delay + window + 10
    assert pod(rendered("default"))["terminationGracePeriodSeconds"] == 40
    # k8s/: its preStop, then the server's default delay and window, then 10 s to exit.
    spec = by_name(render(ROOT / "k8s"))["Deployment", "pvwire"]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    defaults = limits.number("drain_delay_s") + limits.number("drain_window_s")
    assert spec["terminationGracePeriodSeconds"] == pre_stop + defaults + 10
    assert (env(pod(rendered("default"))["containers"][0])["PVWIRE_DRAIN_DELAY_S"],
            env(pod(rendered("default"))["containers"][0])["PVWIRE_DRAIN_WINDOW_S"]) == (
        f"{limits.number('drain_delay_s'):g}", f"{limits.number('drain_window_s'):g}"
    )  # fmt: skip


def test_values_become_settings_the_server_reads() -> None:
    """Every variable the chart sets is an EPICS one, a setting of the server (the token key,
    the drain's and TLS's among them), and the ConfigMap of every option parses."""
    fields = {f"PVWIRE_{f.name.upper()}" for f in dataclasses.fields(Settings)}
    docs = rendered("all")
    data = {k: str(v) for k, v in by_name(docs)["ConfigMap", "pvwire-config"]["data"].items()}
    for key in data:
        assert key.startswith("EPICS_") or key in fields, key
    (container,) = pod(docs)["containers"]
    assert set(env(container)) <= fields | {"PVWIRE_TOKEN_KEY"}
    settings = Settings.load(env={**data, "PVWIRE_TOKEN_KEY": "k"})
    assert settings.write_rules == ["ca://BL1:*:SP", "pva://BL1:MODE"]
    assert settings.allowed_origins == ["https://pvwire.example.org", "https://screens.example.org"]
    assert settings.trusted_proxies == ["10.244.0.0/16"]
    assert (settings.tick_ms, settings.heartbeat_s) == (25.0, 10.0)
    assert settings.max_request_bytes == 8 * 2**20  # a whole number, as YAML's float is not
    assert data["EPICS_CA_MAX_ARRAY_BYTES"] == "200000000"
    assert data["EPICS_CA_NAME_SERVERS"] == "cagw.controls.example.org:5064"
    ingress = by_name(docs)["Ingress", "pvwire"]["metadata"]["annotations"]
    assert ingress["nginx.ingress.kubernetes.io/proxy-body-size"] == str(8 * 2**20)


def test_tls_end_to_end_mounts_the_secret_and_speaks_https() -> None:
    docs = rendered("all")
    spec = pod(docs)
    (container,) = spec["containers"]
    (mount,) = container["volumeMounts"]
    (volume,) = spec["volumes"]
    # The whole Secret as a directory (a subPath would never see a renewed certificate).
    assert volume == {"name": mount["name"], "secret": {"secretName": "pvwire-server-tls"}}
    assert "subPath" not in mount and mount["readOnly"] is True
    variables = env(container)
    assert variables["PVWIRE_TLS_CERT"] == f"{mount['mountPath']}/tls.crt"
    assert variables["PVWIRE_TLS_KEY"] == f"{mount['mountPath']}/tls.key"
    (port,) = container["ports"]
    assert port["name"] == "https"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
        assert container[probe]["httpGet"]["port"] == "https"
    objects = by_name(docs)
    (service_port,) = objects["Service", "pvwire"]["spec"]["ports"]
    assert service_port["targetPort"] == "https"
    for name in ("pvwire", "pvwire-stream"):
        ingress = objects["Ingress", name]
        notes = ingress["metadata"]["annotations"]
        assert notes["nginx.ingress.kubernetes.io/backend-protocol"] == "HTTPS"
        assert notes["cert-manager.io/cluster-issuer"] == "site-issuer"
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                assert path["backend"]["service"]["port"] == {"name": service_port["name"]}
        (tls,) = ingress["spec"]["tls"]
        assert tls == {"hosts": [HOST], "secretName": "pvwire-controls-tls"}
    # Without it, no certificate in the pods and plain http behind the Ingress.
    (plain_container,) = pod(rendered("default"))["containers"]
    assert "volumeMounts" not in plain_container
    assert not set(env(plain_container)) & {"PVWIRE_TLS_CERT", "PVWIRE_TLS_KEY"}


def test_ingress_without_a_certificate_serves_plain_http(tmp_path: Path) -> None:
    docs = rendered("default", "--set", "ingress.tlsSecretName=")
    ingresses = [d for d in docs if d["kind"] == "Ingress"]
    assert len(ingresses) == 2 and not [d for d in ingresses if "tls" in d["spec"]]
    kubernetes_valid(yaml.safe_dump_all(docs), tmp_path)


def test_gateway_option_renders_the_gateway_overlay(tmp_path: Path) -> None:
    """What `kubectl apply -k k8s/overlays/gateway/` applies, the gateway's objects named after
    the release (pvwire-pvagw) so that two releases never share one."""
    chart = rendered("default", "--set", "gateway.enabled=true")
    renamed = json.loads(json.dumps(chart).replace("pvwire-pvagw", "pvagw"))
    chart_docs, overlay = by_name(renamed), by_name(render(ROOT / "k8s" / "overlays" / "gateway"))
    assert set(chart_docs) == set(overlay)
    conf = {}
    for key, doc in ((k, v) for k, v in overlay.items() if "pvagw" in k[1]):
        mine = plain(chart_docs[key])
        if key == ("ConfigMap", "pvagw-config"):  # the same configuration, as JSON
            conf = json.loads(mine["data"].pop("gw.conf"))
            assert conf == json.loads(doc["data"].pop("gw.conf"))
        assert mine == plain(doc), key
    assert by_name(chart)["ConfigMap", "pvwire-config"]["data"] == {
        **overlay["ConfigMap", "pvwire-config"]["data"],
        "EPICS_PVA_NAME_SERVERS": "pvwire-pvagw:5075",
    }
    # The configuration is the one pvagw reads: let pvagw itself check it.
    path = tmp_path / "gw.conf"
    path.write_text(json.dumps(conf))
    p = subprocess.run(
        [sys.executable, "-m", "p4p.gw", "--test-config", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr


def test_gateway_of_every_option_is_pvagws_own() -> None:
    docs = by_name(rendered("all"))
    conf = json.loads(docs["ConfigMap", "pvwire-pvagw-config"]["data"]["gw.conf"])
    assert conf["clients"][0]["addrlist"] == "10.1.0.255 10.2.0.255"
    assert conf["servers"][0]["statusprefix"] == "BL1:PVAGW:"
    data = docs["ConfigMap", "pvwire-config"]["data"]
    (port,) = docs["Service", "pvwire-pvagw"]["spec"]["ports"]
    # The gateway replaces the PVA name servers given and the default scheme.
    assert data["EPICS_PVA_NAME_SERVERS"] == f"pvwire-pvagw:{port['port']}"
    assert data["PVWIRE_DEFAULT_SCHEME"] == "pva" and data["EPICS_PVA_ADDR_LIST"] == ""
