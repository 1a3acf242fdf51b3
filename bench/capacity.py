"""The capacity search against a plain rate sweep of the same precision (issue 29, "Numbers"): how many runs and how
much wall time each needs to find the highest rate whose p99 stays under a target, on a quickstart-like lab.

Why: a search bisects between the closed loop's pace and 0, so it needs about log2(100 / precision) open-loop
runs; a sweep that knows nothing of where the knee is must lay a grid of rates at that precision over the whole
range, 100 / precision runs. Both answers are read from the stores the runs wrote.

How: the lab the quickstart builds (3 instances, quorum sync ANY 1, shared_buffers 128MB, dataset scale 10),
tpcb-like (or, with ``--sleep-ms``, a server of known capacity: each transaction one pg_sleep) at ``--clients``,
``--duration`` s measured after 1 s of warm-up, one run per rate. Per round:

- **search**: one ``pglab run`` of a plan with ``capacity: {percentile: 99, target, precision_pct}``;
- **sweep**: one ``pglab run`` of the closed loop alone (its TPS is the top of the range, as the search's first run
  is), then one of ``matrix.rate`` = precision × top, 2 × precision × top … top; its answer is the highest rate of
  the grid that held, bracketed by the next one.

The two take turns over ``--rounds`` (search, sweep, sweep, search …) so that a drift of the shared machine falls on
both. Wall time is each ``pglab run`` process's (lab build and teardown included: the sweep pays two of them, and
the table gives the sweeps' own measured seconds beside it).

    .venv/bin/python bench/capacity.py --target 20ms --precision 10 --rounds 2 --json out.json
"""

from __future__ import annotations

import argparse
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

LAB = """\
name: {name}
target:
  local:
    instances: 3
    synchronous: {{method: any, number: 1}}
postgres:
  parameters:
    shared_buffers: 128MB
    max_wal_size: 1GB
dataset: {{scale: 10}}
probes: {{enabled: false}}
run: {{duration: {duration}s, warmup: 1s, repeats: 1, order: sequential}}
"""


def pglab_run(plan: Path, results: Path) -> float:
    """``pglab run`` as a user runs it; its wall time (s)."""
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "pglab.cli", "run", str(plan), "--results", str(results)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"pglab run {plan} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return time.time() - t0


def stored(results: Path) -> list[dict[str, Any]]:
    """The ok runs of the folder: rate (None: closed loop), TPS, p99, measured seconds."""
    db = sqlite3.connect(results / "results.db")
    try:
        rows = db.execute("SELECT r.id, p.axes, r.window_start, r.window_end FROM runs r JOIN points p "
                          "ON p.id = r.point_id WHERE r.status = 'ok' ORDER BY r.started").fetchall()
        out = []
        for run_id, axes, start, end in rows:
            m = dict(db.execute("SELECT name, value FROM run_metrics WHERE run_id = ?", (run_id,)).fetchall())
            out.append({"rate": json.loads(axes).get("rate"), "tps": m.get("tps"), "p99": m.get("latency_p99_ms"),
                        "measured_s": (end or 0) - (start or 0)})
        return out
    finally:
        db.close()


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def search(work: Path, args: argparse.Namespace, n: int) -> dict[str, Any]:
    plan = write(work / f"search{n}.yaml", LAB.format(name=f"capacity-search-{n}", duration=args.duration)
                 + f"matrix: {{workload: [{workload(work, args)}], clients: [{args.clients}]}}\n"
                 f"capacity: {{percentile: 99, target: {args.target}, precision_pct: {args.precision}, "
                 "max_probes: 20}\n")
    wall = pglab_run(plan, work / f"search{n}")
    runs = stored(work / f"search{n}")
    target = target_ms(args.target)
    held = [r["rate"] for r in runs if r["rate"] is not None and r["p99"] is not None and r["p99"] <= target]
    capacity = max(held, default=None)
    above = [r["rate"] for r in runs if r["rate"] is not None and r["rate"] not in held
             and (capacity is None or r["rate"] > capacity)]
    return {"wall_s": wall, "runs": len(runs), "measured_s": sum(r["measured_s"] for r in runs),
            "top": next(r["tps"] for r in runs if r["rate"] is None), "capacity": capacity,
            "failed_at": min(above, default=None), "probes": runs}


def sweep(work: Path, args: argparse.Namespace, n: int) -> dict[str, Any]:
    closed = write(work / f"closed{n}.yaml", LAB.format(name=f"capacity-closed-{n}", duration=args.duration)
                   + f"matrix: {{workload: [{workload(work, args)}], clients: [{args.clients}]}}\n")
    wall = pglab_run(closed, work / f"closed{n}")
    [first] = stored(work / f"closed{n}")
    top = float(first["tps"])
    steps = round(100 / args.precision)
    rates = sorted({max(1, round(top * k / steps)) for k in range(1, steps + 1)})
    grid = write(work / f"sweep{n}.yaml", LAB.format(name=f"capacity-sweep-{n}", duration=args.duration)
                 + f"matrix: {{workload: [{workload(work, args)}], clients: [{args.clients}], rate: {rates}}}\n")
    wall += pglab_run(grid, work / f"sweep{n}")
    runs = stored(work / f"sweep{n}")
    target = target_ms(args.target)
    held = [r["rate"] for r in runs if r["p99"] is not None and r["p99"] <= target]
    capacity = max(held, default=None)
    above = [r["rate"] for r in runs if r["rate"] not in held and (capacity is None or r["rate"] > capacity)]
    return {"wall_s": wall, "runs": len(runs) + 1, "measured_s": sum(r["measured_s"] for r in runs)
            + first["measured_s"], "top": top, "capacity": capacity, "failed_at": min(above, default=None),
            "probes": [first, *runs]}


def workload(work: Path, args: argparse.Namespace) -> str:
    """The plan's workload: tpcb-like, or a server of known capacity (each transaction a pg_sleep of --sleep-ms:
    clients / sleep transactions a second at most, and a latency curve that is queueing, not the machine's noise)."""
    if args.sleep_ms is None:
        return "tpcb-like"
    (work / "sleep.sql").write_text(f"SELECT pg_sleep({args.sleep_ms / 1000});\n")
    return "{name: sleep, scripts: [{file: sleep.sql}]}"


def target_ms(text: str) -> float:
    return float(text.removesuffix("ms")) if text.endswith("ms") else float(text.removesuffix("s")) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="20ms", help="p99 target, e.g. 20ms")
    ap.add_argument("--precision", type=float, default=10.0, help="precision_pct of the search; the sweep's step")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--sleep-ms", type=float, help="instead of tpcb-like, transactions of one pg_sleep this long")
    ap.add_argument("--duration", type=int, default=5, help="measured seconds per run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args()
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "machine": {
        "cpus": os.cpu_count(), "kernel": platform.release(), "load_before": os.getloadavg()[0]},
        "search": [], "sweep": []}
    with tempfile.TemporaryDirectory(prefix="pglab-bench-capacity-") as tmp:
        work = Path(tmp)
        for n in range(args.rounds):
            order = ("search", "sweep") if n % 2 == 0 else ("sweep", "search")
            for kind in order:
                result = (search if kind == "search" else sweep)(work, args, n)
                result["load_after"] = os.getloadavg()[0]
                out[kind].append(result)
                print(f"round {n + 1} {kind}: {result['runs']} runs, {result['wall_s']:.1f} s, capacity "
                      f"{result['capacity']} (failed at {result['failed_at']}), closed loop {result['top']:.1f} tx/s,"
                      f" load {result['load_after']:.1f}", flush=True)
    out["machine"]["load_after"] = os.getloadavg()[0]
    med = {k: {f: statistics.median(r[f] for r in out[k]) for f in ("runs", "wall_s", "measured_s")}
           for k in ("search", "sweep")}
    out["medians"] = med
    a, b = med["search"], med["sweep"]
    print(f"medians: search {a['runs']:g} runs, {a['wall_s']:.1f} s wall ({a['measured_s']:.1f} s measured); sweep "
          f"{b['runs']:g} runs, {b['wall_s']:.1f} s ({b['measured_s']:.1f} s); sweep / search: runs "
          f"{b['runs'] / a['runs']:.2f}, wall {b['wall_s'] / a['wall_s']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
