"""pvwire's wheel and its dependency bounds: the wheel holds the compiled PVA module and is tagged
for this platform (a `py3-none-any` tag would let pip install it where the module cannot load),
and pyproject's bounds are the versions the tests run with (requirements.lock)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
MODULES = {
    name: name.replace(".", "/") + sysconfig.get_config_var("EXT_SUFFIX")
    for name in ("pvwire.upstream._pvaingest", "pvwire.core._journal")
}
# What the wheel is built from (the Dockerfile's wheel stage copies these too); built files
# that `make` leaves in the checkout stay out, so the build has to make the module itself.
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "scripts/build_ext.py")
LEFT_OUT = shutil.ignore_patterns("*.so", "__pycache__", "node_modules", "*.egg-info")
DEV_ONLY = ("pvwire_dev/", "pvwire/ioc.py", "pvwire/demo_images.py", "pvwire/demo/")


def lock() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.mark.timeout(300)  # compiles the modules (~3 s on an idle machine)
def test_wheel_is_tagged_for_this_platform_and_holds_the_modules(tmp_path: Path) -> None:
    context = tmp_path / "context"
    for rel in SOURCES:
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, context / rel)
    shutil.copytree(ROOT / "server", context / "server", ignore=LEFT_OUT)
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"),
            *("--wheel-dir", str(wheels), str(context)),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    [wheel] = wheels.glob("*.whl")
    _, _, _, tags = parse_wheel_filename(wheel.name)
    interpreter = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert {(t.interpreter, t.abi, t.platform) for t in tags} == {
        (interpreter, interpreter, platform)
    }, wheel.name
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        info = whl.read("pvwire-0.1.0.dist-info/WHEEL").decode()
        whl.extractall(tmp_path / "installed")
    assert set(MODULES.values()) <= names
    assert "Root-Is-Purelib: false" in info
    assert not any(n.endswith((".cpp", ".c")) for n in names), "the sources are not package data"
    # The test IOCs and the demo IOC are development only: neither their package nor the
    # modules' old places inside pvwire.
    dev = [n for n in names if n.startswith(DEV_ONLY)]
    assert dev == [] and "pvwire/cli.py" in names, dev
    # The modules in the wheel load (against this environment's pvxslibs), not the checkout's.
    for name, path in MODULES.items():
        where = subprocess.run(
            [sys.executable, "-c", f"import {name} as m; print(m.__file__)"],
            env={"PYTHONPATH": str(tmp_path / "installed"), "PATH": "/usr/bin:/bin"},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert where.returncode == 0, where.stderr
        assert where.stdout.strip() == str(tmp_path / "installed" / path)


def test_runtime_bounds_start_at_the_tested_versions() -> None:
    pins = lock()
    for spec in project()["project"]["dependencies"]:  # type: ignore[index]
        req = Requirement(spec)
        tested = pins[canonicalize_name(req.name)]
        lower = [Version(s.version) for s in req.specifier if s.operator == ">="]
        upper = [Version(s.version) for s in req.specifier if s.operator == "<"]
        assert lower == [tested], f"{spec}: requirements.lock tests {tested}"
        assert len(upper) == 1 and tested in req.specifier, spec


@pytest.mark.parametrize("name", ["pvxslibs", "epicscorelibs"])
def test_module_abi_dependencies_are_held_to_the_compiled_release(name: str) -> None:
    """The module is compiled against these C++ headers, which keep no ABI across releases:
    the next minor pvxslibs (and the next epicscorelibs build) is out, at run and build time."""
    tested = lock()[name]
    if name == "pvxslibs":
        next_release = Version(f"{tested.major}.{tested.minor + 1}")
    else:  # 7.0.10.99.0.2: EPICS 7.0.10, then the wheel's own release numbers
        next_release = Version(".".join(map(str, (*tested.release[:4], tested.release[4] + 1))))
    build = project()["build-system"]["requires"]  # type: ignore[index]
    runtime = project()["project"]["dependencies"]  # type: ignore[index]
    for spec in (*build, *runtime):
        req = Requirement(spec)
        if canonicalize_name(req.name) == name:
            assert tested in req.specifier, spec
            assert not req.specifier.contains(next_release, prereleases=True), spec
            assert req.specifier.contains(Version(re.sub(r"\d+$", "999", str(tested)))), spec
