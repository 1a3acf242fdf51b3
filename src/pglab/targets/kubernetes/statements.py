"""Which statements took the time on a Kubernetes run: pg_stat_statements read by the run's Job, at the measured
window's start and end, kept in ``statements.json`` exactly as a local run keeps it.

Where it is read: CloudNativePG loads pg_stat_statements (``shared_preload_libraries``, managed by the operator) and
creates the extension in every database as soon as a ``pg_stat_statements.*`` parameter is set
(``postgres.parameters`` or a ``matrix.parameters`` axis); only then does the run Job read it. pglab reads no pod
by exec: the Job's own psql, connected as pgbench is (the application role, through the ``-rw`` Service), writes
each read to a file its pod ships with the others, as the settings wait does.

When: pgbench runs warm-up and measured window in one process on Kubernetes (the window is cut from its
per-transaction log), so without a warm-up the reads come right before pgbench starts and right after it ends;
with one, the first read is taken ``run.warmup`` seconds after pgbench started (its connections' set-up, a few ms,
falls before it: a few statements at the window's start may be counted or missed), the last after it ends. The
reads' own statements (marked ``pglab-statements``) are left out. The application role sees the text and identity
of its own statements only: other roles' (the operator's monitoring queries, as ``postgres``) have no queryid for
it and are left out, as pglab's own sessions are on a local lab. Not read with several load pods, nor through a
scenario (a failover moves the ``-rw`` Service to another server, whose view started from nothing). Nothing here
fails a run: what psql said is kept in ``statements.err``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from pglab.plan.expand import Point
from pglab.plan.schema import Plan
from pglab.probes.statements import FIGURES, Snapshot, entry, write_statements

START_FILE, END_FILE, ERR_FILE = "statements-start.txt", "statements-end.txt", "statements.err"
MARK = "pglab-statements"  # in the reads' own text, so that they are left out
TRIGGER = "pg_stat_statements."  # a parameter with this prefix makes CloudNativePG load the library

# one row: the view's every column (whatever the installed version has) for this database's statements
# (jsonb: its text is one line, a statement's own newlines escaped)
READ_SQL = (f"SELECT /* {MARK} */ jsonb_build_object('version', (SELECT extversion FROM pg_extension WHERE extname "
            "= 'pg_stat_statements'), 'statements', coalesce((SELECT jsonb_agg(to_jsonb(s)) FROM pg_stat_statements s "
            "WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())), '[]'::jsonb))")
DEALLOC_SQL = f"SELECT /* {MARK} */ dealloc FROM pg_stat_statements_info"  # 1.9+: entries evicted so far


def wanted(plan: Plan, parameters: dict[str, str], point: Point) -> bool:
    """Whether the run Job reads the view: CloudNativePG loads it for this point, the probes are on, one load pod,
    no scenario."""
    return (plan.probes.enabled and plan.run.load_pods == 1 and point.scenario is None
            and any(k.startswith(TRIGGER) for k in parameters))


def reads(plan: Plan, parameters: dict[str, str], point: Point) -> tuple[str, str]:
    """The shell around the run Job's ``if [ "$rc" = 0 ]; then <pgbench>; fi`` line: what goes before it and what
    after it ("", "" when the view is not read). Each read writes the pod's epoch, then psql's lines."""
    if not wanted(plan, parameters, point):
        return "", ""
    psql = shlex.join(["psql", "-XAtq", "-c", READ_SQL, "-c", DEALLOC_SQL])
    read = f'statements_read() {{ {{ date +%s.%N; {psql}; }} > "$1" 2>> {ERR_FILE} || true; }}\n'
    warmup = plan.run.warmup if plan.run.measured_seconds is not None else 0.0
    if warmup <= 0:
        return (f'{read}if [ "$rc" = 0 ]; then statements_read {START_FILE}; fi\n',
                f'if [ "$rc" = 0 ]; then statements_read {END_FILE}; fi\n')
    # the warm-up's end: pgbench.err appears as the shell starts pgbench
    before = (f"{read}(until [ -e pgbench.err ]; do sleep 0.05; done; sleep {warmup:g}; "
              f"statements_read {START_FILE}) &\nstatements_reader=$!\n")
    after = ('if [ "$rc" = 0 ]; then wait "$statements_reader" || true; '
             f'statements_read {END_FILE}; else kill "$statements_reader" 2>/dev/null || true; fi\n')
    return before, after


class ReadError(ValueError):
    """A read the Job shipped that cannot be parsed."""


def parse(text: str) -> tuple[Snapshot, str] | None:
    """One read as the Job shipped it: the snapshot (the pod's epoch, every entry the role can identify by key, the
    entries evicted so far) and the extension's version; None when the view did not answer (not loaded, no
    extension: psql's words are in statements.err)."""
    lines = text.splitlines()
    if len(lines) < 2 or not lines[1].startswith("{"):
        return None
    entries: dict[tuple[Any, ...], dict[str, Any]] = {}
    try:
        ts = float(lines[0])
        doc = json.loads(lines[1])
        dealloc = float(lines[2]) if len(lines) > 2 and lines[2].strip() else None
        for row in doc.get("statements") or []:
            query = str(row.get("query") or "")
            if row.get("queryid") is None or MARK in query:  # another role's (no identity for this one), or ours
                continue
            userid = int(row["userid"]) if row.get("userid") is not None else None  # an oid: JSON text
            columns = {**row, "total_exec_time": row.get("total_exec_time", row.get("total_time"))}
            entries[(userid, int(row["queryid"]), row.get("toplevel"))] = entry(query,
                                                                              [columns.get(k) for k in FIGURES])
    except (ValueError, TypeError, AttributeError) as exc:
        raise ReadError(f"unreadable: {exc}") from None
    return (ts, entries, dealloc), str(doc.get("version") or "")


def record(run_dir: Path) -> dict[str, Any]:
    """``statements.json`` from the two reads the run Job shipped into ``run_dir``, and run.json's entry for it:
    ``{"statements": summary}``, or nothing when the Job read nothing (or the view did not answer). A read that
    cannot be parsed is one line of the run's probe errors, not a failure."""
    start_file, end_file = run_dir / START_FILE, run_dir / END_FILE
    if not (start_file.is_file() and end_file.is_file()):
        return {}
    try:
        start, end = parse(start_file.read_text(errors="replace")), parse(end_file.read_text(errors="replace"))
    except ReadError as exc:
        with (run_dir / "probe-errors.txt").open("a") as f:
            f.write(f"statements: {exc}\n")
        return {}
    if start is None or end is None:
        return {}
    note = ("read by the run Job as the application role: other roles' statements (the operator's monitoring) "
            "are not visible to it and left out")
    return {"statements": write_statements(run_dir, start[0], end[0], f"pg_stat_statements {end[1]}", note)}
