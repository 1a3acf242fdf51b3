"""Ctrl-C and SIGTERM at the moments of a real sweep (the lab being built, warm-up, measure, the closing sample, between
runs): no traceback, exit 130 or 143, the sweep marked interrupted (not failed), no server, pgbench or lab file left,
and the same command afterwards resumes the sweep and completes it.

The signal is only recorded by pglab's handler and acted on at its safe points (pglab.interrupts); the race a handler
that raised could lose (issue 31) is built every time in tests/test_interrupts.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import pglab, processes_mentioning

pytestmark = pytest.mark.postgres

WARMUP_S, MEASURE_S, PAUSE_S = 3, 4, 4  # -T 3 is the warm-up's pgbench, -T 4 the measured one's


def _children(pid: int, name: str, arg: str) -> list[int]:
    """Child processes of ``pid`` named ``name`` with ``arg`` among their arguments (test_resume.py uses it too)."""
    return [p for p, (n, args) in _children_of(pid).items() if n == name and arg in args]


def _children_of(pid: int) -> dict[int, tuple[str, list[str]]]:
    """Child processes of ``pid``: pid → (name, arguments)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found[int(entry.name)] = (stat[stat.index("(") + 1 : stat.rindex(")")], args)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _pgbench_for(seconds: int) -> Callable[[dict[int, tuple[str, list[str]]]], bool]:
    def running(children: dict[int, tuple[str, list[str]]]) -> bool:
        return any(name == "pgbench" and "-T" in args and args[args.index("-T") + 1] == str(seconds)
                   for name, args in children.values())
    return running


def _runs(results: Path) -> list[tuple[str, str | None]]:
    try:
        db = sqlite3.connect(results / "results.db", timeout=10)
        try:
            return db.execute("SELECT status, reason FROM runs ORDER BY started").fetchall()
        finally:
            db.close()
    except sqlite3.Error:  # not created yet
        return []


class Moment:
    """When the signal is sent: once ``ready`` says so (given pglab's children and its results folder)."""

    def __init__(self, name: str, ready: Callable[[dict[int, tuple[str, list[str]]], Path], bool],
                 runs: list[list[str]], repeats: int = 1):
        self.name, self.ready, self.runs, self.repeats = name, ready, runs, repeats


class _Closing:
    """The measured pgbench has ended and the run is not stored yet: the closing sample, or the summary."""

    def __init__(self) -> None:
        self.measured = False

    def __call__(self, children: dict[int, tuple[str, list[str]]], results: Path) -> bool:
        if _pgbench_for(MEASURE_S)(children):
            self.measured = True
            return False
        return self.measured and [s for s, _ in _runs(results)] == ["running"]


MOMENTS = {
    "lab": lambda: Moment("lab", lambda ch, _r: any(name == "initdb" for name, _ in ch.values()), [[]]),
    "warm-up": lambda: Moment("warm-up", lambda ch, _r: _pgbench_for(WARMUP_S)(ch), [["interrupted"]]),
    "measure": lambda: Moment("measure", lambda ch, _r: _pgbench_for(MEASURE_S)(ch), [["interrupted"]]),
    # in the closing tick the wait raises; in the summary, which has no wait, the run ends ok and the engine stops
    # before the pause: either way nothing is half-stored
    "closing": lambda: Moment("closing", _Closing(), [["interrupted"], ["ok"]]),
    "between-runs": lambda: Moment("between-runs", lambda ch, r: [s for s, _ in _runs(r)] == ["ok"], [["ok"]],
                                   repeats=2),
}


@pytest.fixture
def lab_parent() -> Iterator[Path]:
    """A folder the lab goes in (target.local.paths.lab), traversable by the server user."""
    d = Path(tempfile.mkdtemp(prefix="pglab-interrupt-"))
    os.chmod(d, 0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize(("moment", "sig"), [
    ("lab", signal.SIGTERM),
    ("warm-up", signal.SIGINT), ("warm-up", signal.SIGTERM),
    ("measure", signal.SIGINT), ("measure", signal.SIGTERM),
    ("closing", signal.SIGINT),
    ("between-runs", signal.SIGINT), ("between-runs", signal.SIGTERM),
], ids=lambda v: v.name if isinstance(v, signal.Signals) else str(v))
def test_a_signal_at_any_moment_ends_the_sweep_cleanly_and_the_rerun_resumes(
        tmp_path: Path, lab_parent: Path, moment: str, sig: signal.Signals) -> None:
    when = MOMENTS[moment]()
    lab = lab_parent / "lab"
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"""
name: interrupted
target: {{local: {{instances: 2, synchronous: {{number: 1}}, paths: {{lab: {lab}}}}}}}
dataset: {{scale: 1}}
matrix: {{workload: [tpcb-like], clients: [2]}}
run: {{duration: {MEASURE_S}s, warmup: {WARMUP_S}s, repeats: {when.repeats}, pause: {PAUSE_S}s}}
""")
    results = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "pglab.cli", "run", str(plan), "--results", str(results)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen: set[int] = set()  # every process pglab started while it was watched: none may outlive it
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            children = _children_of(proc.pid)
            seen.update(children)
            if when.ready(children, results):
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"pglab ended before the {moment}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"the {moment} never came"
        os.kill(proc.pid, sig)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:  # the test failed: do not leave its lab behind
            proc.kill()
            proc.wait()
        if lab.exists():
            from pglab.targets.local.cluster import clean_lab

            with contextlib.suppress(Exception):
                clean_lab(lab)
    assert "Traceback" not in stderr, stderr
    assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], stdout + stderr
    assert "interrupted: the lab was torn down" in stderr
    db = sqlite3.connect(results / "results.db")
    (status, reason), = db.execute("SELECT status, reason FROM sweeps").fetchall()
    runs = db.execute("SELECT status, reason FROM runs ORDER BY started").fetchall()
    db.close()
    print(f"{moment}, {sig.name}: runs {runs}")
    assert (status, reason) == ("interrupted", f"interrupted by {sig.name}")
    assert [s for s, _ in runs] in when.runs, runs
    assert all(r == f"interrupted by {sig.name}" for s, r in runs if s == "interrupted"), runs
    assert processes_mentioning(str(lab)) == []
    assert [p for p in seen if _alive(p)] == []
    assert not lab.exists()

    rerun = pglab("run", str(plan), "--results", str(results))
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "Traceback" not in rerun.stderr
    assert "resuming sweep 1" in rerun.stdout + rerun.stderr
    db = sqlite3.connect(results / "results.db")
    assert db.execute("SELECT status FROM sweeps").fetchall() == [("done",)]
    assert db.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall() == [("ok", when.repeats)]
    db.close()
    assert processes_mentioning(str(lab)) == [] and not lab.exists()
