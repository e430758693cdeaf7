"""docs/OPERATIONS.md and the unit file beside it name only flags, settings and metrics that
exist, and the commands they give parse."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from pvwire.cli import build_parser
from pvwire.config import Settings

from tests.server_process import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
GUIDE = (ROOT / "docs" / "OPERATIONS.md").read_text()
UNIT = ROOT / "docs" / "pvwire.service"
# Flags the guide gives to other programs, with the program.
OTHER_TOOLS = {"--example-config": "pvagw", "--network": "docker", "--now": "systemctl"}
OTHER_TOOLS |= {"--no-deps": "pip", "--no-build-isolation": "pip"}
OTHER_TOOLS |= {"--strict": "kubernetes-validate"}
OTHER_TOOLS |= {"--build-arg": "docker", "--from-literal": "kubectl"}
OTHER_TOOLS |= {"--cert": "kubectl", "--key": "kubectl"}
OTHER_TOOLS |= {"--ca-file": "pvwire (the client's command line)"}
# Variables of the clients the guide names, not server settings.
CLIENT_VARIABLES = {"ca_file"}


FLAG = r"(?<![\w-])--[a-z][a-z-]*"


def test_every_flag_in_the_guide_is_a_serve_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    options = set(re.findall(FLAG, capsys.readouterr().out))
    assert {"--catalogue-file", "--log-format", "--port"} <= options
    flags = set(re.findall(FLAG, GUIDE))
    assert {"--catalogue-file", "--log-format", "--write-rule", "--token-key"} <= flags
    assert flags - options - set(OTHER_TOOLS) == set()


def test_every_setting_in_the_guide_exists() -> None:
    fields = {f.name for f in dataclasses.fields(Settings)}
    variables = set(re.findall(r"PVWIRE_[A-Z_]+", GUIDE))
    assert {"PVWIRE_CATALOGUE_FILE", "PVWIRE_LOG_FORMAT"} <= variables
    known = fields | {"token_key"} | CLIENT_VARIABLES
    assert {v.removeprefix("PVWIRE_").lower() for v in variables} <= known
    blocks = re.findall(r"```toml\n(.*?)```", GUIDE, re.S)
    assert len(blocks) == 2
    for block in blocks:
        Settings().update(tomllib.loads(block))  # raises on an unknown setting
    # `token_ttl_s`, `catalogue_file = "..."` and the like
    named = set(re.findall(r"`([a-z]+(?:_[a-z]+)+)(?: = [^`]*)?`", GUIDE))
    assert {"catalogue_file", "write_rules", "token_ttl_s"} <= named
    assert {n for n in named if not n.startswith("pvwire_")} <= fields


def test_every_metric_in_the_guide_is_served(server: ServerProcess) -> None:
    text = server.metrics()
    served = set(re.findall(r"^# TYPE (\w+) ", text, re.M))
    mentioned = set(re.findall(r"\bpvwire_[a-z_]+[a-z]", GUIDE))
    assert len(mentioned) >= 13
    assert mentioned <= served
    assert served <= mentioned  # and every served series is documented


def exec_start() -> list[str]:
    (line,) = [x for x in UNIT.read_text().splitlines() if x.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(exec_start()[1:], id="systemd"),
        pytest.param(
            json.loads(re.findall(r"^CMD (.*)$", (ROOT / "Dockerfile").read_text(), re.M)[0]),
            id="dockerfile",
        ),
        pytest.param(
            yaml.safe_load((ROOT / "k8s" / "base" / "deployment.yaml").read_text())["spec"][
                "template"
            ]["spec"]["containers"][0]["args"],
            id="k8s",
        ),
    ],
)
def test_service_commands_parse(args: list[str]) -> None:
    parsed = build_parser().parse_args(args)
    assert parsed.command == "serve" and parsed.host == "0.0.0.0" and parsed.port == 8080


def test_unit_file_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze (Debian's systemd package) checks the unit file"
    # verify also checks that ExecStart's program exists: point it at this environment's.
    program = Path(sys.executable).with_name("pvwire-server")
    assert exec_start()[0] == "/opt/pvwire/venv/bin/pvwire-server"
    unit = tmp_path / "pvwire.service"
    unit.write_text(UNIT.read_text().replace(exec_start()[0], str(program)))
    p = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == "" and p.stdout == "", p.stdout + p.stderr


def test_readme_links_the_guide_and_says_how_to_change_the_port() -> None:
    top = "\n".join((ROOT / "README.md").read_text().splitlines()[:15])
    assert "(docs/OPERATIONS.md)" in top and "make run PORT=8092" in top
