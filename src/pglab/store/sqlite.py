"""The results store: ``DIR/results.db`` (SQLite) and ``DIR/runs/<run_id>/`` (raw artifacts).

Each run is written in one transaction when it ends, so a crash leaves either the whole run or a row
still marked ``running`` (turned into ``interrupted`` by the next writer, see :meth:`Store.recover`). The
schema carries its version in ``PRAGMA user_version``; migrations are applied in order on open.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pglab.errors import UserError

SCHEMA_VERSION = 5

MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE sweeps (
        id INTEGER PRIMARY KEY,
        plan_name TEXT NOT NULL,
        plan_text TEXT NOT NULL,
        plan_hash TEXT NOT NULL,
        pglab_version TEXT NOT NULL,
        started REAL NOT NULL,
        finished REAL,
        status TEXT NOT NULL,              -- running | done | interrupted | failed
        reason TEXT,
        environment TEXT,                  -- JSON: versions, kernel, CPU, memory, paths, devices, settings
        target TEXT                        -- JSON: topology as built
    );
    CREATE TABLE points (
        id INTEGER PRIMARY KEY,
        sweep_id INTEGER NOT NULL REFERENCES sweeps(id),
        idx INTEGER NOT NULL,
        key TEXT NOT NULL,
        axes TEXT NOT NULL,                -- JSON: axis name -> value
        UNIQUE (sweep_id, key)
    );
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        sweep_id INTEGER NOT NULL REFERENCES sweeps(id),
        point_id INTEGER NOT NULL REFERENCES points(id),
        repeat INTEGER NOT NULL,
        status TEXT NOT NULL,              -- running | ok | failed | interrupted
        reason TEXT,
        started REAL NOT NULL,
        ended REAL,
        window_start REAL,                 -- measured window on the run's clock (epoch s), warm-up outside
        window_end REAL,
        dir TEXT NOT NULL,                 -- artifact folder, relative to the results folder
        settings TEXT                      -- JSON: settings in force for this run
    );
    CREATE INDEX runs_point ON runs(point_id);
    CREATE TABLE run_metrics (
        run_id TEXT NOT NULL REFERENCES runs(id),
        name TEXT NOT NULL,
        value REAL,
        PRIMARY KEY (run_id, name)
    );
    CREATE TABLE series (
        run_id TEXT NOT NULL REFERENCES runs(id),
        ts REAL NOT NULL,
        source TEXT NOT NULL,
        metric TEXT NOT NULL,
        value REAL
    );
    CREATE INDEX series_run ON series(run_id, source, metric);
    CREATE TABLE events (
        run_id TEXT REFERENCES runs(id),
        sweep_id INTEGER REFERENCES sweeps(id),
        ts REAL NOT NULL,
        kind TEXT NOT NULL,
        detail TEXT
    );
    """,
    2: """
    CREATE TABLE fio_results (
        id INTEGER PRIMARY KEY,
        sweep_id INTEGER NOT NULL REFERENCES sweeps(id),
        label TEXT NOT NULL,               -- data | wal | the path given to pglab fio
        path TEXT NOT NULL,
        device TEXT,                       -- block device behind the path (NULL: none, e.g. tmpfs)
        profile TEXT NOT NULL,
        job TEXT NOT NULL,
        direction TEXT NOT NULL,           -- read | write
        iops REAL, bw_mb_s REAL, lat_mean_ms REAL, lat_p50_ms REAL, lat_p99_ms REAL, lat_p999_ms REAL,
        sync_lat_mean_ms REAL, sync_lat_p99_ms REAL, sync_lat_p999_ms REAL,  -- fdatasync after each write
        started REAL, ended REAL,
        note TEXT,                         -- burst / cache findings, one sentence each
        json_file TEXT,                    -- fio's JSON output, relative to the results folder
        options TEXT                       -- JSON: the job's fio options
    );
    CREATE TABLE fio_series (
        fio_id INTEGER NOT NULL REFERENCES fio_results(id),
        ts REAL NOT NULL,
        iops REAL,
        lat_ms REAL
    );
    CREATE INDEX fio_series_id ON fio_series(fio_id);
    CREATE TABLE ceilings (
        sweep_id INTEGER NOT NULL REFERENCES sweeps(id),
        label TEXT NOT NULL,
        name TEXT NOT NULL,                -- commit_flush_per_s, randread_iops_qd32, seqwrite_mb_s …
        value REAL,
        PRIMARY KEY (sweep_id, label, name)
    );
    """,
    3: """
    CREATE TABLE tenant_metrics (
        run_id TEXT NOT NULL REFERENCES runs(id),
        tenant TEXT NOT NULL,              -- t01, t02 … (tenants plans: many instances measured in one window)
        tier TEXT NOT NULL,
        name TEXT NOT NULL,
        value REAL,
        PRIMARY KEY (run_id, tenant, name)
    );
    """,
    4: """
    ALTER TABLE sweeps ADD COLUMN schedule TEXT;  -- JSON: order, seed, repeats (min, max, target_ci)
    """,
    5: """
    CREATE TABLE phases (
        sweep_id INTEGER NOT NULL REFERENCES sweeps(id),
        run_id TEXT,                       -- the run it was part of (NULL: the sweep's own: lab, storage, teardown)
        name TEXT NOT NULL,                -- setup | lab | storage | dataset | prepare | warm-up | measure | ...
        started REAL NOT NULL,             -- epoch s (one phase ends where the next begins)
        ended REAL NOT NULL
    );
    CREATE INDEX phases_sweep ON phases(sweep_id, started);
    """,
}


@dataclass(frozen=True)
class RunRow:
    id: str
    sweep_id: int
    point_id: int
    repeat: int
    status: str
    reason: str | None
    dir: str
    axes: dict[str, Any]
    metrics: dict[str, float | None]


class Store:
    def __init__(self, results_dir: Path, conn: sqlite3.Connection):
        self.dir = results_dir
        self.conn = conn

    @classmethod
    def open(cls, results_dir: str | Path, create: bool = True) -> Store:
        d = Path(results_dir)
        db = d / "results.db"
        if not create and not db.is_file():
            raise UserError(f"'{d}' holds no pglab results (no results.db); give the folder a run wrote.")
        try:
            d.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(db, timeout=30, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise UserError(f"results folder '{d}': cannot open it ({exc}); choose a writable folder.") from None
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA foreign_keys=ON")
            store = cls(d, conn)
            store._migrate()
        except sqlite3.DatabaseError as exc:  # not SQLite, or damaged: the user's file, named, no traceback
            conn.close()
            raise UserError(f"results folder '{d}': its results.db cannot be read ({exc}); give a folder pglab "
                            "wrote, or a new one.") from None
        try:
            (d / "runs").mkdir(exist_ok=True)  # once the store is known to be one: nothing added to a foreign folder
        except OSError as exc:
            conn.close()
            raise UserError(f"results folder '{d}': cannot open it ({exc}); choose a writable folder.") from None
        return store

    def _migrate(self) -> None:
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise UserError(f"'{self.dir}/results.db' was written by a newer pglab (schema {version}); "
                            "upgrade pglab to read it.")
        for v in range(version + 1, SCHEMA_VERSION + 1):
            with self.tx():
                for stmt in _statements(MIGRATIONS[v]):
                    self.conn.execute(stmt)
                self.conn.execute(f"PRAGMA user_version = {v}")

    def recover(self) -> None:
        """Called by the only writer (it holds the folder's lock): whatever is still marked running was left
        by a pglab that died, and is interrupted, not silently half-there."""
        with self.tx():
            self.conn.execute("UPDATE runs SET status='interrupted', reason=coalesce(reason, 'pglab stopped "
                              "before the run finished') WHERE status='running'")
            self.conn.execute("UPDATE sweeps SET status='interrupted', reason=coalesce(reason, 'pglab stopped "
                              "before the sweep finished') WHERE status='running'")

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()

    # ------------------------------------------------------------ writing
    def begin_sweep(self, plan_name: str, plan_text: str, plan_hash: str, version: str,
                    started: float | None = None) -> int:
        with self.tx():
            cur = self.conn.execute(
                "INSERT INTO sweeps (plan_name, plan_text, plan_hash, pglab_version, started, status) "
                "VALUES (?, ?, ?, ?, ?, 'running')",
                (plan_name, plan_text, plan_hash, version, time.time() if started is None else started))
            return int(cur.lastrowid or 0)

    def reopen_sweep(self, sweep_id: int) -> list[Path]:
        """Resume a sweep: its runs that did not end 'ok' are dropped (rows, series, metrics, events) so each
        point × repeat ends up with exactly one run; their folders are returned for the caller to set aside.
        A storage phase that did not finish is dropped too, to be measured again."""
        with self.tx():
            dropped = [self.dir / d for (d,) in self.conn.execute(
                "SELECT dir FROM runs WHERE sweep_id = ? AND status != 'ok'", (sweep_id,))]
            gone = "SELECT id FROM runs WHERE sweep_id = ? AND status != 'ok'"
            for table in ("run_metrics", "series", "events", "tenant_metrics"):
                self.conn.execute(f"DELETE FROM {table} WHERE run_id IN ({gone})", (sweep_id,))
            self.conn.execute("DELETE FROM runs WHERE sweep_id = ? AND status != 'ok'", (sweep_id,))
            if not self.storage_done(sweep_id):
                self.conn.execute("DELETE FROM fio_series WHERE fio_id IN (SELECT id FROM fio_results "
                                  "WHERE sweep_id = ?)", (sweep_id,))
                self.conn.execute("DELETE FROM fio_results WHERE sweep_id = ?", (sweep_id,))
                self.conn.execute("DELETE FROM ceilings WHERE sweep_id = ?", (sweep_id,))
            self.conn.execute("UPDATE sweeps SET status='running', reason=NULL, finished=NULL WHERE id = ?",
                              (sweep_id,))
        return dropped

    def storage_done(self, sweep_id: int) -> bool:
        return self.conn.execute("SELECT 1 FROM events WHERE sweep_id = ? AND kind = 'storage-done'",
                                 (sweep_id,)).fetchone() is not None

    def completed_runs(self, sweep_id: int) -> set[tuple[str, int]]:
        """(point key, repeat) of every run of the sweep that ended 'ok'."""
        return {(k, r) for k, r in self.conn.execute(
            "SELECT p.key, r.repeat FROM runs r JOIN points p ON p.id = r.point_id "
            "WHERE r.sweep_id = ? AND r.status = 'ok'", (sweep_id,))}

    def point_ids(self, sweep_id: int) -> dict[str, int]:
        return dict(self.conn.execute("SELECT key, id FROM points WHERE sweep_id = ?", (sweep_id,)).fetchall())

    def set_sweep_info(self, sweep_id: int, environment: dict[str, Any], target: dict[str, Any]) -> None:
        with self.tx():
            self.conn.execute("UPDATE sweeps SET environment=?, target=? WHERE id=?",
                              (json.dumps(environment, default=str), json.dumps(target, default=str), sweep_id))

    def set_sweep_schedule(self, sweep_id: int, schedule: dict[str, Any]) -> None:
        """How the sweep orders and repeats its runs (the seed above all): a resumed sweep goes on in that order."""
        with self.tx():
            self.conn.execute("UPDATE sweeps SET schedule=? WHERE id=?", (json.dumps(schedule), sweep_id))

    def sweep_schedule(self, sweep_id: int) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT schedule FROM sweeps WHERE id=?", (sweep_id,)).fetchone()
        return json.loads(row[0]) if row and row[0] else None

    def ok_values(self, sweep_id: int, metric: str) -> dict[str, list[float]]:
        """Point key → the metric of each of its runs that ended ok, in the order they ran."""
        out: dict[str, list[float]] = {}
        for key, value in self.conn.execute(
                "SELECT p.key, m.value FROM runs r JOIN points p ON p.id = r.point_id JOIN run_metrics m "
                "ON m.run_id = r.id AND m.name = ? WHERE r.sweep_id = ? AND r.status = 'ok' AND m.value IS NOT NULL "
                "ORDER BY r.started", (metric, sweep_id)):
            out.setdefault(key, []).append(float(value))
        return out

    def run_order(self, sweep_id: int) -> list[tuple[str, int]]:
        """(point key, repeat) of the sweep's runs in the order they started."""
        return [(k, r) for k, r in self.conn.execute(
            "SELECT p.key, r.repeat FROM runs r JOIN points p ON p.id = r.point_id WHERE r.sweep_id = ? "
            "ORDER BY r.started, r.rowid", (sweep_id,))]

    def end_sweep(self, sweep_id: int, status: str, reason: str | None = None,
                  phases: Iterable[tuple[str | None, str, float, float]] = (), at: float | None = None) -> None:
        """The sweep's end, with the phases still unwritten (``at``: when it ended, the last phase's end)."""
        with self.tx():
            self._insert_phases(sweep_id, phases)
            self.conn.execute("UPDATE sweeps SET status=?, reason=?, finished=? WHERE id=?",
                              (status, reason, time.time() if at is None else at, sweep_id))

    def add_phases(self, sweep_id: int, phases: Iterable[tuple[str | None, str, float, float]]) -> None:
        """(run_id or None, name, started, ended) of phases the sweep went through: where its wall time went."""
        with self.tx():
            self._insert_phases(sweep_id, phases)

    def _insert_phases(self, sweep_id: int, phases: Iterable[tuple[str | None, str, float, float]]) -> None:
        self.conn.executemany("INSERT INTO phases (sweep_id, run_id, name, started, ended) VALUES (?, ?, ?, ?, ?)",
                              [(sweep_id, *p) for p in phases])

    def phases(self, sweep_id: int) -> list[tuple[str | None, str, float, float]]:
        """(run_id or None, name, started, ended) of the sweep's phases, in time order."""
        return [(r, n, float(s), float(e)) for r, n, s, e in self.conn.execute(
            "SELECT run_id, name, started, ended FROM phases WHERE sweep_id = ? ORDER BY started, rowid",
            (sweep_id,))]

    def add_points(self, sweep_id: int, points: Iterable[tuple[int, str, dict[str, Any]]]) -> dict[str, int]:
        ids: dict[str, int] = {}
        with self.tx():
            for idx, key, axes in points:
                cur = self.conn.execute(
                    "INSERT INTO points (sweep_id, idx, key, axes) VALUES (?, ?, ?, ?)",
                    (sweep_id, idx, key, json.dumps(axes)))
                ids[key] = int(cur.lastrowid or 0)
        return ids

    def start_run(self, sweep_id: int, point_id: int, point_idx: int, repeat: int) -> tuple[str, Path]:
        run_id = f"p{point_idx:03d}-r{repeat}-{uuid.uuid4().hex[:6]}"
        rel = Path("runs") / run_id
        (self.dir / rel).mkdir(parents=True)
        with self.tx():
            self.conn.execute(
                "INSERT INTO runs (id, sweep_id, point_id, repeat, status, started, dir) "
                "VALUES (?, ?, ?, ?, 'running', ?, ?)", (run_id, sweep_id, point_id, repeat, time.time(), str(rel)))
        return run_id, self.dir / rel

    def finish_run(self, run_id: str, status: str, *, reason: str | None = None,
                   window: tuple[float, float] | None = None, settings: dict[str, Any] | None = None,
                   metrics: dict[str, float | None] | None = None,
                   series: Iterable[tuple[float, str, str, float | None]] = (),
                   events: Iterable[tuple[float, str, str]] = (),
                   tenants: Iterable[tuple[str, str, str, float | None]] = ()) -> None:
        """Everything about a run in one transaction: a crash leaves the run whole or still 'running'.
        ``tenants``: (tenant, tier, metric, value) of a tenants plan's run."""
        with self.tx():
            self.conn.execute(
                "UPDATE runs SET status=?, reason=?, ended=?, window_start=?, window_end=?, settings=? WHERE id=?",
                (status, reason, time.time(), window[0] if window else None, window[1] if window else None,
                 json.dumps(settings, default=str) if settings is not None else None, run_id))
            if metrics:
                self.conn.executemany("INSERT OR REPLACE INTO run_metrics (run_id, name, value) VALUES (?, ?, ?)",
                                      [(run_id, k, _num(v)) for k, v in metrics.items()])
            self.conn.executemany("INSERT INTO series (run_id, ts, source, metric, value) VALUES (?, ?, ?, ?, ?)",
                                  [(run_id, ts, src, m, _num(v)) for ts, src, m, v in series])
            self.conn.executemany("INSERT INTO events (run_id, ts, kind, detail) VALUES (?, ?, ?, ?)",
                                  [(run_id, ts, kind, detail) for ts, kind, detail in events])
            self.conn.executemany("INSERT OR REPLACE INTO tenant_metrics (run_id, tenant, tier, name, value) "
                                  "VALUES (?, ?, ?, ?, ?)",
                                  [(run_id, t, tier, m, _num(v)) for t, tier, m, v in tenants])

    def add_events(self, sweep_id: int, events: Iterable[tuple[float, str, str]]) -> None:
        """Sweep-level events (not tied to one run), e.g. checkpoint starts from the server log."""
        with self.tx():
            self.conn.executemany("INSERT INTO events (sweep_id, ts, kind, detail) VALUES (?, ?, ?, ?)",
                                  [(sweep_id, ts, kind, detail) for ts, kind, detail in events])

    def sweep_events(self, sweep_id: int, kind: str, start: float, end: float) -> list[tuple[float, str]]:
        return [(ts, detail) for ts, detail in self.conn.execute(
            "SELECT ts, detail FROM events WHERE sweep_id = ? AND kind = ? AND ts BETWEEN ? AND ? ORDER BY ts",
            (sweep_id, kind, start, end))]

    def save_fio(self, sweep_id: int, label: str, device: str | None, results: Iterable[Any],
                 ceilings: dict[str, float]) -> None:
        """One path's storage results, their per-second series and its ceilings, in one transaction."""
        with self.tx():
            for r in results:
                cur = self.conn.execute(
                    "INSERT INTO fio_results (sweep_id, label, path, device, profile, job, direction, iops, bw_mb_s, "
                    "lat_mean_ms, lat_p50_ms, lat_p99_ms, lat_p999_ms, sync_lat_mean_ms, sync_lat_p99_ms, "
                    "sync_lat_p999_ms, started, ended, note, json_file, options) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (sweep_id, label, str(r.path), device, r.profile, r.job, r.direction, r.iops, r.bw_mb_s,
                     r.lat_mean_ms, r.lat_p50_ms, r.lat_p99_ms, r.lat_p999_ms, r.sync_lat_mean_ms, r.sync_lat_p99_ms,
                     r.sync_lat_p999_ms, r.started, r.ended, " ".join(f.message for f in r.findings) or None,
                     _relative(r.json_file, self.dir), json.dumps(r.options)))
                fio_id = cur.lastrowid
                self.conn.executemany("INSERT INTO fio_series (fio_id, ts, iops, lat_ms) VALUES (?, ?, ?, ?)",
                                      [(fio_id, ts, _num(iops), _num(lat)) for ts, iops, lat in r.series])
            self.conn.executemany("INSERT OR REPLACE INTO ceilings (sweep_id, label, name, value) VALUES (?, ?, ?, ?)",
                                  [(sweep_id, label, k, _num(v)) for k, v in ceilings.items()])

    # ------------------------------------------------------------ reading
    def fio_results(self, sweep_id: int) -> list[dict[str, Any]]:
        cur = self.conn.execute("SELECT * FROM fio_results WHERE sweep_id = ? ORDER BY id", (sweep_id,))
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, row, strict=True)) for row in cur]

    def ceilings(self, sweep_id: int) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for label, name, value in self.conn.execute(
                "SELECT label, name, value FROM ceilings WHERE sweep_id = ? ORDER BY rowid", (sweep_id,)):
            out.setdefault(label, {})[name] = value
        return out

    def sweeps(self) -> list[dict[str, Any]]:
        cur = self.conn.execute("SELECT * FROM sweeps ORDER BY id")
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, row, strict=True)) for row in cur]

    def sweep_summaries(self) -> list[dict[str, Any]]:
        """One row per sweep, oldest first: what ``pglab sweeps`` lists (points and runs counted, not stored)."""
        cur = self.conn.execute(
            "SELECT s.id, s.started, s.status, s.plan_name, "
            "(SELECT count(*) FROM points p WHERE p.sweep_id = s.id), "
            "(SELECT count(*) FROM runs r WHERE r.sweep_id = s.id AND r.status = 'ok'), "
            "(SELECT count(*) FROM runs r WHERE r.sweep_id = s.id AND r.status = 'failed') "
            "FROM sweeps s ORDER BY s.id")
        return [{"sweep": row[0], "started": row[1], "status": row[2], "plan": row[3], "points": row[4],
                 "runs_ok": row[5], "runs_failed": row[6]} for row in cur]

    def latest_sweep_id(self) -> int | None:
        row = self.conn.execute("SELECT max(id) FROM sweeps").fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def runs(self, sweep_id: int | None = None) -> list[RunRow]:
        sql = ("SELECT r.id, r.sweep_id, r.point_id, r.repeat, r.status, r.reason, r.dir, p.axes, p.idx "
               "FROM runs r JOIN points p ON p.id = r.point_id")
        args: tuple[Any, ...] = ()
        if sweep_id is not None:
            sql += " WHERE r.sweep_id = ?"
            args = (sweep_id,)
        sql += " ORDER BY r.sweep_id, p.idx, r.repeat, r.started"
        rows = self.conn.execute(sql, args).fetchall()
        metrics: dict[str, dict[str, float | None]] = {}
        metric_sql = "SELECT m.run_id, m.name, m.value FROM run_metrics m"
        if sweep_id is not None:
            metric_sql += " JOIN runs r ON r.id = m.run_id WHERE r.sweep_id = ?"
        for run_id, name, value in self.conn.execute(metric_sql, args):
            metrics.setdefault(run_id, {})[name] = value
        return [RunRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], json.loads(r[7]), metrics.get(r[0], {}))
                for r in rows]

    def measured_windows(self, sweep_id: int) -> list[tuple[float, float]]:
        """The measured windows (epoch s) of the sweep's runs that ended ok."""
        return [(float(s), float(e)) for s, e in self.conn.execute(
            "SELECT window_start, window_end FROM runs WHERE sweep_id = ? AND status = 'ok' "
            "AND window_start IS NOT NULL AND window_end IS NOT NULL ORDER BY started", (sweep_id,))]

    def run_times(self, sweep_id: int) -> list[tuple[str, float, float | None]]:
        """(run_id, started, ended) of the sweep's runs in the order they started: when each run's row was opened and
        closed (None while it runs)."""
        return [(r, float(s), e) for r, s, e in self.conn.execute(
            "SELECT id, started, ended FROM runs WHERE sweep_id = ? ORDER BY started, rowid", (sweep_id,))]

    def run_window(self, run_id: str) -> tuple[float, float] | None:
        """The run's measured window (epoch s), None when it never reached one (failed early, interrupted)."""
        row = self.conn.execute("SELECT window_start, window_end FROM runs WHERE id = ?", (run_id,)).fetchone()
        return (row[0], row[1]) if row and row[0] is not None else None

    def run_event_times(self, run_id: str) -> list[tuple[str, float]]:
        """(kind, ts) of the run's own events, in the order they were stored."""
        return [(kind, ts) for kind, ts in self.conn.execute(
            "SELECT kind, ts FROM events WHERE run_id = ? ORDER BY rowid", (run_id,))]

    def plan_text(self, sweep_id: int | None) -> str | None:
        """The plan YAML the sweep ran, as it was written."""
        row = self.conn.execute("SELECT plan_text FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
        return row[0] if row else None

    def sweep_environment(self, sweep_id: int | None) -> dict[str, Any] | None:
        """The environment captured at the sweep's start (None before it was captured)."""
        row = self.conn.execute("SELECT environment FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
        return json.loads(row[0]) if row and row[0] else None

    def point_axes(self, sweep_id: int | None) -> list[dict[str, Any]]:
        """The axes of every point of the sweep, in plan order (also the points no run has reached yet)."""
        return [json.loads(axes) for (axes,) in self.conn.execute(
            "SELECT axes FROM points WHERE sweep_id = ? ORDER BY idx", (sweep_id,))]

    def sweep_series(self, sweep_id: int | None) -> list[tuple[str, float, float | None, str, str, float | None]]:
        """(run_id, ts, t_s, source, metric, value) of every sample of the sweep's runs, in run order; ``t_s``
        counts from the run's measured window."""
        return [tuple(r) for r in self.conn.execute(
            "SELECT s.run_id, s.ts, s.ts - r.window_start, s.source, s.metric, s.value "
            "FROM runs r JOIN points p ON p.id = r.point_id JOIN series s ON s.run_id = r.id WHERE r.sweep_id = ? "
            "ORDER BY p.idx, r.repeat, r.started, s.source, s.metric, s.ts", (sweep_id,))]

    def sweep_and_run_events(self, sweep_id: int | None) -> list[tuple[float, str, str | None, str | None, str]]:
        """(ts, kind, detail, run_id, scope) of the runs' own events and the sweep's (scope 'run' or 'sweep'); a
        sweep event carries the run whose measured window it falls in, if any."""
        return [tuple(r) for r in self.conn.execute(
            "SELECT e.ts, e.kind, e.detail, coalesce(e.run_id, (SELECT r.id FROM runs r WHERE r.sweep_id = ?1 AND "
            "e.ts BETWEEN r.window_start AND r.window_end ORDER BY r.window_start LIMIT 1)), "
            "CASE WHEN e.run_id IS NULL THEN 'sweep' ELSE 'run' END "
            "FROM events e WHERE e.sweep_id = ?1 OR e.run_id IN (SELECT id FROM runs WHERE sweep_id = ?1) "
            "ORDER BY e.ts, e.rowid", (sweep_id,))]

    def fio_series(self, sweep_id: int | None) -> list[tuple[int, str, str, str, float, float | None,
                                                             float | None, float | None]]:
        """(fio_id, label, job, direction, ts, t_s, iops, lat_ms) of every fio job of the sweep, per second;
        ``t_s`` counts from the job's start."""
        return [tuple(r) for r in self.conn.execute(
            "SELECT f.fio_id, r.label, r.job, r.direction, f.ts, f.ts - r.started, f.iops, f.lat_ms "
            "FROM fio_results r JOIN fio_series f ON f.fio_id = r.id WHERE r.sweep_id = ? ORDER BY r.id, f.ts",
            (sweep_id,))]

    def tenant_metrics(self, run_id: str) -> dict[str, tuple[str, dict[str, float | None]]]:
        """tenant -> (tier, {metric: value}) of one run of a tenants plan."""
        out: dict[str, tuple[str, dict[str, float | None]]] = {}
        for tenant, tier, name, value in self.conn.execute(
                "SELECT tenant, tier, name, value FROM tenant_metrics WHERE run_id = ? ORDER BY tenant", (run_id,)):
            out.setdefault(tenant, (tier, {}))[1][name] = value
        return out

    def series(self, run_id: str, source: str | None = None) -> list[tuple[float, str, str, float | None]]:
        sql = "SELECT ts, source, metric, value FROM series WHERE run_id = ?"
        args: tuple[Any, ...] = (run_id,)
        if source:
            sql += " AND source = ?"
            args += (source,)
        return [tuple(r) for r in self.conn.execute(sql + " ORDER BY ts", args)]


def _num(v: Any) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f else None  # NaN is stored as NULL


def _relative(path: Any, base: Path) -> str | None:
    if path is None:
        return None
    p = Path(path)
    return str(p.relative_to(base)) if p.is_relative_to(base) else str(p)


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip() and not s.strip().startswith("--")]
