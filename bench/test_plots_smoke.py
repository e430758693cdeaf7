"""bench.plots draws every curve from the saved runs in the tree, so it cannot rot (`make test`)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.plots import DEFAULT_SOURCES, load_runs, main


def test_plots_from_the_saved_runs(tmp_path: Path) -> None:
    main(["--out", str(tmp_path)])
    for name in ("per_pv.png", "fanout.png", "recording.png"):
        assert (tmp_path / name).stat().st_size > 10_000, name


def test_quick_runs_are_left_out(tmp_path: Path) -> None:
    run = json.loads(next(p for p in DEFAULT_SOURCES if p.match("runs/*/*.json")).read_text())
    for bench in run["benchmarks"]:
        bench["extra_info"]["quick"] = 1
    quick = tmp_path / "quick.json"
    quick.write_text(json.dumps(run))
    assert load_runs([quick]) == []
    assert len(load_runs(DEFAULT_SOURCES)) >= 3
