"""Faults inside a run: pgbench, a standby, the primary killed mid-run. Each such run is marked failed with the
reason, the lab is repaired, and the sweep goes on; the report shows the failed runs."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import pglab, processes_mentioning
from test_resume import _fault_each_measured_pgbench

pytestmark = pytest.mark.postgres


def _postmaster(lab: Path, node: str) -> int:
    state = json.loads((lab / "lab.json").read_text())
    data = next(Path(n["data"]) for n in state["nodes"] if n["name"] == node)
    return int((data / "postmaster.pid").read_text().splitlines()[0])


def test_runs_hit_by_a_fault_fail_with_the_reason_and_the_sweep_goes_on(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("""
name: faults
target: {local: {instances: 3, synchronous: {method: any, number: 1}}}
dataset: {scale: 1}
matrix: {workload: [tpcb-like], clients: [2]}
run: {duration: 6s, repeats: 4}
""")
    results = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "pglab.cli", "run", str(plan), "--results", str(results),
                             "--format", "csv"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lab: Path | None = None
    faults = ["pgbench", "n1", "n0"]

    def kill(victim: str, pgbench: int) -> None:
        nonlocal lab
        if lab is None:
            target = sqlite3.connect(results / "results.db").execute("SELECT target FROM sweeps").fetchone()[0]
            lab = Path(json.loads(target)["lab_dir"])
        os.kill(pgbench if victim == "pgbench" else _postmaster(lab, victim), signal.SIGKILL)

    try:
        _fault_each_measured_pgbench(proc, faults, 240, kill)
        _out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            pglab("lab", "clean")
    assert not faults, f"the sweep ended before every fault was injected: {err[-2000:]}"
    assert proc.returncode == 1, err  # failed runs: exit 1, after the sweep went on
    assert "Traceback" not in err
    db = sqlite3.connect(results / "results.db")
    runs = db.execute("SELECT repeat, status, reason FROM runs ORDER BY repeat").fetchall()
    assert [(r, s) for r, s, _ in runs] == [(1, "failed"), (2, "failed"), (3, "failed"), (4, "ok")], runs
    assert "pgbench was killed by SIGKILL" in runs[0][2]
    assert "n1 not running" in runs[1][2]
    assert "n0" in runs[2][2] or "connection" in runs[2][2]
    assert "restarted n1" in err and "restarted n0" in err
    assert db.execute("SELECT status FROM sweeps").fetchone()[0] == "done"
    db.close()
    report = pglab("report", str(results), "--per-run", check=True).stdout
    assert report.count("failed") >= 3 and "killed by SIGKILL" in report
    assert lab is not None and processes_mentioning(str(lab)) == []
