"""The image as operators meet it: built by podman from the Dockerfile (`make image`), run as the
Deployment's securityContext says against the shared test IOC, stopped with SIGTERM behind
haproxy; then k8s/ rendered by kustomize and played by `podman kube play` (tests/kube.py), its
replicas replaced one by one under load while a Python and a TypeScript client stream.

`pytest -m container` runs these alone. The image is built once per session (the first build
on a machine makes the base images too, ~8 min; podman caches every step, so later sessions
take ~10 s). Missed updates and resume times are recorded (user properties, also printed), not
asserted: bench/failover.py measures failover.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pvwire_client import Client
from pvwire_client.state import CONNECTED, DISCONNECTED
from pvwire_dev.ioc import IocProcess, free_port

from tests.eventually import eventually_async
from tests.kube import (
    IMAGE,
    Container,
    KubeReplica,
    Rollout,
    graphql,
    podman,
    render,
    render_chart,
    token_travels,
)
from tests.replicas import CounterFollower, Haproxy

# The first build on a machine (base images and all) counts against the first test that needs it.
pytestmark = [pytest.mark.container, pytest.mark.ioc, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parent.parent
COUNTER = "ca://PVW:COUNTER"  # tests/dbs/test.db: +1 every 0.1 s
LOAD = ["sim://counter/load?rate=200", "sim://sine/load?rate=100", "sim://waveform?rate=20"]
BOUND = 120.0  # generous: a loaded 2-core machine, containers starting
KEY = "container-test-key"
# What k8s/ and the chart hold that podman does not play (tests/kube.py stands in for them).
NOT_PLAYED = ["HorizontalPodAutoscaler", "Ingress", "PodDisruptionBudget", "Service"]


@pytest.fixture(scope="session")
def image() -> str:
    """`make image`, as an operator runs it (and kustomize and helm, for the manifests)."""
    p = subprocess.run(
        ["make", "-s", "image", "kustomize", "helm"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-4000:]
    print(*[line for line in p.stderr.splitlines() if " image: " in line], sep="\n")
    return IMAGE


@pytest.fixture(scope="session")
def ioc_env(epics_env: IocProcess) -> dict[str, str]:
    return epics_env.ports.client_env()


@pytest.fixture
def started() -> Iterator[Callable[[dict[str, str]], Container]]:
    made: list[Container] = []

    def start(env: dict[str, str]) -> Container:
        c = Container(env)
        made.append(c)
        c.start()
        return c

    yield start
    for c in made:
        c.remove()


@pytest.fixture
def container(
    image: str, ioc_env: dict[str, str], started: Callable[[dict[str, str]], Container]
) -> Container:
    return started({**ioc_env, "PVWIRE_TOKEN_KEY": KEY, "PVWIRE_WRITE_RULES": "ca://PVW:STR"})


def fetch(url: str, accept: str = "*/*") -> bytes:
    req = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200, url
        body: bytes = r.read()
        return body


async def counted(client: Client, channel: str, n: int) -> list[float]:
    """The first `n` values of a counter channel as the client's monitor gives them."""
    seen: list[float] = []
    async for u in client.monitor([channel]):
        if u.channel.state == CONNECTED and u.channel.value is not None:
            seen.append(float(u.channel.value))
        if len(seen) == n:
            break
    return seen


def test_image_runs_as_the_deployment_says(
    container: Container, record_property: Callable[[str, object], None]
) -> None:
    assert container.exec("id", "-u").strip() == "10001"
    assert "CapBnd:\t0000000000000000" in container.exec("cat", "/proc/1/status")
    probe = container.exec("sh", "-c", "touch /probe 2>&1; touch /tmp/probe 2>&1; true")
    assert probe.count("Read-only file system") == 2, probe
    # Nothing of the build stages: no compiler, no Node or npm, no Python headers.
    found = container.exec("sh", "-c", "command -v cc gcc g++ node npm; ls /usr/include; true")
    assert found.split() == [], found
    code = (
        "import hashlib, importlib.metadata as m, pvwire.app as a, "
        "pvwire.upstream._pvaingest as x, pvwire.core._journal as j, pvwire.core._tick as t; "
        "print(x.__file__); "
        "print(j.__file__); print(t.__file__); "
        "print(hashlib.sha256(open(a.__file__, 'rb').read()).hexdigest()); "
        "print(m.distribution('pvwire').read_text('WHEEL'))"
    )
    pva, journal, tick, app, *wheel = container.exec("python", "-c", code).splitlines()
    for module in (pva, journal, tick):  # the wheel's compiled modules, installed into the image
        assert module.startswith("/usr/") and "-packages/pvwire/" in module, module
    # The image holds this checkout's server: a build that reused a stale layer once served
    # an older one to every test here.
    assert app == hashlib.sha256((ROOT / "server/pvwire/app.py").read_bytes()).hexdigest()
    (tag,) = [line.split(": ", 1)[1] for line in wheel if line.startswith("Tag: ")]
    record_property("image_wheel_tag", tag)
    # The wheel carries the compiled modules: a pure-Python tag would let pip install it
    # on a platform the module cannot load on.
    assert tag.startswith("cp313-cp313-linux_"), tag  # Debian 13's Python


async def test_image_serves_a_real_ioc_page_and_graphiql(container: Container) -> None:
    async with Client(container.url) as client:
        assert (await client.get("ca://PVW:AO")).metadata["units"] == "mm"
        old = (await client.get("ca://PVW:STR")).value
        try:
            await client.put("ca://PVW:STR", "from the image", wait=True)
            assert (await client.get("ca://PVW:STR")).value == "from the image"
        finally:
            await client.put("ca://PVW:STR", old, wait=True)
        # A stream of counters, over CA and over PVA (the compiled module's monitors).
        for channel in (COUNTER, "pva://PVW:COUNTER"):
            seen = await counted(client, channel, 5)
            assert seen == sorted(seen) and seen[-1] > seen[0], (channel, seen)
    page = fetch(f"{container.url}/").decode()
    assert "<title>pvwire demo</title>" in page
    for asset in re.findall(r'(?:src|href)="([^":]+\.(?:js|css))"', page):
        assert fetch(f"{container.url}/{asset}"), asset
    graphiql = fetch(f"{container.url}/graphql", accept="text/html").decode()
    assets = re.findall(r'"(/graphiql-assets/[^"]+)"', graphiql)
    assert assets and "unpkg.com" not in graphiql  # offline: every file from the image
    for asset in assets:
        assert fetch(container.url + asset), asset


def stream_clients(url: str) -> int:
    for line in fetch(f"{url}/metrics").decode().splitlines():
        if line.startswith("pvwire_clients "):
            return int(float(line.split()[1]))
    raise AssertionError(f"no pvwire_clients in {url}/metrics")


async def test_sigterm_drains_4012_and_clients_resume_on_another_container(
    image: str,
    ioc_env: dict[str, str],
    started: Callable[[dict[str, str]], Container],
    record_property: Callable[[str, object], None],
) -> None:
    # A short drain, within `stop`'s grace period: not ready, 1 s on, the closes over 2 s.
    env = {**ioc_env, "PVWIRE_TOKEN_KEY": KEY, "PVWIRE_DRAIN_DELAY_S": "1",
           "PVWIRE_DRAIN_WINDOW_S": "2"}  # fmt: skip
    pair = [started(env), started(env)]
    proxy = Haproxy([c.port for c in pair])
    proxy.start()
    followers = [CounterFollower(proxy.url, LOAD) for _ in range(4)]
    try:
        for f in followers:
            f.start()
        for f in followers:
            await f.until("streaming", BOUND)
        victim = max(pair, key=lambda c: stream_clients(c.url))
        served = stream_clients(victim.url)
        assert served >= 1
        assert victim.stop() == 0  # SIGTERM: a clean exit within the grace period
        moved = [f for f in followers if f.lost_at is not None]
        deadline = time.monotonic() + BOUND
        while len(moved) < served:
            assert time.monotonic() < deadline, "the stopped container's clients never noticed"
            await asyncio.sleep(0.1)
            moved = [f for f in followers if f.lost_at is not None]
        for f in moved:
            await f.until("resumed", BOUND)
            assert "4012" in f.lost_reason, f.lost_reason
            assert f.last_before is not None and f.first_after is not None
            assert f.first_after >= f.last_before  # a snapshot of the same IOC, never back
        (survivor,) = [c for c in pair if c is not victim]
        assert stream_clients(survivor.url) == len(followers)
        missed = [f.missed for f in moved]
        record_property("container_sigterm_missed_updates", missed)
        print(f"container_sigterm_missed_updates = {missed}")
    finally:
        for f in followers:
            await f.close()
        proxy.stop()


@dataclass
class Stream:
    """What one client saw of the counter: every value, and each loss with its reason and the
    values either side of it."""

    name: str
    values: list[float] = field(default_factory=list)
    losses: list[tuple[str, float | None]] = field(default_factory=list)  # (reason, last before)
    resumes: list[float] = field(default_factory=list)  # first value after each loss
    lost: bool = False

    def counted(self, n: int, *, lost_none: bool = False) -> Callable[[], bool]:
        """Whether `n` values are in (and, if asked, none lost since), whenever asked."""
        return lambda: len(self.values) >= n and not (lost_none and self.lost)

    def value(self, v: float) -> None:
        if self.lost:
            self.lost = False
            self.resumes.append(v)
        self.values.append(v)

    def loss(self, reason: str) -> None:
        if not self.lost:
            self.lost = True
            self.losses.append((reason, self.values[-1] if self.values else None))

    @property
    def missed(self) -> int:
        """Counter steps never seen, from the first value to the last."""
        return int(self.values[-1] - self.values[0] + 1) - len(set(self.values))


async def follow_py(url: str, stream: Stream) -> None:
    async with Client(url) as client:
        async for u in client.monitor([COUNTER, *LOAD]):
            ch = u.channel
            if ch.id != COUNTER:
                continue
            if ch.state == DISCONNECTED:
                stream.loss(ch.reason or "")
            elif ch.state == CONNECTED and ch.value is not None:
                stream.value(float(ch.value))


class TsFollower:
    """tests/ts_follower.mjs: the TypeScript client, in Node, through the same proxy."""

    def __init__(self, url: str, stream: Stream) -> None:
        script = ROOT / "tests" / "ts_follower.mjs"
        self.proc = subprocess.Popen(
            ["node", str(script), url, COUNTER, *LOAD],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stream = stream
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            doc = json.loads(line)
            if "value" in doc:
                self.stream.value(float(doc["value"]))
            elif doc["connection"] == "DISCONNECTED":
                self.stream.loss(doc["reason"])

    def stop(self) -> str:
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.thread.join(10)  # it ends at the pipe's end, once the process has gone
        assert self.proc.stdout is not None and self.proc.stderr is not None
        with self.proc.stdout, self.proc.stderr:  # closed here, not by the collector
            return self.proc.stderr.read()


@contextlib.contextmanager
def played(docs: Sequence[dict[str, Any]], ioc_env: dict[str, str]) -> Iterator[Rollout]:
    rollout = Rollout(docs, ioc_env)
    try:
        rollout.create_secret()
        yield rollout
    finally:
        rollout.down()


@pytest.fixture
def rollout(image: str, ioc_env: dict[str, str]) -> Iterator[Rollout]:
    with played(render(), ioc_env) as made:
        yield made


def test_manifests_play_ready_with_one_key_and_the_ioc(rollout: Rollout) -> None:
    assert rollout.ignored == NOT_PLAYED
    replicas = [rollout.add() for _ in range(rollout.deployment["spec"]["replicas"])]
    assert len(replicas) == 2
    for r in replicas:
        r.wait_ready(BOUND)
        assert r.env("PVWIRE_TOKEN_KEY") == rollout.token_key  # from the Secret
        # The securityContext as the runtime applied it.
        inspect = json.loads(podman("inspect", r.container))[0]
        assert inspect["HostConfig"]["ReadonlyRootfs"] is True
        assert inspect["Config"]["User"].split(":")[0] == "10001"
        status = podman("exec", r.container, "cat", "/proc/1/status")
        assert "CapBnd:\t0000000000000000" in status and "NoNewPrivs:\t1" in status  # drop ALL
        # The IOC on the host, reached with the ConfigMap's address lists.
        doc = graphql(r.url, f'{{ channel(id: "{COUNTER}") {{ value connection }} }}')
        assert doc["data"]["channel"]["connection"] == "CONNECTED"
        assert doc["data"]["channel"]["value"] > 0
    for a, b in ((replicas[0], replicas[1]), (replicas[1], replicas[0])):
        assert asyncio.run(token_travels(a.url, b.url, COUNTER)) == (COUNTER,)


async def test_replicas_replaced_under_load_clients_stream_on(
    rollout: Rollout, record_property: Callable[[str, object], None]
) -> None:
    """A rolling update of both replicas behind haproxy (the Service), while a Python and a
    TypeScript client stream the counter with load: each is moved at least once, by a 4012
    close (the manifest's drain), resumes by itself on a new pod with a snapshot, and never
    sees the counter go back."""
    count = rollout.deployment["spec"]["replicas"]
    ports = [free_port() for _ in range(2 * count)]  # the old pods' and their replacements'
    old: list[KubeReplica] = [rollout.add(port) for port in ports[:count]]
    for r in old:
        r.wait_ready(BOUND)
    proxy = Haproxy(ports)
    proxy.start()
    py, ts = Stream("python"), Stream("typescript")
    task = asyncio.create_task(follow_py(proxy.url, py))
    node = TsFollower(proxy.url, ts)
    new: list[KubeReplica] = []
    try:
        for s in (py, ts):
            await eventually_async(s.counted(3), f"the {s.name} client streaming", timeout=BOUND)
        for r, port in zip(old, ports[count:], strict=True):
            seen = {s.name: len(s.values) for s in (py, ts)}
            new.append(await asyncio.to_thread(rollout.replace, r, BOUND, port))
            for s in (py, ts):
                await eventually_async(
                    s.counted(seen[s.name] + 5, lost_none=True),
                    f"the {s.name} client streaming after {r.pod}",
                    timeout=BOUND,
                )
        assert sum(stream_clients(r.url) for r in new) == 2  # everyone on the new pods
        for s in (py, ts):
            assert s.losses, f"the {s.name} client was never moved"
            for reason, _ in s.losses:
                assert "4012" in reason, (s.name, reason)
            assert len(s.resumes) == len(s.losses)
            for (_, before), after in zip(s.losses, s.resumes, strict=True):
                assert before is not None and after >= before, (s.name, before, after)
            assert s.values == sorted(s.values), s.name
            record_property(f"replacement_{s.name}_moves", len(s.losses))
            record_property(f"replacement_{s.name}_missed_updates", s.missed)
            print(f"replacement_{s.name}: moved {len(s.losses)}x, missed {s.missed} updates")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        errors = node.stop()
        proxy.stop()
    assert not errors.strip(), errors


async def test_chart_plays_ready_and_serves_the_ioc(image: str, ioc_env: dict[str, str]) -> None:
    """charts/pvwire/ with its default values, rendered by helm and played as `make kube-chart`
    plays it: the replicas the cluster starts (the HPA's minimum), each with the ConfigMap's
    settings, the chart's own variables and the Secret's key, a Python client reading the IOC
    through each, and a token of one attached on the other."""
    with played(render_chart(), ioc_env) as rollout:
        assert rollout.ignored == NOT_PLAYED
        replicas = [rollout.add() for _ in range(rollout.count)]
        assert len(replicas) == 2
        for r in replicas:
            await asyncio.to_thread(r.wait_ready, BOUND)
            assert r.env("PVWIRE_TOKEN_KEY") == rollout.token_key  # from the Secret
            assert r.env("PVWIRE_DEFAULT_SCHEME") == "ca"  # from the ConfigMap
            assert r.env("EPICS_CA_ADDR_LIST") == ioc_env["EPICS_CA_ADDR_LIST"]
            assert r.env("PVWIRE_DRAIN_WINDOW_S") == "20"  # the chart's own, beside the Secret
            inspect = json.loads(podman("inspect", r.container))[0]
            assert inspect["HostConfig"]["ReadonlyRootfs"] is True
            assert inspect["Config"]["User"].split(":")[0] == "10001"
            async with Client(r.url) as client:
                assert (await client.get("ca://PVW:AO")).metadata["units"] == "mm"
                seen = await counted(client, COUNTER, 3)
                assert seen == sorted(seen) and seen[-1] > seen[0], (r.pod, seen)
        a, b = replicas
        assert await token_travels(a.url, b.url, COUNTER) == (COUNTER,)
