"""`make bench`'s run_all at a tiny size, so its comparisons cannot rot (`make test`).

No timing assertions: only that every part ran end to end on real processes, gave numbers and
reached latest.md and latest.json with its ratios. One test per part keeps each within the
suite's per-test timeout on a loaded machine.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench import run_all


def run_tiny(out: Path, only: str) -> tuple[dict[str, Any], str]:
    run_all.main(
        ["--only", only, "--duration", "2", "--tiny", "--no-micro", "--churn", "0",
         "--out", str(out)]
    )  # fmt: skip
    doc = json.loads((out / "latest.json").read_text())
    md = (out / "latest.md").read_text()
    assert "FAILED" not in md, md
    for name, got in doc["extras"].items():
        assert "failed" not in got, (name, got)
        assert run_all.EXTRAS[name].title in md
    return doc, md


def test_workers_1_and_2_tiny(tmp_path: Path) -> None:
    doc, md = run_tiny(tmp_path, "workers")
    assert [r["scenario"] for r in doc["scenarios"]] == run_all.GROUPS["workers"]
    for r in doc["scenarios"]:
        assert r["received"] > 0 and r["pvs"] <= 10 and r["clients"] <= 2, r
    section = md.split("## 1 and 2 workers")[1].split("\n## ")[0]
    pairs = [line for line in section.splitlines() if line.startswith("| CA:")]
    assert len(pairs) == len(run_all.GROUPS["workers"]) // 2, section


def test_failover_tiny(tmp_path: Path) -> None:
    doc, _ = run_tiny(tmp_path, "failover")
    got = doc["extras"]["failover"]
    for kind in ("sigkill", "sigterm"):
        assert got[kind]["clients_moved"] > 0, got
        assert got[kind]["snapshot_over_target"] > 0 and got[kind]["missed_max"] >= 0, got


def test_gateway_tiny(tmp_path: Path) -> None:
    doc, md = run_tiny(tmp_path, "gateway")
    got = doc["extras"]["gateway"]
    assert got["direct"]["updates_per_s"] > 0 and got["gateway"]["updates_per_s"] > 0, got
    assert got["ratio"]["updates_per_s"] > 0 and got["gateway"]["gateway_cpu"] >= 0, got
    assert "via pvagw" in md


def test_clients_tiny(tmp_path: Path) -> None:
    doc, md = run_tiny(tmp_path, "client-cpu,cli-monitor")
    cpu = doc["extras"]["client-cpu"]
    for api in ("floor", "monitor", "batches"):
        assert cpu[api]["updates"] > 0 and cpu[api]["cpu_pct"] >= 0, cpu
    assert cpu["batches"]["ratio_to_floor"] > 0
    for mode in doc["extras"]["cli-monitor"]["modes"]:
        assert mode["lines_per_s"] > 0 and mode["bytes_per_line"] > 10, mode
        assert mode["lag_samples"] > 0 and not math.isnan(mode["lag_p50_ms"]), mode
    assert "batches" in md and "json" in md


def test_only_takes_names_and_groups_and_refuses_unknown_names() -> None:
    names, extras = run_all.expand("coniql,ca-1x10,gateway")
    assert names == [*run_all.GROUPS["coniql"], "ca-1x10"] and extras == ["gateway"]
    with pytest.raises(SystemExit, match="ca-1x3"):
        run_all.expand("ca-1x3")
