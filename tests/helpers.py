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
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from pglab.store.sqlite import RunRow, Store
from pglab.workloads.fio import FioResult


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


def run_files(results: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Each run's folder and its run.json (the artifact a run leaves beside its rows: point, metrics …), in the
    folders' order (point, then repeat)."""
    return [(d, json.loads((d / "run.json").read_text())) for d in sorted((results / "runs").iterdir())]


# ------------------------------------------------------------------ asking a PostgreSQL server
def scalar(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> Any:
    """The first column of the one row ``sql`` returns (the test fails when it returns none)."""
    row = conn.execute(sql, params).fetchone()
    assert row is not None, f"no row from {sql}"
    return row[0]


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


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def born(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot: /proc/<pid>/stat's 22nd field), None when there is no such
    process. With the pid it names one process: on a busy machine pids wrap within minutes."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def identities(pids: Iterable[int]) -> dict[int, int | None]:
    """Each pid with its start time, to ask later whether that same process still runs."""
    return {p: born(p) for p in pids}


def still_running(seen: Mapping[int, int | None]) -> list[int]:
    """The processes of ``seen`` (pid → start time) that still run: the same pid started at the same time, not a
    zombie. A pid reused since by another process does not count."""
    return [p for p, start in seen.items() if start is not None and alive(p) and born(p) == start]


def outsider() -> int:
    """A busy loop that is not a descendant of pglab or of this test (its shell exits, init adopts it): another
    program on the host, as when an engineer's job shares the machine. The caller kills it."""
    out = subprocess.run(["sh", "-c", f"'{sys.executable}' -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True).stdout
    return int(out)


def as_server_user() -> dict[str, Any]:
    """subprocess arguments running a server binary as ``postgres`` when we are root."""
    return {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}


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


# ------------------------------------------------------------------ stores built through the Store API
def make_store(path: Path, points: list[tuple[dict[str, Any], list[dict[str, float | None]]]],
               failed: dict[int, int] | None = None, plan_text: str = "plan: x", first_repeat: int = 0) -> Store:
    """One sweep of plan ``plan_text``; each point has its axes and one metrics dict per ok run (plus
    ``failed[idx]`` failed runs), repeats numbered from ``first_repeat``."""
    store = Store.open(path)
    sweep = store.begin_sweep("synthetic", plan_text, "hash", "test")
    ids = store.add_points(sweep, [(i, f"p{i}", axes) for i, (axes, _) in enumerate(points)])
    for i, (_, runs) in enumerate(points):
        for rep, metrics in enumerate(runs, first_repeat):
            run_id, _ = store.start_run(sweep, ids[f"p{i}"], i, rep)
            store.finish_run(run_id, "ok", metrics=metrics)
        for k in range((failed or {}).get(i, 0)):
            run_id, _ = store.start_run(sweep, ids[f"p{i}"], i, first_repeat + len(runs) + k)
            store.finish_run(run_id, "failed", reason="boom", metrics={"tps": 1.0})
    store.end_sweep(sweep, "done")
    return store


def tps_runs(*values: float) -> list[dict[str, float | None]]:
    """One ok run's metrics per TPS value (its mean latency at one client)."""
    return [{"tps": v, "latency_avg_ms": 1000.0 / v} for v in values]


def tps_store(path: Path, tps: dict[tuple[str, str, int], list[float]], plan_text: str = "name: t\n") -> Path:
    """A folder of one sweep: (workload, synchronous_commit, clients) → the TPS of each of its ok runs."""
    points = [({"workload": wl, "synchronous_commit": sc, "clients": c, "jobs": 1}, tps_runs(*values))
              for (wl, sc, c), values in tps.items()]
    make_store(path, points, plan_text=plan_text, first_repeat=1).close()
    return path


VIEWS_PLAN = """\
name: views
target: {local: {instances: 3}}
dataset: {scale: 10}
matrix:
  workload: [tpcb-like, select-only]
  synchronous_commit: [local, remote_apply]
  clients: [1, 8]
run: {duration: 6s, warmup: 1s, repeats: 3}
cost: {monthly: 61}
"""
VIEWS_ENVIRONMENT: dict[str, Any] = {"pglab_version": "0", "cpu": {"model": "test CPU", "count": 2, "affinity": 2},
                     "postgres": {"version": "PostgreSQL 15.18", "version_num": 150018,
                                  "non_default_settings": {"shared_buffers": {"setting": "16384", "unit": "8kB",
                                                                              "source": "configuration file"}}},
                     "paths": {"n0.data": {"fstype": "ext4", "source": "/dev/vda", "mount_options": "rw"}}}
VIEWS_TPS = {"tpcb-like": {"local": (600.0, 1250.0), "remote_apply": (500.0, 1100.0)},
             "select-only": {"local": (10_000.0, 18_000.0), "remote_apply": (9_000.0, 17_000.0)}}
VIEWS_T0 = 1_700_000_000.0


def views_store(path: Path, plan: str = VIEWS_PLAN, environment: dict[str, Any] | None = None) -> Path:
    """The sweep the report views are checked on, built through the Store API: two workloads × two
    synchronous_commit levels × two client counts, three repeats each, each run with a time series (one with a TPS
    dip), a WAL fio profile, a plan with a cost, and an environment."""
    store = Store.open(path)
    sweep = store.begin_sweep("views", plan, "h", "0")
    store.set_sweep_info(sweep, environment or VIEWS_ENVIRONMENT, {})
    axes: list[dict[str, Any]] = [{"workload": wl, "synchronous_commit": sc, "clients": c, "jobs": 1}
                                  for wl in VIEWS_TPS for sc in VIEWS_TPS[wl] for c in (1, 8)]
    ids = store.add_points(sweep, [(i, f"k{i}", ax) for i, ax in enumerate(axes)])
    start = VIEWS_T0
    for rep in (1, 2, 3):
        for i, ax in enumerate(axes):
            base = VIEWS_TPS[ax["workload"]][ax["synchronous_commit"]][0 if ax["clients"] == 1 else 1]
            tps = base * (1 + 0.01 * (rep - 2))
            run_id, _ = store.start_run(sweep, ids[f"k{i}"], i, rep)
            window = (start + 1, start + 7)
            ticks = [start + s for s in range(8)]
            dip = i == 0 and rep == 2  # one run drops to a third of its TPS for two seconds
            series = [(ts, "pgbench", "tps", tps / 3 if dip and 3 <= ts - start <= 4 else tps) for ts in ticks]
            series += [(ts, "pgbench", "latency_ms", ax["clients"] * 1000 / tps) for ts in ticks]
            series += [(ts, "disk:vda", "w_s", 4 * tps) for ts in ticks]
            store.finish_run(run_id, "ok", window=window, metrics={
                "tps": tps, "latency_avg_ms": ax["clients"] * 1000 / tps,
                "latency_p99_ms": 3 * ax["clients"] * 1000 / tps,
                "write_iops": 4 * tps, "write_latency_ms": 0.2, "cpu_pct": 60.0},
                series=series, events=[(start, "warmup-start", ""), (window[0], "window-start", ""),
                                       (window[1], "window-end", "")])
            start += 10
    wal = FioResult(path="/d", profile="wal-fdatasync-8k", job="wal-fdatasync-8k-qd1", direction="write",
                    iops=669.0, bw_mb_s=5.2, lat_mean_ms=0.016, lat_p50_ms=0.01, lat_p99_ms=0.057,
                    lat_p999_ms=0.1, started=VIEWS_T0 - 20, ended=VIEWS_T0 - 15, series=[], findings=[],
                    json_file=path / "storage" / "wal.json", log_files=[], sync_lat_mean_ms=1.476,
                    sync_lat_p50_ms=1.2, sync_lat_p99_ms=6.717, sync_lat_p999_ms=37.487)
    store.save_fio(sweep, "data", "vda", [wal], {"commit_flush_per_s": 669.0})
    store.end_sweep(sweep, "done")
    store.close()
    return path


# ------------------------------------------------------------------ a pgbench dataset, compared
PGBENCH_CATALOG = """
SELECT c.relname, c.relkind, c.relpersistence, coalesce(pg_get_expr(c.relpartbound, c.oid), ''),
       coalesce((SELECT string_agg(conname || ' ' || pg_get_constraintdef(oid), '; ' ORDER BY conname)
                 FROM pg_constraint WHERE conrelid = c.oid), ''),
       coalesce((SELECT string_agg(pg_get_indexdef(indexrelid), '; ' ORDER BY indexrelid::regclass::text)
                 FROM pg_index WHERE indrelid = c.oid), ''),
       coalesce(array_to_string(c.reloptions, ','), ''), pg_relation_size(c.oid)
FROM pg_class c WHERE c.relname LIKE 'pgbench%' ORDER BY c.relname
"""
PGBENCH_CONTENT = """
SELECT (SELECT count(*) FROM pgbench_accounts), (SELECT sum(abalance) FROM pgbench_accounts),
       (SELECT sum(aid::bigint * bid) FROM pgbench_accounts), (SELECT count(DISTINCT filler) FROM pgbench_accounts),
       (SELECT count(*) FROM pgbench_branches), (SELECT count(*) FROM pgbench_tellers),
       (SELECT sum(tid * bid) FROM pgbench_tellers), (SELECT count(*) FROM pgbench_history)
"""

PGBENCH_STATS = """
SELECT relname, last_vacuum IS NOT NULL, last_analyze IS NOT NULL, n_live_tup
FROM pg_stat_user_tables ORDER BY relname
"""


def pgbench_dump(conn: psycopg.Connection[Any]) -> tuple[list[tuple[Any, ...]], tuple[Any, ...]]:
    """What a loaded pgbench dataset is: its relations as the catalog describes them, and a digest of its rows."""
    return conn.execute(PGBENCH_CATALOG).fetchall(), conn.execute(PGBENCH_CONTENT).fetchone() or ()


def own_diskstats(dev: str) -> tuple[float, dict[str, int]]:
    """The test's own read of one device's line of /proc/diskstats, and when it was taken (epoch seconds): written
    here, not with pglab's parser, so a comparison with pglab's disk probe is with an independent sampler."""
    t = time.time()
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if p[2] == dev:
                return t, {"writes": int(p[7]), "wsect": int(p[9]), "wticks": int(p[10])}
    raise AssertionError(f"{dev} is not in /proc/diskstats")


def steady_writes(directory: Path, seconds: int) -> subprocess.Popen[bytes]:
    """fio writing 250 synced 8 KiB writes a second into ``directory`` for ``seconds``: a known, steady load."""
    return subprocess.Popen(
        ["fio", "--name=steady", f"--directory={directory}", "--rw=write", "--bs=8k", "--size=8m", "--direct=1",
         "--fdatasync=1", "--ioengine=sync", "--rate_iops=250", "--time_based", f"--runtime={seconds}",
         "--output-format=json"], stdout=subprocess.DEVNULL)
