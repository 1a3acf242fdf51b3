"""Duty cycle: the seconds a sweep measures over the wall time of ``pglab run`` (issue 22, item 4: target ≥ 90 %
on a plan with 30 s runs).

Why: every second pglab spends between measured windows (the lab build, the dataset reset and the replay wait, the
probes' closing tick, the log summary, the store, the teardown) is a second the user waits for nothing; with short
runs it is a large share of the sweep.

How: the same plan (a 3-node local lab as the quickstart builds it, dataset scale 10, tpcb-like at 1, 4 and 8
clients, 2 interleaved repeats, ``--duration`` s measured, no warm-up) is run by ``pglab run`` from each source tree
given (``--tree NAME=DIR``, e.g. the branch point extracted with ``git archive`` and the working tree), the trees
taking turns ``--rounds`` times so that a drift of the shared machine falls on each. Every figure comes from the
results store each run wrote, with the same queries whatever the pglab version:

- wall: the sweep's ``started`` to ``finished``; measured: the sum of its ok runs' windows;
- before the window (a run's row created to its window's start: reset, replay wait, settings, probes, pgbench's
  start), after it (window end to the run's row closed: closing probe tick, log summary, figures, the store),
  between runs (one run's row closed to the next one's created), before the first run (lab, dataset) and after the
  last (teardown); medians per run;
- and, where the store has them (a pglab that records its phases), the phases by name.

    .venv/bin/python bench/duty_cycle.py --tree before=/tmp/pglab-main --tree after=. --json out.json

``--plan FILE`` runs that plan instead (e.g. examples/quickstart.yaml: its storage phase and warm-ups count in the
wall time, as they do for a user; ``--duration``, ``--repeats`` and ``--scale`` are then the plan's own).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PLAN = """\
name: duty-cycle
target:
  local:
    instances: 3
    synchronous: {{method: any, number: 1}}
postgres:
  parameters:
    shared_buffers: 128MB
    max_wal_size: 1GB
dataset: {{scale: {scale}}}
matrix:
  workload: [{workload}]
  clients: [1, 4, 8]
run:
  duration: {duration}s
  repeats: {repeats}
"""


def one_sweep(tree: Path, plan: Path, results: Path, python: str) -> dict[str, Any]:
    """``pglab run`` from ``tree`` into ``results``; the figures read back from its store."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    load = os.getloadavg()[0]
    t0 = time.time()
    proc = subprocess.run([python, "-m", "pglab.cli", "run", str(plan), "--results", str(results)], env=env,
                          capture_output=True, text=True, cwd=tree)
    process_s = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"pglab run from {tree} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    # the machine's 1-minute load average before and after the sweep (a shared machine: say how busy it was)
    return {"process_s": process_s, "load_before": load, "load_after": os.getloadavg()[0],
            **figures(results / "results.db")}


def figures(db_path: Path) -> dict[str, Any]:
    db = sqlite3.connect(db_path)
    try:
        sid, started, finished, status = db.execute(
            "SELECT id, started, finished, status FROM sweeps ORDER BY id DESC LIMIT 1").fetchone()
        runs = db.execute("SELECT started, ended, window_start, window_end, status FROM runs WHERE sweep_id = ? "
                          "ORDER BY started", (sid,)).fetchall()
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        phases = (db.execute("SELECT name, sum(ended - started), count(DISTINCT run_id) FROM phases "
                             "WHERE sweep_id = ? GROUP BY name", (sid,)).fetchall() if "phases" in tables else [])
        per_run = (db.execute("SELECT p.name, p.ended - p.started FROM phases p JOIN runs r ON r.id = p.run_id "
                              "WHERE p.sweep_id = ? ORDER BY r.started, p.started", (sid,)).fetchall()
                   if "phases" in tables else [])
    finally:
        db.close()
    ok = [r for r in runs if r[4] == "ok" and r[2] is not None]
    wall = finished - started
    measured = sum(r[3] - r[2] for r in ok)
    before = [r[2] - r[0] for r in ok]
    after = [r[1] - r[3] for r in ok]
    between = [b[0] - a[1] for a, b in itertools.pairwise(runs)]
    part = runs[-1][1] - runs[0][0] if runs else 0.0  # the runs' part: the first run's start to the last's end
    return {"status": status, "runs_ok": len(ok), "runs": len(runs), "wall_s": wall, "measured_s": measured,
            "duty_cycle": measured / wall if wall > 0 else 0.0,
            "runs_part_s": part, "runs_part_duty_cycle": measured / part if part > 0 else 0.0,
            "first_run_after_s": runs[0][0] - started if runs else None,
            "teardown_s": finished - runs[-1][1] if runs else None,
            "before_window_median_s": statistics.median(before) if before else None,
            "after_window_median_s": statistics.median(after) if after else None,
            "between_runs_median_s": statistics.median(between) if between else None,
            "phases": {name: {"seconds": s, "runs": n} for name, s, n in phases},
            # each run's phases in the runs' order (the first run's may carry what is done once per sweep)
            "run_phases": {name: [s for n, s in per_run if n == name] for name in sorted({n for n, _ in per_run})}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, metavar="NAME=DIR",
                    help="a pglab source tree to run (its src/ on PYTHONPATH); give two to compare")
    ap.add_argument("--duration", type=float, default=30.0, help="measured seconds per run (default 30)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--workload", default="tpcb-like", choices=["tpcb-like", "select-only", "simple-update"],
                    help="the generated plan's workload (default tpcb-like)")
    ap.add_argument("--rounds", type=int, default=1, help="sweeps per tree, the trees taking turns")
    ap.add_argument("--plan", type=Path, help="run this plan file instead of the generated one")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", type=Path, help="also write every figure here")
    args = ap.parse_args(argv)
    trees = {name: Path(d).resolve() for name, d in (t.split("=", 1) for t in args.tree)}
    work = Path(tempfile.mkdtemp(prefix="pglab-duty-"))
    plan = work / "duty-cycle.yaml"
    if args.plan is not None:
        plan = args.plan.resolve()
    else:
        plan.write_text(PLAN.format(scale=args.scale, duration=f"{args.duration:g}", repeats=args.repeats,
                                     workload=args.workload))
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for name in order:
            fig = one_sweep(trees[name], plan, work / f"{name}-{r}", args.python)
            out[name].append(fig)
            print(f"round {r + 1} {name}: duty cycle {fig['duty_cycle'] * 100:.1f} % "
                  f"({fig['measured_s']:.1f} s of {fig['wall_s']:.1f} s; pglab run {fig['process_s']:.1f} s; "
                  f"the runs' part {fig['runs_part_duty_cycle'] * 100:.1f} % of {fig['runs_part_s']:.1f} s); "
                  f"per run: {fig['before_window_median_s']:.2f} s before the window, "
                  f"{fig['after_window_median_s']:.2f} s after, {fig['between_runs_median_s']:.2f} s between; "
                  f"lab+dataset {fig['first_run_after_s']:.1f} s, teardown {fig['teardown_s']:.1f} s; load average "
                  f"{fig['load_before']:.1f} → {fig['load_after']:.1f}", flush=True)
            if fig["phases"]:
                print("  phases: " + ", ".join(f"{n} {p['seconds']:.1f} s" for n, p in fig["phases"].items()),
                      flush=True)
            if fig["run_phases"]:
                print("  per run: " + "; ".join(f"{n} " + " ".join(f"{s:.2f}" for s in ss)
                                                for n, ss in fig["run_phases"].items()), flush=True)
    print("\nmedians over rounds:")
    summary: dict[str, dict[str, float]] = {}
    for name, figs in out.items():
        keys = ("duty_cycle", "runs_part_duty_cycle", "runs_part_s", "wall_s", "measured_s", "process_s",
                "before_window_median_s", "after_window_median_s", "between_runs_median_s", "first_run_after_s",
                "teardown_s")
        summary[name] = {k: statistics.median(f[k] for f in figs) for k in keys}
        s = summary[name]
        print(f"  {name}: duty cycle {s['duty_cycle'] * 100:.1f} % (the runs' part "
              f"{s['runs_part_duty_cycle'] * 100:.1f} %), wall {s['wall_s']:.1f} s, measured "
              f"{s['measured_s']:.1f} s, pglab run {s['process_s']:.1f} s; per run {s['before_window_median_s']:.2f}"
              f" / {s['after_window_median_s']:.2f} / {s['between_runs_median_s']:.2f} s (before / after / between)")
    if len(summary) == 2:
        a, b = summary.values()
        print(f"  ratio of duty cycles: {b['duty_cycle'] / a['duty_cycle']:.2f} (the runs' part "
              f"{b['runs_part_duty_cycle'] / a['runs_part_duty_cycle']:.2f}); wall {b['wall_s'] / a['wall_s']:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
                                         "args": {k: str(v) for k, v in vars(args).items()},
                                         "sweeps": out, "medians": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
