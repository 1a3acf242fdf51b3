"""Progress when pglab's output is no terminal (a CI log, `| tee`): the live bar is a terminal's alone, so each
run's start is a line, "run n of N" with the sweep's ETA (issue 31: nothing said how far the sweep was)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import run_plan

pytestmark = pytest.mark.postgres


def test_a_piped_sweep_says_run_n_of_n_with_its_eta(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: piped\ntarget: {local: {instances: 1}}\ndataset: {scale: 1}\n"
                    "matrix: {clients: [1, 2]}\nrun: {transactions: 20, repeats: 1}\n")
    proc = run_plan(plan, tmp_path / "r", "--format", "csv").proc
    starts = [line for line in proc.stderr.splitlines() if line.startswith("run ") and " of " in line]
    assert len(starts) == 2, proc.stderr  # one line a run, not one a phase
    # the runs go in an interleaved order (the plan's seed): either point may come first
    assert re.fullmatch(r"run 1 of 2: tpcb-like sc=on c=[12] j=[12] #1; sweep ETA (not known yet|\d\d:\d\d)",
                        starts[0]), starts
    # the second run's ETA comes from the first run's time
    assert re.fullmatch(r"run 2 of 2: tpcb-like sc=on c=[12] j=[12] #1; sweep ETA \d\d:\d\d", starts[1]), starts
    assert {re.search(r"c=(\d)", line).group(1) for line in starts} == {"1", "2"}  # type: ignore[union-attr]
    ended = [line for line in proc.stderr.splitlines() if "tps, p99" in line]
    assert proc.stderr.index(starts[0]) < proc.stderr.index(ended[0]) < proc.stderr.index(starts[1])


def test_the_eta_is_paced_by_the_runs_not_by_what_came_before_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # a Kubernetes sweep: 200 s of Cluster, storage phase and dataset, then runs of 30 s each; after the first run
    # the 7 left take 210 s, not 7 × 230 s
    import io

    from rich.console import Console

    from pglab import cli
    from pglab.plan.expand import Point

    clock = [1000.0]
    monkeypatch.setattr(cli.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    view = cli.ProgressView(Console(file=out, force_terminal=False, width=120))
    point = Point(index=0, workload="tpcb-like", synchronous_commit="on", clients=1, jobs=1)
    with view:
        view.sweep_started(8, None)
        clock[0] += 200
        view.run_started(point, 1, "measure")
        clock[0] += 30
        view.run_finished(point, 1, "ok", {"tps": 1.0})
        view.run_started(point, 2, "measure")
    assert "run 2 of 8: tpcb-like sc=on c=1 j=1 #2; sweep ETA 03:30" in out.getvalue(), out.getvalue()
