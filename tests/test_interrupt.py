"""Ctrl-C and SIGTERM in the middle of a run: no server or pgbench left, the run marked interrupted."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import processes_mentioning

pytestmark = pytest.mark.postgres


def _children(pid: int, name: str, arg: str) -> list[int]:
    """Child processes of ``pid`` named ``name`` with ``arg`` on their command line."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and comm == name and arg in (entry / "cmdline").read_bytes().decode().split("\0"):
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _clean_lab_of(results: Path) -> None:
    from pglab.targets.local.cluster import clean_lab

    try:
        db = sqlite3.connect(results / "results.db")
        target = db.execute("SELECT target FROM sweeps").fetchone()
        db.close()
    except sqlite3.Error:
        return
    if target and target[0]:
        clean_lab(Path(json.loads(target[0])["lab_dir"]))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_mid_run_leaves_nothing_running(tmp_path: Path, sig: signal.Signals) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("""
name: interrupted
target: {local: {instances: 2, synchronous: {number: 1}}}
dataset: {scale: 1}
matrix: {workload: [tpcb-like], clients: [2]}
run: {duration: 120s, repeats: 2}
""")
    results = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "pglab.cli", "run", str(plan), "--results", str(results)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    pgbench_pids: list[int] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            pgbench_pids = _children(proc.pid, "pgbench", "-T")  # the measured run, not pgbench -i
            if pgbench_pids:
                break
            time.sleep(0.2)
        assert pgbench_pids, f"pgbench never started: {proc.stderr.read() if proc.poll() is not None else ''}"
        time.sleep(1.5)  # well inside the measured run
        os.kill(proc.pid, sig)
        _stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # the test failed: do not leave its lab behind
            proc.kill()
            proc.wait()
            _clean_lab_of(results)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    db = sqlite3.connect(results / "results.db")
    runs = db.execute("SELECT status, reason FROM runs").fetchall()
    assert runs == [("interrupted", f"interrupted by {sig.name}")]
    status, target = db.execute("SELECT status, target FROM sweeps").fetchone()
    assert status == "interrupted"
    lab_dir = json.loads(target)["lab_dir"]
    db.close()
    assert processes_mentioning(lab_dir) == []
    assert not any(_alive(p) for p in pgbench_pids)
    assert not Path(lab_dir).exists()
