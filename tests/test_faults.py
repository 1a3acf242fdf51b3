"""Faults inside a run: pgbench, a standby, the primary killed mid-run. Each such run is marked failed with the
reason, the lab is repaired, and the sweep goes on; the report shows the failed runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import pglab, processes_mentioning
from helpers import fault_each_measured_pgbench, lab_dir, postmaster, stored_runs, sweep_row

pytestmark = pytest.mark.postgres


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
        lab = lab or lab_dir(results)
        os.kill(pgbench if victim == "pgbench" else postmaster(lab, victim), signal.SIGKILL)

    try:
        fault_each_measured_pgbench(proc, faults, 240, kill)
        _out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            pglab("lab", "clean")
    assert not faults, f"the sweep ended before every fault was injected: {err[-2000:]}"
    assert proc.returncode == 1, err  # failed runs: exit 1, after the sweep went on
    assert "Traceback" not in err
    runs = stored_runs(results)
    assert [(r.repeat, r.status) for r in runs] == [(1, "failed"), (2, "failed"), (3, "failed"), (4, "ok")], (
        [(r.repeat, r.status, r.reason) for r in runs], err[-3000:])
    reasons = [r.reason or "" for r in runs]
    assert "pgbench was killed by SIGKILL" in reasons[0]
    assert "n1 not running" in reasons[1]
    assert "n0" in reasons[2] or "connection" in reasons[2]
    assert "restarted n1" in err and "restarted n0" in err
    assert sweep_row(results)["status"] == "done"
    report = pglab("report", str(results), "--per-run", check=True).stdout
    assert report.count("failed") >= 3 and "killed by SIGKILL" in report
    assert lab is not None and processes_mentioning(str(lab)) == []
