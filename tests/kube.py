"""k8s/ played by podman on one machine: `make kube` (`python -m tests.kube`), and the harness of
tests/test_container.py; charts/pvwire/ rendered by helm the same way (`make kube-chart`).

`podman kube play` runs Deployments, ConfigMaps and Secrets, and ignores Services, HPAs, PDBs
and Ingresses; without systemd it runs no probes. So the manifests are rendered as `kubectl
apply -k` does (kustomize) and a copy is adapted to what one podman host can express, while k8s/
stays what a cluster needs:

- each replica is its own one-replica Deployment (`pvwire-<run>-rN`) on the host network (the
  IOCs are on the host's loopback; nothing else is reached), listening on 127.0.0.1 and a port
  of its own (two pods on one host network cannot share 8080); the probes are run from here,
  against the manifest's paths;
- the ConfigMap's EPICS address lists are the IOC's loopback ones: what a site sets to its own;
- the Secret is created with `podman secret create` in the form podman 4.3 reads for
  `secretKeyRef` (a JSON map of base64 values): 4.3 stores a played Secret as YAML and then
  cannot read it back. Every replica gets the same key from it, as in a cluster;
- haproxy (tests/replicas.py) stands in for the Service, and a replacement is done as a
  Deployment's rolling update does it (maxSurge 1, maxUnavailable 0 for two replicas): the new
  pod first, ready, then the old one stopped with SIGTERM and its grace period.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pvwire_dev.demo_ioc import start_demo_ioc
from pvwire_dev.ioc import free_port

from tests.replicas import Haproxy
from tests.stream_client import RawStream

ROOT = Path(__file__).resolve().parent.parent
KUSTOMIZE = ROOT / ".tools" / "kustomize"
HELM = ROOT / ".tools" / "helm"
CHART = ROOT / "charts" / "pvwire"
CONTAINERS_CONF = ROOT / "scripts" / "containers.conf"
IMAGE = "pvwire:0.1.0"
# What podman kube play leaves out of a rendered k8s/: the test and `make kube` stand in for them.
NOT_PLAYED = {"Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Ingress"}

__all__ = [
    "Container",
    "KubeReplica",
    "Rollout",
    "graphql",
    "podman",
    "render",
    "render_chart",
    "token_travels",
    "wait_http",
]


def podman(*args: str, timeout: float = 120, check: bool = True) -> str:
    env = {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}
    p = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=env)
    if check and p.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)}: exit {p.returncode}\n{p.stderr}")
    return p.stdout


def render(path: Path = ROOT / "k8s") -> list[dict[str, Any]]:
    """The manifests as `kubectl apply -k` would send them."""
    out = subprocess.run(
        [str(KUSTOMIZE), "build", str(path)], capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        raise RuntimeError(f"kustomize build {path}: {out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def render_chart(*args: str, release: str = "pvwire") -> list[dict[str, Any]]:
    """charts/pvwire/ as `helm install RELEASE charts/pvwire ARGS...` sends it (`make helm`)."""
    out = subprocess.run(
        [str(HELM), "template", release, str(CHART), *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"helm template {CHART} {' '.join(args)}: {out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def wait_http(url: str, timeout: float, alive: Any = None) -> None:
    """Until `url` answers 200; `alive()` (if given) is checked between tries."""
    deadline = time.monotonic() + timeout
    while True:
        if alive is not None:
            alive()
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} did not answer 200 within {timeout} s")
        time.sleep(0.2)


def graphql(url: str, query: str) -> dict[str, Any]:
    body = json.dumps({"query": query}).encode()
    req = urllib.request.Request(
        f"{url}/graphql", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        doc: dict[str, Any] = json.loads(r.read())
    assert not doc.get("errors"), doc
    return doc


async def token_travels(issuer: str, other: str, channel_id: str) -> tuple[str, ...]:
    """A stream token issued by one replica, attached on another: the ids it attached. Fails
    unless both verify tokens with the same key."""
    doc = graphql(issuer, f'mutation {{ subscribe(ids: ["{channel_id}"]) {{ token }} }}')
    ws = other.replace("http://", "ws://") + "/stream"
    stream = await RawStream.connect(ws)
    try:
        attached, _ = await stream.attach(doc["data"]["subscribe"]["token"])
        return attached.ids
    finally:
        await stream.close()


def one(docs: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


class Rollout:
    """One rendering of k8s/ played as `replicas` pods, with the token key in a podman secret."""

    def __init__(self, docs: Sequence[dict[str, Any]], epics_env: Mapping[str, str]) -> None:
        self.run = secrets.token_hex(3)  # names of their own: runs side by side never meet
        self.docs = list(docs)
        self.ignored = sorted({d["kind"] for d in docs} & NOT_PLAYED)
        self.deployment = one(docs, "Deployment")
        self.config_map = one(docs, "ConfigMap")
        self.epics_env = dict(epics_env)
        self.token_key = secrets.token_hex(32)
        self.secret = f"pvwire-token-key-{self.run}"
        self._dir = tempfile.TemporaryDirectory(prefix="pvwire-kube-")
        self.replicas: list[KubeReplica] = []
        self._made = 0

    def create_secret(self) -> None:
        """What `kubectl create secret generic pvwire-token-key --from-literal=key=...` makes,
        in podman's form."""
        ref = self.container["env"][0]["valueFrom"]["secretKeyRef"]
        data = {ref["key"]: base64.b64encode(self.token_key.encode()).decode()}
        path = Path(self._dir.name) / "secret.json"
        path.write_text(json.dumps(data))
        podman("secret", "create", self.secret, str(path))

    @property
    def container(self) -> dict[str, Any]:
        containers: list[dict[str, Any]] = self.deployment["spec"]["template"]["spec"]["containers"]
        return containers[0]

    def manifest(self, name: str, port: int) -> list[dict[str, Any]]:
        """The ConfigMap and a one-replica copy of the Deployment for one host-network pod."""
        config = copy.deepcopy(self.config_map)
        config["data"].update(self.epics_env)
        deployment = copy.deepcopy(self.deployment)
        deployment["metadata"]["name"] = name
        deployment["spec"]["replicas"] = 1
        pod = deployment["spec"]["template"]["spec"]
        pod["hostNetwork"] = True
        (container,) = pod["containers"]
        container.pop("ports")  # podman refuses port mappings on the host network
        args = container["args"]
        args[args.index("--host") + 1] = "127.0.0.1"
        args[args.index("--port") + 1] = str(port)
        for probe in ("readinessProbe", "livenessProbe"):
            container[probe]["httpGet"]["port"] = port
        for env in container["env"]:
            if "secretKeyRef" in env.get("valueFrom", {}):
                env["valueFrom"]["secretKeyRef"]["name"] = self.secret
        return [config, deployment]

    def add(self, port: int | None = None) -> KubeReplica:
        """A new pod, played and started (not yet known to be ready)."""
        self._made += 1
        name = f"pvwire-{self.run}-r{self._made}"
        port = port or free_port()
        path = Path(self._dir.name) / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all(self.manifest(name, port)))
        replica = KubeReplica(name, port, path, self.container["readinessProbe"])
        podman("kube", "play", str(path), timeout=180)
        self.replicas.append(replica)
        return replica

    def replace(
        self, old: KubeReplica, ready_timeout: float, port: int | None = None
    ) -> KubeReplica:
        """A rolling update's step: the new pod first, ready, then the old one stopped."""
        new = self.add(port)
        new.wait_ready(ready_timeout)
        old.stop(self.grace)
        return new

    @property
    def count(self) -> int:
        """The replicas a cluster starts: the Deployment's, or where an HPA owns the count (the
        chart then leaves `replicas` out, so that an upgrade does not reset it) its minimum."""
        if "replicas" in self.deployment["spec"]:
            return int(self.deployment["spec"]["replicas"])
        return int(one(self.docs, "HorizontalPodAutoscaler")["spec"]["minReplicas"])

    @property
    def grace(self) -> int:
        return int(self.deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])

    def down(self) -> None:
        for r in self.replicas:
            r.down()
        podman("secret", "rm", self.secret, check=False)
        self._dir.cleanup()


class KubeReplica:
    """One pod that `podman kube play` made from the Deployment."""

    def __init__(self, name: str, port: int, manifest: Path, readiness: dict[str, Any]) -> None:
        self.name = name
        self.pod = f"{name}-pod-0"  # podman's name for a Deployment's first pod
        self.container = f"{self.pod}-pvwire"
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.manifest = manifest
        self.readiness = readiness
        self.stopped = False

    def wait_ready(self, timeout: float) -> None:
        """The readiness probe as the kubelet runs it (its path, every periodSeconds), until
        it passes; podman runs none without systemd."""
        path = self.readiness["httpGet"]["path"]
        period = float(self.readiness.get("periodSeconds", 10))
        deadline = time.monotonic() + timeout
        while True:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.url + path, timeout=period) as r,
            ):
                if r.status == 200:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} not ready after {timeout} s:\n{self.logs()}")
            time.sleep(min(period, 0.5))  # the kubelet waits a period; sooner here, same probe

    def env(self, name: str) -> str:
        return podman("exec", self.container, "printenv", name).strip()

    def logs(self) -> str:
        return podman("logs", "--tail", "40", self.container, check=False)

    def stop(self, grace: int) -> None:
        """As the kubelet ends a pod: SIGTERM, SIGKILL after the grace period."""
        podman("pod", "stop", "-t", str(grace), self.pod, timeout=grace + 60)
        self.stopped = True

    def down(self) -> None:
        podman("kube", "down", str(self.manifest), check=False, timeout=120)


class Container:
    """The image run on its own as the Deployment's securityContext runs it: its own user, a
    read-only root filesystem with nothing mounted writable (unlike podman's default, a cluster
    mounts no tmpfs), no capabilities, no privilege escalation; on the host network."""

    def __init__(self, env: Mapping[str, str], image: str = IMAGE) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.name = f"pvwire-{secrets.token_hex(3)}"
        self.env = dict(env)
        self.image = image

    def start(self, timeout: float = 120) -> None:
        args = [
            "run", "-d", "--name", self.name, "--network", "host",
            "--read-only", "--read-only-tmpfs=false", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--no-healthcheck",
        ]  # fmt: skip
        for k, v in self.env.items():
            args += ["-e", f"{k}={v}"]
        args += [self.image, "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        podman(*args)
        wait_http(f"{self.url}/healthz", timeout, self._alive)

    def _alive(self) -> None:
        state = podman("inspect", "--format", "{{.State.Status}}", self.name).strip()
        if state != "running":
            raise AssertionError(f"{self.name} is {state}:\n{self.logs()}")

    def exec(self, *args: str) -> str:
        return podman("exec", self.name, *args)

    def logs(self) -> str:
        return podman("logs", "--tail", "40", self.name, check=False)

    def stop(self, grace: int = 15) -> int:
        """SIGTERM (podman stop), SIGKILL after `grace`; the container's exit code."""
        podman("stop", "-t", str(grace), self.name, timeout=grace + 60)
        return int(podman("inspect", "--format", "{{.State.ExitCode}}", self.name).strip())

    def remove(self) -> None:
        podman("rm", "-f", self.name, check=False)


@contextlib.contextmanager
def demo_ioc() -> Iterator[dict[str, str]]:
    ioc = start_demo_ioc("PVWIRE:DEMO:")
    try:
        yield ioc.ports.client_env()
    finally:
        ioc.stop()


def main() -> int:
    """`make kube`: the demo IOC, k8s/ played as two replicas, haproxy in front; until Ctrl-C.
    `--chart` (`make kube-chart`): charts/pvwire/ with its default values instead of k8s/."""
    docs = render_chart() if "--chart" in sys.argv[1:] else render()
    with demo_ioc() as epics_env:
        rollout = Rollout(docs, epics_env)
        proxy: Haproxy | None = None
        try:
            rollout.create_secret()
            replicas = [rollout.add() for _ in range(rollout.count)]
            counter = "ca://PVWIRE:DEMO:COUNTER"
            for r in replicas:
                r.wait_ready(120)
                assert r.env("PVWIRE_TOKEN_KEY") == rollout.token_key
                value = graphql(r.url, f'{{ channel(id: "{counter}") {{ value }} }}')
                print(f"{r.pod}: ready at {r.url}, {counter} = {value['data']['channel']['value']}")
            for a, b in zip(replicas, replicas[1:] + replicas[:1], strict=True):
                asyncio.run(token_travels(a.url, b.url, counter))
                print(f"a stream token from {a.pod} attaches on {b.pod}: one key, from the Secret")
            proxy = Haproxy([r.port for r in replicas])
            proxy.start()
            print(f"not played by podman: {', '.join(rollout.ignored)}")
            print(f"haproxy in place of the Service: {proxy.url}/  (Ctrl-C stops everything)")
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            with contextlib.suppress(KeyboardInterrupt):
                stop.wait()
        finally:
            if proxy is not None:
                proxy.stop()
            rollout.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
