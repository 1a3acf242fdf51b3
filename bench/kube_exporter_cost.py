"""What one read of CloudNativePG's exporter costs the instance it reads, and how much of that pglab needs (issue 33
item 2).

Why: bench/kube_gap.py found each read of the primary's exporter costs it about 0.16 s of CPU, a third of a second
of a 0.5-CPU instance's quota every 2 s; at 1 client the plugin's pgbench Job ran at 0.66 of its TPS with pglab's
reads beside it. A read runs the operator's default monitoring queries (sessions, locks, database sizes, every
setting, the extensions of every database, …); pglab reads four of them (pg_stat_database, pg_stat_bgwriter or
pg_stat_checkpointer, pg_stat_replication, pg_stat_archiver) and the instance manager's own collector (WAL, pg_wal).

How, on a running lab (``kubelab.py up``) and a Kubernetes plan (``kduty.yaml`` of docs/benchmarks.md): the Namespace
and Cluster as ``pglab k8s render`` writes them, ready, no load. Then in turns (A B C, then C B A, …) the Cluster's
``spec.monitoring`` is patched to one condition and the primary's answer is awaited until it serves what that
condition serves:

- ``default``: the operator's default queries (what pglab gave every Cluster before), ``metricsQueriesTTL: 1s``;
- ``builtin``: ``disableDefaultQueries: true``, the instance manager's own collector alone;
- ``pglab``: as ``pglab k8s render`` writes the Cluster with ``exporter_queries: pglab`` (the tree's default):
  ``disableDefaultQueries: true`` and the ConfigMap of the queries pglab reads, applied from the rendered folder.

Per turn: the primary pod's CPU cgroup (v1, read on this machine: the lab's nodes are its cgroups) over IDLE_S with
no read, then over READS reads of the primary alone, one every 2 s by pglab's own reader; the CPU one read costs is
the reads' CPU less the idle rate over their time, divided by their number. Each read's wall time is kept too.

    .venv/bin/python bench/kube_exporter_cost.py --kubeconfig LAB/admin.kubeconfig --plan kduty.yaml --turns 4 \\
        --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kube_gap import Lab, scraper
from kube_plugin import WAIT_S, lab_kubectl, render_plan

IDLE_S = 20.0
READS = 10
CONDITIONS = ("default", "builtin", "pglab")


# what each condition's answer serves (present) and does not (absent): how a patch is known to be in effect
SERVES = {"default": ({"cnpg_pg_settings_setting", "cnpg_pg_stat_database_xact_commit"}, set()),
          "builtin": ({"cnpg_collector_wal_bytes"}, {"cnpg_pg_settings_setting", "cnpg_pg_stat_database_xact_commit"}),
          "pglab": ({"cnpg_pg_stat_database_xact_commit", "cnpg_pg_stat_archiver_archived_count",
                     "cnpg_pg_stat_replication_replay_diff_bytes"}, {"cnpg_pg_settings_setting"})}


def monitoring(condition: str, rendered: dict[str, Any]) -> dict[str, Any]:
    """The Cluster's ``spec.monitoring`` for ``condition``; ``rendered``: as pglab made the Cluster (``pglab``)."""
    if condition == "pglab":
        return rendered
    return {"metricsQueriesTTL": "1s", "disableDefaultQueries": condition == "builtin", "customQueriesConfigMap": []}


def names(text: str) -> set[str]:
    return {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}


def switch(lab: Lab, read: Any, primary: str, condition: str, rendered: dict[str, Any]) -> float:
    """Patch the Cluster to ``condition`` and wait until the primary's exporter serves what it serves."""
    t0 = time.time()
    lab.k("patch", "-n", lab.ns, f"cluster/{lab.cluster}", "--type", "merge", "-p",
          json.dumps({"spec": {"monitoring": monitoring(condition, rendered)}}))
    present, absent = SERVES[condition]
    while time.time() - t0 < WAIT_S:
        served = names(read(primary))
        if present <= served and not absent & served:
            return time.time() - t0
        time.sleep(2)
    raise SystemExit(f"{condition}: the primary's exporter did not switch within {WAIT_S} s")


def one_turn(lab: Lab, kubeconfig: str, primary: str, condition: str) -> dict[str, Any]:
    idle0 = lab.cpu_stat(primary)
    t0 = time.time()
    time.sleep(IDLE_S)
    idle1, t1 = lab.cpu_stat(primary), time.time()
    s = scraper(kubeconfig, lab.ns, [primary], primary)
    s.start()
    time.sleep(2.0 * READS - 1.0)  # READS reads: at 0, 2, …, 2 (READS - 1) s
    s.stop()
    reads1, t2 = lab.cpu_stat(primary), time.time()
    n = len(s.scrapes)
    idle_rate = (idle1["usage_ns"] - idle0["usage_ns"]) / 1e9 / (t1 - t0)
    reads_cpu = (reads1["usage_ns"] - idle1["usage_ns"]) / 1e9
    return {"condition": condition, "reads": n, "failed": sum(1 for x in s.scrapes if x.text is None),
            "idle_cpu_per_s": idle_rate, "reads_cpu_s": reads_cpu, "reads_s": t2 - t1,
            "cpu_per_read_s": (reads_cpu - idle_rate * (t2 - t1)) / n if n else None,
            "read_wall_s": [x.took for x in s.scrapes], "bytes": [len(x.text or "") for x in s.scrapes],
            "throttled": reads1.get("nr_throttled", 0) - idle1.get("nr_throttled", 0), "load": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--plan", type=Path, required=True, help="a Kubernetes plan: its Cluster")
    ap.add_argument("--tree", default=".", help="the pglab source tree to render the Cluster with")
    ap.add_argument("--kubectl", type=Path)
    ap.add_argument("--turns", type=int, default=4, help="turns of the conditions (forward, then backward, …)")
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="pglab-exporter-cost-"))
    _, k8s = render_plan(Path(args.tree).resolve(), args.plan.resolve(), args.python, work)
    lab = Lab(args.kubectl or lab_kubectl(), Path("/nonexistent"), args.kubeconfig, k8s.namespace, k8s.cluster_name,
              None, True)
    rendered = work / "rendered" / "cluster"
    conditions = [c for c in args.conditions.split(",") if c]
    out: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                                       "load_start": os.getloadavg()},
                           "idle_s": IDLE_S, "reads": READS, "turns": []}
    lab.k("apply", "-f", str(rendered / "00-namespace.yaml"))
    try:
        lab.k("apply", "-f", str(rendered / "08-monitoring.yaml"))  # pglab's queries, as pglab run makes them
        lab.k("apply", "-f", str(rendered / "10-cluster.yaml"))
        lab.k("wait", "-n", lab.ns, "--for=condition=Ready", f"cluster/{lab.cluster}", f"--timeout={WAIT_S}s")
        primary = lab.primary()
        made = json.loads(lab.k("get", "-n", lab.ns, f"cluster/{lab.cluster}", "-o", "jsonpath={.spec.monitoring}")
                          or "{}")
        out["rendered_monitoring"] = made
        read = scraper(args.kubeconfig, lab.ns, [primary], primary).read
        for turn in range(args.turns):
            for condition in conditions if turn % 2 == 0 else conditions[::-1]:
                took = switch(lab, read, primary, condition, made)
                row = {"turn": turn + 1, "switch_s": took, **one_turn(lab, args.kubeconfig, primary, condition)}
                out["turns"].append(row)
                print(f"turn {row['turn']} {condition}: {row['cpu_per_read_s']:.3f} s CPU a read "
                      f"(idle {row['idle_cpu_per_s']:.3f} CPU), read {statistics.median(row['read_wall_s']):.3f} s, "
                      f"{statistics.median(row['bytes']) / 1024:.0f} KiB, throttled {row['throttled']}, "
                      f"load {row['load']:.1f}", flush=True)
                if args.json:
                    args.json.write_text(json.dumps(out, indent=2))
    finally:
        lab.k("delete", "namespace", lab.ns, f"--timeout={WAIT_S}s")
    out["machine"]["load_end"] = os.getloadavg()
    for c in conditions:
        rows = [r for r in out["turns"] if r["condition"] == c and r["cpu_per_read_s"] is not None]
        if rows:
            out.setdefault("medians", {})[c] = {
                "cpu_per_read_s": statistics.median(r["cpu_per_read_s"] for r in rows),
                "read_wall_s": statistics.median(w for r in rows for w in r["read_wall_s"]),
                "kib": statistics.median(b for r in rows for b in r["bytes"]) / 1024, "n": len(rows)}
    print(json.dumps(out.get("medians"), indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
