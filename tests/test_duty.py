"""Where a sweep's wall time goes (issue 22, item 4): the phases a real sweep stores tile its wall time, each run's
"measure" phase holds its transactions (PostgreSQL's own clock says when they ran), the dataset is reset before
every run whatever order the per-run steps now take, and the report's duty cycle is the windows pgbench logged over
the stored phases.

One sweep (kept with --keep so the table the script fills can be read afterwards) serves every test here."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import pglab, processes_mentioning
from helpers import read_store, sweep_row

pytestmark = pytest.mark.postgres

TRANSACTIONS = 25  # per client, one client: each run's script sees the history grow from 0 to 24 if it was reset

# Each transaction notes how many rows pgbench_history holds (the reset truncates it), then adds one. The note lives
# in a table the reset does not touch, so every run's notes are there at the end.
SEEN = """\
BEGIN;
CREATE TABLE IF NOT EXISTS history_seen (ts timestamptz NOT NULL, n bigint NOT NULL);
INSERT INTO history_seen SELECT clock_timestamp(), count(*) FROM pgbench_history;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 1, 1, 1, CURRENT_TIMESTAMP);
END;
"""

RUN_STEPS = ["prepare", "reset", "probes", "measure", "closing-tick", "summary", "record"]


@pytest.fixture(scope="module")
def sweep() -> Any:
    base = Path(tempfile.mkdtemp(prefix="pglab-test-"))
    os.chmod(base, 0o711)
    (base / "seen.sql").write_text(SEEN)
    plan = base / "plan.yaml"
    plan.write_text(f"""
name: duty
target:
  local:
    instances: 2
    synchronous: {{method: any, number: 1}}
dataset: {{scale: 1}}
storage: {{profiles: [wal-fdatasync-8k], runtime: 1s, size: 16MiB}}
matrix:
  workload: [{{name: seen, scripts: [{{file: seen.sql}}]}}]
  synchronous_commit: [local, "on"]
  clients: [1]
run: {{transactions: {TRANSACTIONS}, repeats: 2}}
""")
    results = base / "results"
    proc = pglab("run", str(plan), "--results", str(results), "--keep", "--format", "csv")
    target = sweep_row(results)["target"] or {}
    lab = Path(target["lab_dir"]) if target.get("lab_dir") else None
    try:
        with read_store(results) as store:
            yield {"proc": proc, "results": results, "store": store, "lab": lab, "target": target}
    finally:
        if lab is not None:
            pglab("lab", "clean", str(lab))
            assert processes_mentioning(str(lab)) == []
        shutil.rmtree(base, ignore_errors=True)


def _runs(sweep: Any) -> list[tuple[str, str, float, float]]:
    """(id, folder, window start, window end) of each run, in the order they ran."""
    assert sweep["proc"].returncode == 0, sweep["proc"].stderr
    store = sweep["store"]
    rows = {r.id: r for r in store.runs()}
    assert len(rows) == 4 and {r.status for r in rows.values()} == {"ok"}
    ordered = [run_id for run_id, _started, _ended in store.run_times(store.latest_sweep_id())]
    windows = {run_id: store.run_window(run_id) for run_id in ordered}
    assert list(rows) and None not in windows.values(), windows  # every run measured a window
    return [(run_id, rows[run_id].dir, *window) for run_id, window in windows.items() if window is not None]


def _phases(sweep: Any) -> list[tuple[str | None, str, float, float]]:
    phases: list[tuple[str | None, str, float, float]] = sweep["store"].phases(sweep["store"].latest_sweep_id())
    return phases


def _logged_window(run_dir: Path) -> tuple[float, float]:
    """The first transaction's start and the last one's end, from pgbench's own -l log (end epoch s + µs, minus
    the latency for the start)."""
    starts, ends = [], []
    for f in run_dir.glob("pgbench_log.*"):
        with (gzip.open(f, "rt") if f.suffix == ".gz" else open(f)) as lines:
            for line in lines:
                cols = line.split()
                end = int(cols[4]) + int(cols[5]) / 1e6
                starts.append(end - int(cols[2]) / 1e6)
                ends.append(end)
    assert len(ends) == TRANSACTIONS
    return min(starts), max(ends)


def test_the_phases_tile_the_sweeps_wall_time(sweep: Any) -> None:
    runs = _runs(sweep)
    (row,) = sweep["store"].sweeps()
    started, finished = row["started"], row["finished"]
    phases = _phases(sweep)
    assert phases[0][2] == started and phases[-1][3] == finished
    for before, after in itertools.pairwise(phases):
        assert after[2] == before[3], (before, after)  # each phase begins where the one before ended
        assert after[3] >= after[2]
    assert [name for run_id, name, _s, _e in phases if run_id is None] == ["setup", "lab", "storage", "dataset",
                                                                           "teardown"]
    for run_id, *_ in runs:
        assert [name for r, name, _s, _e in phases if r == run_id] == RUN_STEPS
    # the runs' rows were created and closed inside their own phases
    times = sweep["store"].run_times(sweep["store"].latest_sweep_id())
    assert len(times) == len(runs)
    for run_id, created, closed in times:
        mine = [(s, e) for r, _n, s, e in phases if r == run_id]
        assert closed is not None and mine[0][0] <= created and closed <= mine[-1][1]


def test_each_runs_transactions_ran_in_its_measure_phase_after_its_reset(sweep: Any) -> None:
    runs = _runs(sweep)
    phases = _phases(sweep)
    with psycopg.connect(host=str(sweep["lab"] / "sock"), port=sweep["target"]["nodes"][0]["port"], user="pglab",
                         dbname="pglab", passfile=str(sweep["lab"] / "secrets" / "pgpass"), autocommit=True) as conn:
        seen = conn.execute("SELECT extract(epoch FROM ts)::float8, n FROM history_seen ORDER BY ts").fetchall()
    assert len(seen) == 4 * TRANSACTIONS
    for run_id, run_dir, window_start, window_end in runs:
        steps = {name: (s, e) for r, name, s, e in phases if r == run_id}
        measure = steps["measure"]
        mine = [n for ts, n in seen if measure[0] <= ts <= measure[1]]
        # the history was empty when the run's first transaction began: the reset came before it, not later
        assert mine == list(range(TRANSACTIONS)), (run_id, mine)
        logged = _logged_window(sweep["results"] / run_dir)
        assert logged == pytest.approx((window_start, window_end), abs=1e-3)
        assert steps["reset"][1] <= measure[0] <= logged[0] and logged[1] <= measure[1] <= steps["summary"][0]


def test_the_report_says_where_the_wall_time_went(sweep: Any) -> None:
    runs = _runs(sweep)
    phases = _phases(sweep)
    proc = pglab("report", str(sweep["results"]), "--table", "time", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["phase"]: r for r in json.loads(proc.stdout)}
    wall = sum(e - s for _r, _n, s, e in phases)
    assert list(rows) == ["setup", "lab", "storage", "dataset", *RUN_STEPS, "teardown"]
    for name, row in rows.items():
        total = sum(e - s for _r, n, s, e in phases if n == name)
        assert row["seconds"] == pytest.approx(total, abs=0.006)
        assert row["share_pct"] == pytest.approx(total / wall * 100, abs=0.06)
        if name in RUN_STEPS:
            assert row["per_run_s"] == pytest.approx(total / 4, abs=0.006)
        else:
            assert row["per_run_s"] is None
    # the duty cycle: the windows pgbench logged over the wall time, in the terminal report
    measured = sum(w[1] - w[0] for w in (_logged_window(sweep["results"] / d) for _i, d, _s, _e in runs))
    piped = pglab("report", str(sweep["results"]), check=True).stdout
    assert max(len(line) for line in piped.splitlines()) <= 120  # piped, no COLUMNS: 120, the time table too
    text = " ".join(piped.split())
    found = re.search(r"duty cycle ([\d.]+) %: ([\d.]+) s measured in (\d+) window\(s\)", text)
    assert found, text
    assert float(found[1]) == pytest.approx(measured / wall * 100, abs=0.06)
    assert float(found[2]) == pytest.approx(measured, abs=0.06) and found[3] == "4"


def test_each_runs_probes_close_in_its_closing_phase_with_one_row_past_the_window(sweep: Any) -> None:
    """The closing sample (issue 33): every rate probe's rows past the window's end (pgbench's last transaction)
    are taken by the end of the run's closing-tick phase, before the summary; nothing the probes read falls in the
    next run's reset or window. The probes close at pgbench's exit, a few ms after its last transaction: a regular
    tick between the two is a row past the window's end before the close was asked, and the closing row follows it
    (the tick did not reach the exit); so one row past the end, or that tick in the measure phase and one more."""
    runs = _runs(sweep)
    phases = _phases(sweep)
    store = sweep["store"]
    for run_id, _run_dir, _window_start, window_end in runs:
        steps = {name: (s, e) for r, name, s, e in phases if r == run_id}
        closing = steps["closing-tick"]
        rows: dict[str, set[float]] = {}
        for ts, source, metric, _value in store.series(run_id):
            if metric == "dt" and (source in ("cpu", "pg") or source.startswith("disk:")):
                rows.setdefault(source, set()).add(ts)
        assert {"cpu", "pg"} <= set(rows) and any(s.startswith("disk:") for s in rows), sorted(rows)
        for source, stamps in rows.items():
            past = sorted(ts for ts in stamps if ts > window_end)
            assert 1 <= len(past) <= 2, (run_id, source, sorted(stamps), window_end)
            if len(past) == 2:  # the first a regular tick while pgbench exited, before the close was asked
                assert past[0] <= closing[0] < past[1], (run_id, source, past, closing)
            assert window_end < past[-1] <= closing[1] <= steps["summary"][0], (run_id, source, past, closing)
