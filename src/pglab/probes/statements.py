"""Which statements took the time: pg_stat_statements read at the measured window's start and end, where loaded.

Not a per-second probe: two snapshots of every statement of the run's database, taken right before the measured
pgbench starts and right after it ends (pg_stat_statements updates an entry when a statement ends, in shared memory,
with no publishing delay), and their deltas: calls, execution time, rows, shared blocks, WAL bytes. The run keeps
them all in ``statements.json`` and the top few by time in run.json.

Where it is available: the extension's view answers in the run's database. A target pglab owns (the local lab)
creates the extension when the library is loaded (``postgres.parameters.shared_preload_libraries:
pg_stat_statements``, which the lab does not load unless asked); on an external server it is used only when
already installed. Without it there is no artifact and no error. pglab's own sessions set
``pg_stat_statements.track = none`` (as a superuser; see probes._pg), so the probes' queries are not counted.
Nothing here fails a run: a failed snapshot is one line of the run's probe errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pglab.artifacts import write_json
from pglab.errors import first_line
from pglab.probes._pg import connect

TOP = 5  # statements summarised in run.json
QUERY_CHARS = 120  # of each one's text there

FIGURES = ("calls", "total_exec_time", "rows", "shared_blks_hit", "shared_blks_read", "shared_blks_dirtied",
           "shared_blks_written", "wal_bytes")
Key = tuple[Any, ...]  # userid, queryid, toplevel
Snapshot = tuple[float, dict[Key, dict[str, Any]], float | None]  # when, every entry by key, entries evicted so far


class StatementsWindow:
    """pg_stat_statements at the window's start and end; ``write`` keeps the deltas with the run."""

    def __init__(self, conninfo: str, *, create: bool):
        self.conninfo, self.create = conninfo, create
        self.errors: list[str] = []
        self.available = False
        self._conn: psycopg.Connection | None = None
        self._query = ""
        self._dealloc = ""  # how many entries pg_stat_statements evicted (pg_stat_statements_info, 1.9+)
        self.version = ""
        self._start: Snapshot | None = None
        self._end: Snapshot | None = None

    def open(self) -> None:
        """Find the view (create the extension where allowed); before the warm-up, so creating it is not measured."""
        try:
            self._conn = conn = connect(self.conninfo, "statements")
            if self.create and _loaded(conn):
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            row = conn.execute("SELECT n.nspname, e.extversion FROM pg_extension e JOIN pg_namespace n "
                               "ON n.oid = e.extnamespace WHERE e.extname = 'pg_stat_statements'").fetchone()
            if row is None:
                return self.close()
            schema, self.version = sql.Identifier(row[0]).as_string(conn), row[1]
            columns = {r[0] for r in conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass",
                                                  (f"{schema}.pg_stat_statements",))}
            self._query = _snapshot_query(schema, columns)
            info = conn.execute("SELECT to_regclass(%s)", (f"{schema}.pg_stat_statements_info",)).fetchone()
            if info is not None and info[0] is not None:
                self._dealloc = f"SELECT dealloc FROM {schema}.pg_stat_statements_info"
            conn.execute(self._query)  # not loaded: "must be loaded via shared_preload_libraries"
            self.available = True
        except psycopg.errors.ObjectNotInPrerequisiteState:  # the extension without the library: nothing to read
            self.close()
        except Exception as exc:
            self.errors.append(f"statements: {first_line(exc)}")
            self.close()

    def start(self, ts: float) -> None:
        """The snapshot at the window's start (``ts``: when it was taken, on the run's clock)."""
        self._start = self._snapshot(ts)

    def end(self, ts: float) -> None:
        self._end = self._snapshot(ts)
        self.close()

    def _snapshot(self, ts: float) -> Snapshot | None:
        if not self.available or self._conn is None:
            return None
        try:
            rows = self._conn.execute(self._query).fetchall()
            dealloc = self._conn.execute(self._dealloc).fetchone() if self._dealloc else None
        except Exception as exc:
            self.errors.append(f"statements: {first_line(exc)}")
            self.available = False
            self.close()
            return None
        entries = {(userid, queryid, toplevel): entry(query, figures)
                   for userid, queryid, toplevel, query, *figures in rows}
        return ts, entries, float(dealloc[0]) if dealloc else None

    def write(self, run_dir: Path) -> dict[str, Any] | None:
        """statements.json in the run's folder, and run.json's summary of it; None when nothing was measured."""
        if self._start is None or self._end is None:
            return None
        return write_statements(run_dir, self._start, self._end, f"pg_stat_statements {self.version}")

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


def write_statements(run_dir: Path, start: Snapshot, end: Snapshot, source: str,
                     note: str | None = None) -> dict[str, Any]:
    """``statements.json`` in ``run_dir`` from two snapshots (every target's: the local probes' and the Kubernetes
    Job's reads), and run.json's summary of it."""
    window, statements, evicted = deltas(start, end)
    doc: dict[str, Any] = {"window": window, "source": source, "evicted": evicted, "statements": statements}
    notes = [note] if note else []
    if evicted:
        notes.append(f"pg_stat_statements evicted {evicted:g} entries during the window: the figures of statements "
                     "evicted and tracked again are incomplete (raise pg_stat_statements.max)")
    if notes:
        doc["note"] = "; ".join(notes)
    write_json(run_dir / "statements.json", doc)
    top = [{"query": s["query"][:QUERY_CHARS], "calls": s["calls"], "total_exec_time_ms": s["total_exec_time"],
            "mean_exec_time_ms": s["mean_exec_time"], "time_pct": s["time_pct"]} for s in statements[:TOP]]
    return {"file": "statements.json", "count": len(statements), "top": top}


def entry(query: str, figures: Sequence[Any]) -> dict[str, Any]:
    """One statement's entry of a snapshot: its text and the figures of FIGURES, in that order (None: 0)."""
    return {"query": query, **{k: float(v or 0) for k, v in zip(FIGURES, figures, strict=True)}}


def deltas(start: Snapshot, end: Snapshot) -> tuple[list[float], list[dict[str, Any]], float | None]:
    """The window, every statement that ran in it (by execution time, most first) and the entries evicted.

    An entry new at the end counts from zero; one whose calls went down was reset or evicted and tracked again: its
    figures since then are what the window has of it (an evicted entry's figures are incomplete either way; the
    evicted count says when that happened)."""
    (t0, before, dealloc0), (t1, after, dealloc1) = start, end
    out = []
    for key, a in after.items():
        b = before.get(key)
        if b is not None and a["calls"] >= b["calls"]:
            d = {k: a[k] - b[k] for k in FIGURES}
        else:
            d = {k: a[k] for k in FIGURES}
        if d["calls"] <= 0:
            continue
        out.append({"queryid": key[1], "userid": key[0], "toplevel": key[2], "query": a["query"],
                    **{k: (int(v) if k not in ("total_exec_time", "wal_bytes") else v) for k, v in d.items()},
                    "mean_exec_time": d["total_exec_time"] / d["calls"]})
    out.sort(key=lambda s: s["total_exec_time"], reverse=True)
    total = sum(s["total_exec_time"] for s in out)
    for s in out:
        s["time_pct"] = s["total_exec_time"] / total * 100 if total > 0 else 0.0
    evicted = dealloc1 - dealloc0 if dealloc0 is not None and dealloc1 is not None else None
    return [t0, t1], out, evicted


def _snapshot_query(schema: str, columns: set[str]) -> str:
    """Every statement of the current database; the columns the installed version has (total_time before 1.8,
    no toplevel before 1.9, no wal_bytes before 1.8)."""
    exec_time = "total_exec_time" if "total_exec_time" in columns else "total_time"
    toplevel = "toplevel" if "toplevel" in columns else "NULL::bool"
    wal = "wal_bytes" if "wal_bytes" in columns else "NULL::numeric"
    return (f"SELECT userid::bigint, queryid, {toplevel}, query, calls, {exec_time}, rows, shared_blks_hit, "
            f"shared_blks_read, shared_blks_dirtied, shared_blks_written, {wal} "
            f"FROM {schema}.pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())")


def _loaded(conn: psycopg.Connection) -> bool:
    """Whether the server loaded the library (shared_preload_libraries, which only a superuser may read)."""
    try:
        got = conn.execute("SELECT current_setting('shared_preload_libraries')").fetchone()
    except psycopg.errors.InsufficientPrivilege:
        return False
    return got is not None and "pg_stat_statements" in [x.strip().strip('"') for x in str(got[0]).split(",")]
