"""What many test modules share, one helper per idea (tests/conftest.py holds the fixtures and ``pglab``).

- A results folder is read through the store's readers (src/pglab/store/sqlite.py), as ``pglab report`` reads it,
  over a read-only connection: a test never migrates, locks or writes the folder it checks, also while a pglab is
  still writing it. ``read_store``, ``sweep_row``, ``stored_runs``, ``stored_events``, ``lab_dir``.
- ``Ran``: what ``run_plan`` (``pglab run PLAN --results FOLDER …``) gives back: the finished process and its folder.
- Child processes of a pglab under test (``children``, ``pgbench_children``) and a fault injected into each
  measured pgbench (``fault_each_measured_pgbench``).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pglab.store.sqlite import RunRow, Store


# ------------------------------------------------------------------ reading a results folder
@contextmanager
def read_store(results: Path) -> Iterator[Store]:
    """The folder's store, read-only (sqlite3.OperationalError when it holds no results.db yet)."""
    conn = sqlite3.connect(f"file:{results / 'results.db'}?mode=ro", uri=True, timeout=30)
    try:
        yield Store(results, conn)
    finally:
        conn.close()


def sweep_row(results: Path, sweep_id: int | None = None) -> dict[str, Any]:
    """The sweep's row (default: the latest), its ``target``, ``environment`` and ``schedule`` decoded."""
    with read_store(results) as store:
        sweeps = store.sweeps()
    row = next(s for s in reversed(sweeps) if sweep_id is None or s["id"] == sweep_id)
    for column in ("target", "environment", "schedule"):
        row[column] = json.loads(row[column]) if row[column] else None
    return row


def lab_dir(results: Path) -> Path:
    """The local lab the latest sweep built (its ``target.lab_dir``)."""
    return Path(sweep_row(results)["target"]["lab_dir"])


def stored_runs(results: Path, sweep_id: int | None = None, *, missing_ok: bool = False) -> list[RunRow]:
    """Every run of the folder (or of one sweep) in sweep, point and repeat order; ``missing_ok``: [] while pglab
    has not created its store yet (polling a running pglab)."""
    try:
        with read_store(results) as store:
            return store.runs(sweep_id)
    except sqlite3.Error:
        if missing_ok:
            return []
        raise


Event = tuple[float, str, str | None, str | None, str]  # ts, kind, detail, run_id, scope ('run' or 'sweep')


def stored_events(results: Path, kind: str | None = None, sweep_id: int | None = None) -> list[Event]:
    """(ts, kind, detail, run_id, scope) of the sweep's events and its runs' (default: the latest sweep), in time
    order; ``kind``: those of one kind."""
    with read_store(results) as store:
        sid = store.latest_sweep_id() if sweep_id is None else sweep_id
        found = store.sweep_and_run_events(sid)
    return [e for e in found if kind is None or e[1] == kind]


# ------------------------------------------------------------------ running a plan
@dataclass(frozen=True)
class Ran:
    """A finished ``pglab run``: its process (exit code, stdout, stderr) and its results folder."""

    proc: subprocess.CompletedProcess[str]
    results: Path

    def runs(self) -> list[RunRow]:
        return stored_runs(self.results)

    def sweep(self) -> dict[str, Any]:
        return sweep_row(self.results)

    def events(self, kind: str | None = None) -> list[Event]:
        return stored_events(self.results, kind)


# ------------------------------------------------------------------ the processes of a pglab under test
def children_of(pid: int) -> dict[int, tuple[str, list[str]]]:
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


def children(pid: int, name: str, arg: str) -> list[int]:
    """Child processes of ``pid`` named ``name`` with ``arg`` among their arguments."""
    return [p for p, (n, args) in children_of(pid).items() if n == name and arg in args]


def pgbench_children(pid: int) -> list[int]:
    """The measured pgbench (not pgbench -i) started by ``pid``."""
    return children(pid, "pgbench", "-T")


def fault_each_measured_pgbench(proc: subprocess.Popen[str], faults: list[str], timeout: float,
                                act: Callable[[str, int], None]) -> None:
    """``act(fault, pgbench pid)`` 2 s into each new measured pgbench ``proc`` (pglab) starts, one fault each, until
    ``faults`` (consumed: what is left was never injected) runs out, pglab ends, or ``timeout`` passes."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while faults and time.monotonic() < deadline and proc.poll() is None:
        fresh = [p for p in pgbench_children(proc.pid) if p not in seen]
        if not fresh:
            time.sleep(0.1)
            continue
        seen.update(fresh)
        time.sleep(2.0)  # inside the measured run
        act(faults.pop(0), fresh[0])


def postmaster(lab: Path, node: str) -> int:
    """The postmaster pid of a local lab's node (``n0``, ``n1`` …), from the lab's state and the node's pid file."""
    state = json.loads((lab / "lab.json").read_text())
    data = next(Path(n["data"]) for n in state["nodes"] if n["name"] == node)
    return int((data / "postmaster.pid").read_text().splitlines()[0])
