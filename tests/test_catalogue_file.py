"""The catalogue file: names one per line, read again when it changes or on SIGHUP, and a file
that cannot be read keeps the catalogue loaded before."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest
from pvwire.config import CatalogueFile, Settings, read_catalogue

from tests.eventually import eventually
from tests.server_process import ServerProcess


def test_read_catalogue_skips_comments_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "names.txt"
    path.write_text("# beamline 1\nBL1:MOTOR:X  # the X stage\n\n  pva://BL1:CAM  \n#BL1:OLD\n")
    assert read_catalogue(path) == ["BL1:MOTOR:X", "pva://BL1:CAM"]


def test_settings_take_the_file_from_toml_and_environment(tmp_path: Path) -> None:
    toml = tmp_path / "pvwire.toml"
    toml.write_text('catalogue_file = "/etc/pvwire/names.txt"\n')
    assert Settings.load(toml, env={}).catalogue_file == "/etc/pvwire/names.txt"
    env = {"PVWIRE_CATALOGUE_FILE": "/srv/names.txt"}
    assert Settings.load(toml, env=env).catalogue_file == "/srv/names.txt"


def test_change_is_read_and_failure_keeps_old_ids(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "names.txt"
    path.write_text("A\nB\n")
    catalogue = CatalogueFile(path)  # ids as lists: mypy keeps a compared tuple narrowed
    assert catalogue.poll() and list(catalogue.ids) == ["A", "B"]
    assert not catalogue.poll()  # unchanged: not read again
    path.write_text("A\nB\nC\n")
    assert catalogue.poll() and list(catalogue.ids) == ["A", "B", "C"]
    with caplog.at_level(logging.ERROR, logger="pvwire.catalogue"):
        path.write_bytes(b"A\n\xff\xfe\n")  # not UTF-8
        assert not catalogue.poll() and not catalogue.poll()
        path.unlink()
        assert not catalogue.poll() and not catalogue.poll()
    assert list(catalogue.ids) == ["A", "B", "C"]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2  # once per failure, not once per poll
    assert "can't decode byte 0xff" in messages[0] and "keeping the 3 ids" in messages[0]
    assert "No such file or directory" in messages[1]
    path.write_text("D\n")
    assert catalogue.poll() and list(catalogue.ids) == ["D"]


def test_request_reload_reads_an_unchanged_looking_file(tmp_path: Path) -> None:
    path = tmp_path / "names.txt"
    path.write_text("A\n")
    catalogue = CatalogueFile(path)
    catalogue.poll()
    before = path.stat().st_mtime_ns
    path.write_text("B\n")  # same size; and the same time, as a coarse clock would give
    os.utime(path, ns=(before, before))
    assert not catalogue.poll() and catalogue.ids == ("A",)
    catalogue.request_reload()
    assert catalogue.poll() and catalogue.ids == ("B",)


def search(server: ServerProcess, pattern: str) -> list[str]:
    found: list[str] = server.graphql(f'query {{ search(pattern: "{pattern}") }}')["data"]["search"]
    return found


def test_server_reloads_the_file_without_restart(tmp_path: Path) -> None:
    path = tmp_path / "names.txt"
    path.write_text("# facility names\nCAT:ONE\npva://CAT:TWO\nfoo://CAT:BAD\n")
    with ServerProcess("--catalogue-file", str(path), "--log-level", "info") as server:
        assert search(server, "*CAT:*") == ["ca://CAT:ONE", "pva://CAT:TWO"]
        # The log is read by a thread of ServerProcess's: perhaps after the server answers.
        logged = (
            f"catalogue file {path}: 3 channel ids",
            "left out 1 entries that are not valid channel ids: 'foo://CAT:BAD'",
        )
        eventually(lambda: all(line in server.log() for line in logged), server.log)

        path.write_text("CAT:FIVE\n")
        eventually(lambda: search(server, "*CAT:*") == ["ca://CAT:FIVE"], "file change")

        path.write_bytes(b"\xff\n")
        eventually(lambda: "cannot be read" in server.log(), "failure logged")
        assert search(server, "*CAT:*") == ["ca://CAT:FIVE"]
        assert server.graphql("{ server { version } }")["data"]["server"]["version"]


def _rewrite_unnoticed(path: Path, text: str) -> None:
    """New contents of the same size under the same modification time: the once-a-second
    check cannot see the change, only SIGHUP can make the server read the file again."""
    before = path.stat()
    assert len(text.encode()) == before.st_size
    path.write_text(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_sighup_reads_the_catalogue_and_the_access_rules_again(tmp_path: Path) -> None:
    names = tmp_path / "names.txt"
    names.write_text("CAT:FIVE\nCAT:SIX\n")
    rules = tmp_path / "rules.toml"
    hide = 'default = "READ"\n[[rule]]\nchannels = ["ca://CAT:{}"]\naccess = "NONE"\n'
    rules.write_text(hide.format("XXX"))
    with ServerProcess("--catalogue-file", str(names), "--access-rules", str(rules)) as server:
        assert search(server, "*CAT:*") == ["ca://CAT:FIVE", "ca://CAT:SIX"]
        _rewrite_unnoticed(names, "CAT:FOUR\nCAT:SIX\n")
        _rewrite_unnoticed(rules, hide.format("SIX"))
        assert server.pid is not None
        os.kill(server.pid, signal.SIGHUP)
        # One signal, both files: the new name is offered and the hidden one is not.
        eventually(lambda: search(server, "*CAT:*") == ["ca://CAT:FOUR"], "reload on SIGHUP")


def test_sighup_without_catalogue_file_keeps_the_server_running() -> None:
    with ServerProcess() as server:
        assert server.pid is not None
        os.kill(server.pid, signal.SIGHUP)
        os.kill(server.pid, signal.SIGHUP)
        assert server.graphql("{ server { version } }")["data"]["server"]["version"]
