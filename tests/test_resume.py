"""Resume after any interruption, no orphans after SIGKILL, one writer per results folder."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import pglab, processes_mentioning
from test_interrupt import _children

pytestmark = pytest.mark.postgres

PLAN = """
name: resumable
target: {local: {instances: 2, synchronous: {number: 1}}}
dataset: {scale: 1}
matrix: {workload: [tpcb-like], clients: [1, 2]}
run: {duration: 2s, repeats: 2}
"""


def _pgbench_children(pid: int) -> list[int]:
    """The measured pgbench (not pgbench -i) started by ``pid``."""
    return _children(pid, "pgbench", "-T")


def _fault_each_measured_pgbench(proc: subprocess.Popen[str], faults: list[str], timeout: float,
                                 act: Callable[[str, int], None]) -> None:
    """``act(fault, pgbench pid)`` 2 s into each new measured pgbench ``proc`` (pglab) starts, one fault each, until
    ``faults`` (consumed: what is left was never injected) runs out, pglab ends, or ``timeout`` passes."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while faults and time.monotonic() < deadline and proc.poll() is None:
        fresh = [p for p in _pgbench_children(proc.pid) if p not in seen]
        if not fresh:
            time.sleep(0.1)
            continue
        seen.update(fresh)
        time.sleep(2.0)  # inside the measured run
        act(faults.pop(0), fresh[0])


def _ok_runs(results: Path) -> list[tuple[str, str, int]]:
    try:
        db = sqlite3.connect(results / "results.db", timeout=30)
        rows = db.execute("SELECT r.id, p.key, r.repeat FROM runs r JOIN points p ON p.id = r.point_id "
                          "WHERE r.status = 'ok' ORDER BY r.id").fetchall()
        db.close()
        return rows
    except sqlite3.Error:
        return []


def test_sigkill_mid_sweep_then_the_same_command_completes_without_duplicates_or_orphans(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "pglab.cli", "run", str(plan), "--results", str(results), "--format", "json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 180
    before: list[tuple[str, str, int]] = []
    pgbench: list[int] = []
    while time.monotonic() < deadline and proc.poll() is None:
        before = _ok_runs(results)
        pgbench = _pgbench_children(proc.pid)
        if before and pgbench:  # one run stored, the next one under way
            break
        time.sleep(0.1)
    assert before and pgbench, f"the sweep never reached its second run: {proc.communicate()[1][-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)  # no handler runs: servers and pgbench stay behind
    proc.communicate()
    db = sqlite3.connect(results / "results.db")
    lab_dir = json.loads(db.execute("SELECT target FROM sweeps").fetchone()[0])["lab_dir"]
    db.close()
    assert processes_mentioning(lab_dir), "the killed pglab left its servers running"

    again = pglab("run", str(plan), "--results", str(results), "--format", "json")
    assert again.returncode == 0, again.stderr
    assert f"cleaned up lab {lab_dir} left behind by pglab pid {proc.pid}" in again.stderr
    assert "resuming sweep 1:" in again.stderr and "already complete" in again.stderr
    assert processes_mentioning(lab_dir) == [] and not Path(lab_dir).exists()
    assert not any(Path(f"/proc/{p}").exists() for p in pgbench)

    after = _ok_runs(results)
    assert set(before) <= set(after)  # completed runs kept as they were
    assert sorted((k, r) for _, k, r in after) == sorted({(k, r) for _, k, r in after})  # no duplicates
    assert len(after) == 4
    db = sqlite3.connect(results / "results.db")
    assert db.execute("SELECT count(*) FROM runs").fetchone()[0] == 4  # the killed run is not counted
    assert db.execute("SELECT count(*), min(status) FROM sweeps").fetchone() == (1, "done")
    orphans = db.execute("SELECT count(*) FROM series WHERE run_id NOT IN (SELECT id FROM runs)").fetchone()[0]
    assert orphans == 0
    db.close()
    table = json.loads(again.stdout)
    assert [row["repeats"] for row in table] == [2, 2]
    assert (results / "discarded").is_dir() and len(list((results / "discarded").iterdir())) == 1
    assert {p.name for p in (results / "runs").iterdir()} == {run_id for run_id, _, _ in after}

    # a rerun of a complete sweep runs nothing and builds no lab
    third = pglab("run", str(plan), "--results", str(results))
    assert third.returncode == 0, third.stderr
    assert "4 of 4 runs already complete, 0 to go" in third.stderr and "initdb" not in third.stderr
    assert len(_ok_runs(results)) == 4


def test_a_changed_plan_is_refused_unless_forced_new(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: one\ntarget: {local: {instances: 1, synchronous: null}}\ndataset: {scale: 1}\n"
                    "run: {transactions: 20}\n")
    results = tmp_path / "results"
    pglab("run", str(plan), "--results", str(results), check=True)
    plan.write_text(plan.read_text().replace("transactions: 20", "transactions: 30"))
    refused = pglab("run", str(plan), "--results", str(results))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "holds a sweep of a different plan ('one'" in refused.stderr and "--force-new" in refused.stderr
    assert "initdb" not in refused.stderr
    forced = pglab("run", str(plan), "--results", str(results), "--force-new")
    assert forced.returncode == 0, forced.stderr
    db = sqlite3.connect(results / "results.db")
    assert db.execute("SELECT count(*) FROM sweeps WHERE status = 'done'").fetchone()[0] == 2
    db.close()


def test_a_second_writer_on_the_same_folder_is_refused(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: one\ntarget: {local: {instances: 1, synchronous: null}}\nrun: {transactions: 10}\n")
    results = tmp_path / "results"
    results.mkdir()
    with open(results / ".lock", "w") as held:
        held.write("4242\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = pglab("run", str(plan), "--results", str(results))
    assert proc.returncode == 2, proc.stderr
    assert "is being written by another pglab (pid 4242)" in proc.stderr
    assert not (results / "results.db").exists()
