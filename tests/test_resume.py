"""Resume after any interruption, no orphans after SIGKILL, one writer per results folder."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import pglab, processes_mentioning, run_plan
from helpers import identities, pgbench_children, read_store, still_running, stored_runs, sweep_row

pytestmark = pytest.mark.postgres

PLAN = """
name: resumable
target: {local: {instances: 2, synchronous: {number: 1}}}
dataset: {scale: 1}
matrix: {workload: [tpcb-like], clients: [1, 2]}
run: {duration: 2s, repeats: 2}
"""


def _ok_runs(results: Path) -> list[tuple[str, str, int]]:
    """(run id, point, repeat) of the runs stored ok so far."""
    return [(r.id, json.dumps(r.axes, sort_keys=True), r.repeat)
            for r in stored_runs(results, missing_ok=True) if r.status == "ok"]


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
        pgbench = pgbench_children(proc.pid)
        if before and pgbench:  # one run stored, the next one under way
            break
        time.sleep(0.1)
    assert before and pgbench, f"the sweep never reached its second run: {proc.communicate()[1][-2000:]}"
    seen = identities(pgbench)
    os.kill(proc.pid, signal.SIGKILL)  # no handler runs: servers and pgbench stay behind
    proc.communicate()
    (killed,) = [r.id for r in stored_runs(results) if r.status == "running"]  # the run under way, left running
    lab_dir = sweep_row(results)["target"]["lab_dir"]
    assert processes_mentioning(lab_dir), "the killed pglab left its servers running"

    again = run_plan(plan, results, "--format", "json").proc
    assert f"cleaned up lab {lab_dir} left behind by pglab pid {proc.pid}" in again.stderr
    assert "resuming sweep 1:" in again.stderr and "already complete" in again.stderr
    assert processes_mentioning(lab_dir) == [] and not Path(lab_dir).exists()
    assert not still_running(seen)

    after = _ok_runs(results)
    assert set(before) <= set(after)  # completed runs kept as they were
    assert sorted((k, r) for _, k, r in after) == sorted({(k, r) for _, k, r in after})  # no duplicates
    assert len(after) == 4
    with read_store(results) as store:
        assert len(store.runs()) == 4  # the killed run is not counted
        assert [s["status"] for s in store.sweeps()] == ["done"]
        sweep_id = store.latest_sweep_id()
        assert killed not in {r.id for r in store.runs()} and store.series(killed) == []  # no orphan samples
        assert {run_id for run_id, *_ in store.sweep_series(sweep_id)} == {run_id for run_id, _, _ in after}
    table = json.loads(again.stdout)
    assert [row["repeats"] for row in table] == [2, 2]
    assert (results / "discarded").is_dir() and len(list((results / "discarded").iterdir())) == 1
    assert {p.name for p in (results / "runs").iterdir()} == {run_id for run_id, _, _ in after}

    # a rerun of a complete sweep runs nothing and builds no lab
    third = run_plan(plan, results).proc
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
    run_plan(plan, results, "--force-new")
    with read_store(results) as store:
        assert [s["status"] for s in store.sweeps()] == ["done", "done"]


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
