"""Density on Kubernetes: how many tenants — each a one-instance CloudNativePG Cluster with its own dataset and
pgbench Job — a cluster carries, measured through ``pglab run`` as a user runs it (issue 23, item 1).

Needs a running cluster with CloudNativePG: the single-node lab (``sudo .venv/bin/python tools/kube-lab/kubelab.py
up``, one at a time on a machine: take ``flock /tmp/pglab-kube-lab.lock`` around it) or any other. Prints, from the
results store: whether every tenant has results, host TPS, TPS per tenant (median, min–max), the tenants' common
window, and the wall time of the sweep (build, load, run, teardown); writes them to ``--json`` if given.

    .venv/bin/python bench/kube_density.py --kubeconfig /tmp/pglab-kube-lab-XXXX/admin.kubeconfig \\
        --image pglab/postgresql:15 --tenants 8
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAN = """
name: kdensity
target:
  kubernetes:
    kubeconfig: {kubeconfig}
    namespace: pglab-density
    cluster_name: kd
    image: {image}
    storage: {{size: 1Gi}}
    resources: {{cpu: {cpu}, memory: {memory}}}
    database: {{anti_affinity: none}}
    clients: {{anti_affinity: none}}
postgres:
  parameters: {{shared_buffers: 16MB, max_connections: 10}}
dataset: {{scale: 1}}
tenants:
  arrangements:
    - name: n{tenants}
      tiers: [{{name: all, tenants: {tenants}, clients: 1, jobs: 1}}]
run: {{duration: {duration}s}}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--image", required=True, help="the PostgreSQL operand image the nodes have")
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--cpu", default="100m", help="each instance's CPU (requests = limits)")
    ap.add_argument("--memory", default="256Mi")
    ap.add_argument("--duration", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pglab-kdensity-"))
    plan = work / "plan.yaml"
    plan.write_text(PLAN.format(**vars(args)))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pglab.cli", "run", str(plan), "--results", str(work / "results")],
                          capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    out: dict[str, object] = {"tenants": args.tenants, "cpu": args.cpu, "memory": args.memory, "exit": proc.returncode,
                              "wall_s": round(wall, 1)}
    db = sqlite3.connect(work / "results" / "results.db")
    tps = [v for (v,) in db.execute("SELECT value FROM tenant_metrics WHERE name = 'tps'")]
    runs = dict(db.execute("SELECT name, value FROM run_metrics"))
    out.update({"tenants_with_results": len(tps), "host_tps": runs.get("tps"),
                "tps_per_tenant_median": statistics.median(tps) if tps else None,
                "tps_per_tenant_min": min(tps, default=None), "tps_per_tenant_max": max(tps, default=None),
                "common_window_s": runs.get("common_window_s"), "start_spread_s": runs.get("start_spread_s")})
    if proc.returncode != 0:
        out["error"] = proc.stderr.strip().splitlines()[-1:] or proc.stdout.strip().splitlines()[-1:]
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
