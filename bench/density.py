"""Density: how many PostgreSQL instances, each with its own dataset and pgbench, one host carries, and what each
costs in memory (issue "many tenants on one host": at least 16 instances on a 2-core / 24 GiB machine).

How: a tenants plan with one tier of ``--tenants`` single-instance tenants (``--scale`` each, small
shared_buffers), every tenant running its own ``--workload`` pgbench with ``--clients`` clients for
``--duration``, all in the same window, through ``pglab run`` as a user runs it. Then from the results store:
per tenant TPS, latency (average, p99) and memory (PSS of its server processes, sampled half-way through the
window); per host the sum of TPS, the memory the host lost while the fleet ran (MemAvailable before the build
against its lowest value while pglab ran, polled every 0.5 s), the build time, and the spread of TPS between
tenants.

    .venv/bin/python bench/density.py                               # 16 tenants, 30 s
    .venv/bin/python bench/density.py --tenants 24 --json out.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def plan_text(args: argparse.Namespace) -> str:
    return f"""name: density-{args.tenants}
description: {args.tenants} tenants on one host, one tier, every tenant with its own dataset and pgbench
postgres:
  parameters: {{shared_buffers: {args.shared_buffers}, max_connections: {max(10, args.clients + 5)}}}
dataset: {{scale: {args.scale}}}
run: {{duration: {args.duration}s, warmup: 2s}}
tenants:
  arrangements:
    - name: density-{args.tenants}
      tiers:
        - {{name: all, tenants: {args.tenants}, workload: {args.workload}, clients: {args.clients}}}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tenants", type=int, default=16)
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--workload", default="tpcb-like")
    ap.add_argument("--duration", type=int, default=30)
    ap.add_argument("--shared-buffers", default="32MB")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here (default: bench/measurements)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="pglab-density-"))
    plan = work / "plan.yaml"
    plan.write_text(plan_text(args))
    results = work / "results"
    available_before = mem_available_mib()
    lowest = [available_before]
    done = threading.Event()

    def poll() -> None:
        while not done.wait(0.5):
            lowest[0] = min(lowest[0], mem_available_mib())

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    started = time.monotonic()
    child = subprocess.Popen([sys.executable, "-m", "pglab.cli", "run", str(plan), "--results", str(results)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = child.communicate()
    except KeyboardInterrupt:  # pglab got the terminal's Ctrl-C too: let it tear the tenants down, do not kill it
        child.communicate()
        raise
    proc = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
    wall_s = time.monotonic() - started
    done.set()
    poller.join()
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        return 1
    db = sqlite3.connect(results / "results.db")
    run_id = db.execute("SELECT id FROM runs WHERE status = 'ok'").fetchone()[0]
    built = db.execute("SELECT ts FROM events WHERE kind = 'tenants-built'").fetchone()
    sweep_started = db.execute("SELECT started FROM sweeps").fetchone()[0]
    per: dict[str, dict[str, float]] = {}
    for tenant, name, value in db.execute("SELECT tenant, name, value FROM tenant_metrics WHERE run_id = ?",
                                          (run_id,)):
        per.setdefault(tenant, {})[name] = value
    db.close()
    tps = [m["tps"] for m in per.values()]
    memory = [m["memory_mb"] for m in per.values() if m.get("memory_mb") is not None]
    out: dict[str, Any] = {
        "date": dt.date.today().isoformat(),
        "machine": {"cores": os.cpu_count(), "kernel": platform.release(),
                    "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)},
        "command": "bench/density.py " + " ".join(sys.argv[1:]),
        "plan": plan_text(args),
        "tenants": len(per),
        "tenants_with_results": sum(1 for v in tps if v and v > 0),
        "build_s": round(built[0] - sweep_started, 1) if built else None,
        "wall_s": round(wall_s, 1),
        "host_tps": round(sum(tps), 1),
        "tps_per_tenant": {"median": round(statistics.median(tps), 1), "min": round(min(tps), 1),
                           "max": round(max(tps), 1)},
        "latency_avg_ms_median": round(statistics.median(m["latency_avg_ms"] for m in per.values()), 2),
        "latency_p99_ms_median": round(statistics.median(m["latency_p99_ms"] for m in per.values()), 2),
        "memory_per_instance_mb": {"median": round(statistics.median(memory), 1), "min": round(min(memory), 1),
                                   "max": round(max(memory), 1)} if memory else None,
        "host_memory_used_mb": round(available_before - lowest[0]),
        "per_tenant": {t: {k: round(v, 3) for k, v in m.items() if v is not None} for t, m in sorted(per.items())},
    }
    dest = args.json or HERE / "measurements" / f"density-{args.tenants}-{out['date']}.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k not in ("per_tenant", "plan")}, indent=1))
    print(f"written to {dest}; pglab's results in {results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
