"""What the Kubernetes lab's nodes cost (issue 32: ``kubelab.py up`` to ready with 4 nodes in 90 s or less; the idle
lab's memory and CPU for 1, 4 and 5 nodes (the default), so that a machine too small knows what fewer save).

Why: every real-cluster test starts the lab once, beside the local tests on the same 2 cores; a node is a kubelet,
a containerd, a kube-proxy and a provisioner of its own, and their housekeeping takes CPU from the runs measured
beside them.

How: for each node count (``--nodes 1 4 5``), taking turns ``--rounds`` times so that a drift of the shared machine
falls on each: start a lab (``KubeLab.start``: every node Ready, CoreDNS and the operator rolled out, the operator's
webhook admitting Clusters), let it idle ``--idle`` seconds, and read over that idle window
- CPU: the CPU time of every process of the lab (the nodes' cgroups, pods included, and the control plane's
  processes: /proc/<pid>/stat) over the window, in cores;
- memory: the resident memory (RSS, /proc/<pid>/status) of the same processes at the window's end;
then stop the lab. Prints medians per node count and writes them to ``--json``.

    sudo .venv/bin/python bench/kube_lab_nodes.py --nodes 1 4 5 --rounds 3 --json bench/measurements/kube-lab-nodes.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools" / "kube-lab"))
import kubelab

TICK = os.sysconf("SC_CLK_TCK")


def lab_pids(lab: kubelab.KubeLab) -> list[int]:
    """Every process of the lab: its nodes' (by cgroup) and the control plane's (by the pids it recorded)."""
    pids = set(kubelab.cgroup_procs(kubelab.CGROUP))
    pids |= {p for name, (p, started) in kubelab._pids(lab.root).items()
             if "/" not in name and kubelab.start_time(p) == started}
    return sorted(pids)


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / TICK


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def one(nodes: int, idle_s: float) -> dict[str, float]:
    lab = kubelab.KubeLab(nodes=nodes)
    try:
        lab.start()
        pids = lab_pids(lab)
        t0, c0 = time.monotonic(), cpu_seconds(pids)
        time.sleep(idle_s)
        pids = lab_pids(lab)  # the same set: an idle lab starts no process
        cores = (cpu_seconds(pids) - c0) / (time.monotonic() - t0)
        return {"ready_s": lab.timings["ready_s"], "image_import_s": lab.timings["image_import_s"],
                "idle_cpu_cores": cores, "idle_rss_mib": rss_mib(pids), "processes": len(pids)}
    finally:
        lab.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 4, 5])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle", type=float, default=60.0, help="seconds of idle lab measured")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows: dict[int, list[dict[str, float]]] = {n: [] for n in args.nodes}
    for rnd in range(args.rounds):
        for n in args.nodes:
            row = one(n, args.idle)
            rows[n].append(row)
            print(f"round {rnd + 1} nodes {n}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    medians: dict[str, Any] = {str(n): {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                               for n, rs in rows.items()}
    print("medians:")
    for n, med in medians.items():
        print(f"  {n} node(s): " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))
    if args.json:
        args.json.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
                                         "idle_s": args.idle, "rounds": rows, "medians": medians}, indent=1))


if __name__ == "__main__":
    main()
