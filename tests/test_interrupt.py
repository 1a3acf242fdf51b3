"""Ctrl-C and SIGTERM at the moments of a real sweep (the lab being built, warm-up, measure, the closing sample, between
runs): no traceback, exit 130 or 143, the sweep marked interrupted (not failed), no server, pgbench or lab file left,
and the same command afterwards resumes the sweep and completes it. The resume is run once per moment: the other
signal at that moment leaves the same stored sweep and the same clean host (both checked, the reason's signal name
aside), so its resume would replay the same one.

The signal is only recorded by pglab's handler and acted on at its safe points (pglab.interrupts); the race a handler
that raised could lose (issue 31) is built every time in tests/test_interrupts.py."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import processes_mentioning, run_plan
from helpers import children_of, identities, read_store, still_running, stored_runs

pytestmark = pytest.mark.postgres

WARMUP_S, MEASURE_S, PAUSE_S = 2, 3, 4  # -T 2 is the warm-up's pgbench, -T 3 the measured one's


def _pgbench_for(seconds: int) -> Callable[[dict[int, tuple[str, list[str]]]], bool]:
    def running(children: dict[int, tuple[str, list[str]]]) -> bool:
        return any(name == "pgbench" and "-T" in args and args[args.index("-T") + 1] == str(seconds)
                   for name, args in children.values())
    return running


def _statuses(results: Path) -> list[str]:
    """The status of each run stored so far (none before pglab created its store)."""
    return [r.status for r in stored_runs(results, missing_ok=True)]


class Moment:
    """When the signal is sent: once ``ready`` says so (given pglab's children and its results folder)."""

    def __init__(self, name: str, ready: Callable[[dict[int, tuple[str, list[str]]], Path], bool],
                 runs: list[list[str]], repeats: int = 1, pause_s: int = 0):
        self.name, self.ready, self.runs, self.repeats, self.pause_s = name, ready, runs, repeats, pause_s


class _Closing:
    """The measured pgbench has ended and the run is not stored yet: the closing sample, or the summary. That lasts
    a few tens of milliseconds (the closing sample is taken at once, pgbench's exit seen at once), less than one
    look at pglab's children under load; so once the measured pgbench is seen the test waits on it (a pidfd, readable
    at its exit), then for pglab to reap it (pglab is then past its wait on it), looking every millisecond."""

    def __call__(self, children: dict[int, tuple[str, list[str]]], results: Path) -> bool:
        measured = [pid for pid, (name, args) in children.items()
                    if name == "pgbench" and "-T" in args and args[args.index("-T") + 1] == str(MEASURE_S)]
        if not measured:
            return False
        with contextlib.suppress(ProcessLookupError):  # gone already: reaped
            exited = os.pidfd_open(measured[0])
            try:
                select.select([exited], [], [], 120)
            finally:
                os.close(exited)
        deadline = time.monotonic() + 120
        while Path(f"/proc/{measured[0]}").exists() and time.monotonic() < deadline:
            time.sleep(0.001)
        return _statuses(results) == ["running"]


MOMENTS = {
    "lab": lambda: Moment("lab", lambda ch, _r: any(name == "initdb" for name, _ in ch.values()), [[]]),
    "warm-up": lambda: Moment("warm-up", lambda ch, _r: _pgbench_for(WARMUP_S)(ch), [["interrupted"]]),
    "measure": lambda: Moment("measure", lambda ch, _r: _pgbench_for(MEASURE_S)(ch), [["interrupted"]]),
    # in the closing tick the wait raises; in the summary, which has no wait, the run ends ok and the engine stops
    # at its next check: either way nothing is half-stored
    "closing": lambda: Moment("closing", _Closing(), [["interrupted"], ["ok"]]),
    # the signal in the pause after run 1 (the one moment a pause is for: the engine pauses after every run, the
    # last one too, so the other moments' sweeps go without)
    "between-runs": lambda: Moment("between-runs", lambda ch, r: _statuses(r) == ["ok"], [["ok"]],
                                   repeats=2, pause_s=PAUSE_S),
}


# the signal whose interrupted sweep is resumed, per moment
RESUMED = {"lab": signal.SIGTERM, "warm-up": signal.SIGINT, "measure": signal.SIGINT, "closing": signal.SIGINT,
           "between-runs": signal.SIGINT}


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
run: {{duration: {MEASURE_S}s, warmup: {WARMUP_S}s, repeats: {when.repeats}, pause: {when.pause_s}s}}
""")
    results = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "pglab.cli", "run", str(plan), "--results", str(results)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen: dict[int, int | None] = {}  # every process pglab started while watched (pid → start): none may outlive it
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            children = children_of(proc.pid)
            seen.update(identities(p for p in children if p not in seen))
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
    with read_store(results) as store:
        (sweep,) = store.sweeps()
        runs = [(r.status, r.reason) for r in store.runs()]
    status, reason = sweep["status"], sweep["reason"]
    print(f"{moment}, {sig.name}: runs {runs}")
    assert (status, reason) == ("interrupted", f"interrupted by {sig.name}")
    assert [s for s, _ in runs] in when.runs, runs
    assert all(r == f"interrupted by {sig.name}" for s, r in runs if s == "interrupted"), runs
    assert processes_mentioning(str(lab)) == []
    assert still_running(seen) == []
    assert not lab.exists()
    if sig != RESUMED[moment]:
        return

    rerun = run_plan(plan, results).proc
    assert "Traceback" not in rerun.stderr
    assert "resuming sweep 1" in rerun.stdout + rerun.stderr
    with read_store(results) as store:
        assert [s["status"] for s in store.sweeps()] == ["done"]  # the same sweep, resumed
        assert [r.status for r in store.runs()] == ["ok"] * when.repeats
    assert processes_mentioning(str(lab)) == [] and not lab.exists()
