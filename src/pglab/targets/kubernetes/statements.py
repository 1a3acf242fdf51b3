"""Which statements took the time on a Kubernetes run: pg_stat_statements read by the run's Job (its own psql,
connected as pgbench is) at the measured window's start and end, kept in ``statements.json`` exactly as a local run
keeps it; no pod is read by exec. When the reads fall (one pgbench process holds warm-up and window), which pod reads
with ``run.load_pods``, and why a scenario that moves the primary is not read (``NOT_READ_FILE``): docs/kubernetes.md,
"Statements". Nothing here fails a run: what psql said is kept in ``statements.err``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from pglab.plan.expand import Point
from pglab.plan.schema import Plan
from pglab.probes.statements import FIGURES, Snapshot, entry, write_statements
from pglab.targets.kubernetes.scripts import LOAD_DIR, READ_MARK, WindowRead, window_reads

START_FILE, END_FILE, ERR_FILE = "statements-start.txt", "statements-end.txt", "statements.err"
NOT_READ_FILE = "statements-not-read.txt"  # why the Job did not read the view, where it would have
MARK = READ_MARK  # in the reads' own text (and the load pods' barrier's), so that they are left out
MOVES_PRIMARY = ("failover", "switchover", "node-loss", "node-drain")  # scenarios after which -rw is another server
TRIGGER = "pg_stat_statements."  # a parameter with this prefix makes CloudNativePG load the library

# one row: the view's every column (whatever the installed version has) for this database's statements
# (jsonb: its text is one line, a statement's own newlines escaped)
READ_SQL = (f"SELECT /* {MARK} */ jsonb_build_object('version', (SELECT extversion FROM pg_extension WHERE extname "
            "= 'pg_stat_statements'), 'statements', coalesce((SELECT jsonb_agg(to_jsonb(s)) FROM pg_stat_statements s "
            "WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())), '[]'::jsonb))")
DEALLOC_SQL = f"SELECT /* {MARK} */ dealloc FROM pg_stat_statements_info"  # 1.9+: entries evicted so far


def loaded(plan: Plan, parameters: dict[str, str]) -> bool:
    """Whether the run Job reads the view at all: CloudNativePG loads it for this point, the probes are on."""
    return plan.probes.enabled and any(k.startswith(TRIGGER) for k in parameters)


def not_read(plan: Plan, parameters: dict[str, str], point: Point) -> str | None:
    """Why a run whose Job would read the view does not (a scenario that moves the primary), else None."""
    if not loaded(plan, parameters) or point.scenario is None or point.scenario.kind not in MOVES_PRIMARY:
        return None
    return (f"not read through a {point.scenario.kind}: the -rw Service leads to another server afterwards, whose "
            "pg_stat_statements holds its own history, not the window's")


def wanted(plan: Plan, parameters: dict[str, str], point: Point) -> bool:
    """Whether the run Job reads the view: it is loaded, and no scenario moves the primary during the run."""
    return loaded(plan, parameters) and not_read(plan, parameters, point) is None


def read_part(plan: Plan, parameters: dict[str, str], point: Point) -> WindowRead | None:
    """The run Job's reads of the view (``scripts.window_reads`` puts them at the window's edges), or None when it
    does not read it. Each read writes the pod's epoch, then psql's lines."""
    if not wanted(plan, parameters, point):
        return None
    psql = shlex.join(["psql", "-XAtq", "-c", READ_SQL, "-c", DEALLOC_SQL])
    read = f'statements_read() {{ {{ date +%s.%N; {psql}; }} > "$1" 2>> {ERR_FILE} || true; }}'
    return read, f"statements_read {START_FILE}", f"statements_read {END_FILE}"


def reads(plan: Plan, parameters: dict[str, str], point: Point) -> tuple[str, str]:
    """The shell around the run Job's ``if [ "$rc" = 0 ]; then <pgbench>; fi`` line for the view alone: what goes
    before it and what after it ("", "" when the view is not read)."""
    part = read_part(plan, parameters, point)
    warmup = plan.run.warmup if plan.run.measured_seconds is not None else 0.0
    return window_reads([part] if part is not None else [], warmup)


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
    """``statements.json`` from the two reads the run Job shipped into ``run_dir`` (with several load pods, pod 0's,
    under load-0/), and run.json's entry for it: ``{"statements": summary}``, or ``{"statements": {"not_read":
    why}}`` when the Job said why it did not read, or nothing when it read nothing (or the view did not answer). A
    read that cannot be parsed is one line of the run's probe errors, not a failure."""
    reads = run_dir if (run_dir / START_FILE).is_file() else run_dir / LOAD_DIR.format(index=0)
    for folder in (run_dir, run_dir / LOAD_DIR.format(index=0)):
        if (why := folder / NOT_READ_FILE).is_file():
            return {"statements": {"not_read": why.read_text(errors="replace").strip()}}
    start_file, end_file = reads / START_FILE, reads / END_FILE
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
