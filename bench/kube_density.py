"""Density on Kubernetes: how many tenants — each a one-instance CloudNativePG Cluster with its own dataset and
pgbench Job — a cluster carries, measured through ``pglab run`` as a user runs it (issue 23, item 1; issue 28).

Needs a running cluster with CloudNativePG: the lab (``sudo .venv/bin/python tools/kube-lab/kubelab.py up``, one at
a time on a machine: take ``flock /tmp/pglab-lab.lock`` around it) or any other. Prints, from the results store:
whether every tenant has results, host TPS, TPS per tenant (median, min–max), the tenants' common window, and the
wall time of the sweep (build, load, run, teardown); writes them to ``--json`` if given.

Where the tenants went and how many more would fit: while pglab runs, the API is asked every few seconds which node
each tenant's instance pod runs on, and, at the moment the most tenants ran, what every pod on each of those nodes
requests against the node's allocatable CPU, memory and pods. A node's room is the tenants its free allocatable
still takes (the scheduler admits a pod only while the requests fit), and the resource that runs out first is what
bounds it. On the lab (tools/kube-lab) each node's cgroup also gives its memory working set (usage less inactive
file pages, as the kubelet counts it) at its peak and its CPU seconds over the sweep.

    .venv/bin/python bench/kube_density.py --kubeconfig /tmp/pglab-kube-lab-XXXX/admin.kubeconfig \\
        --image pglab.local/postgresql:15 --tenants 30 \\
        --database-nodes pglab.io/role=database --client-nodes pglab.io/role=client
"""

from __future__ import annotations

import argparse
import json
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

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
    database: {{anti_affinity: none{database}}}
    clients: {{anti_affinity: none{clients}}}
postgres:
  parameters: {{shared_buffers: 16MB, max_connections: 10}}
dataset: {{scale: 1}}
tenants:
  arrangements:
    - name: n{tenants}
      tiers: [{{name: all, tenants: {tenants}, clients: 1, jobs: 1}}]
run: {{duration: {duration}s}}
"""

NAMESPACE, CLUSTER = "pglab-density", "kd"
LAB_CGROUP = Path("/sys/fs/cgroup")  # tools/kube-lab: every node's processes under <hierarchy>/pglab-kube-lab/<node>
LAB_NODES = "pglab-kube-lab"
UNITS = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "m": 1e-3}


def quantity(text: str) -> float:
    """A Kubernetes quantity as a number (cores, bytes, pods)."""
    for suffix in sorted(UNITS, key=len, reverse=True):
        if suffix and text.endswith(suffix):
            return float(text[: -len(suffix)]) * UNITS[suffix]
    return float(text)


def selector(text: str | None) -> str:
    """``key=value`` as the plan's node_selector (empty: none)."""
    if not text:
        return ""
    key, _, value = text.partition("=")
    return f", node_selector: {{{key}: {value}}}"


class Watch(threading.Thread):
    """Every ``interval`` s until stopped: the nodes of the tenants' instance pods (the largest count seen is kept,
    with every pod's requests at that moment), and on the lab each node's cgroup memory working set (its peak)."""

    def __init__(self, kubeconfig: str, interval: float = 3.0) -> None:
        super().__init__(daemon=True)
        from kubernetes import client, config

        self.api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        self.interval, self.stopped = interval, threading.Event()
        self.best: dict[str, Any] = {"running": 0}
        self.peak_ws: dict[str, float] = {}
        self.errors: Counter[str] = Counter()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.look()
            except Exception as exc:  # an API hiccup on a busy machine: the next look counts
                self.errors[type(exc).__name__] += 1
            for node, ws in lab_working_sets().items():
                self.peak_ws[node] = max(ws, self.peak_ws.get(node, 0.0))

    def look(self) -> None:
        pods = self.api.list_namespaced_pod(NAMESPACE, label_selector="cnpg.io/podRole=instance").items
        tenants = {p.metadata.labels.get("cnpg.io/cluster", ""): p.spec.node_name for p in pods
                   if p.status.phase == "Running" and p.spec.node_name}
        if len(tenants) <= self.best["running"]:
            return
        nodes = sorted(set(tenants.values()))
        requested: dict[str, dict[str, float]] = {n: {"cpu": 0.0, "memory": 0.0, "pods": 0.0} for n in nodes}
        for p in self.api.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,"
                                                      "status.phase!=Failed").items:
            if p.spec.node_name not in requested:
                continue
            r = requested[p.spec.node_name]
            r["pods"] += 1
            for c in p.spec.containers:  # init containers run before and are not counted with them here
                req = (c.resources.requests if c.resources is not None else None) or {}
                r["cpu"] += quantity(req.get("cpu", "0"))
                r["memory"] += quantity(req.get("memory", "0"))
        allocatable = {n.metadata.name: {k: quantity(n.status.allocatable[k]) for k in ("cpu", "memory", "pods")}
                       for n in self.api.list_node().items if n.metadata.name in requested}
        self.best = {"running": len(tenants), "at": time.time(), "tenants": tenants, "requested": requested,
                     "allocatable": allocatable}


def lab_working_sets() -> dict[str, float]:
    """Each lab node's memory working set in bytes (its cgroup's usage less its inactive file pages)."""
    out: dict[str, float] = {}
    base = LAB_CGROUP / "memory" / LAB_NODES
    for d in base.iterdir() if base.is_dir() else []:
        try:
            usage = int((d / "memory.usage_in_bytes").read_text())
            stat = dict(line.split() for line in (d / "memory.stat").read_text().splitlines())
            out[d.name] = usage - int(stat.get("total_inactive_file", 0))
        except (OSError, ValueError):
            continue
    return out


def lab_cpu_seconds() -> dict[str, float]:
    """Each lab node's CPU seconds so far (cpuacct.usage of its cgroup)."""
    out: dict[str, float] = {}
    base = LAB_CGROUP / "cpuacct" / LAB_NODES
    for d in base.iterdir() if base.is_dir() else []:
        try:
            out[d.name] = int((d / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            continue
    return out


def per_node(watch: Watch, cpu: float, memory: float, tps_of: dict[str, float],
             cpu_s: dict[str, float]) -> list[dict[str, Any]]:
    """Each node that ran tenants: how many, what they and the rest request, the room left and what bounds it."""
    best = watch.best
    if not best["running"]:
        return []
    by_node: dict[str, list[str]] = {}
    for cluster, node in best["tenants"].items():
        by_node.setdefault(node, []).append(cluster)
    rows = []
    for node in sorted(by_node):
        alloc, req = best["allocatable"][node], best["requested"][node]
        room = {"cpu": int((alloc["cpu"] - req["cpu"]) / cpu + 1e-9),
                "memory": int((alloc["memory"] - req["memory"]) // memory),
                "pods": int(alloc["pods"] - req["pods"])}
        bound = min(room, key=lambda k: room[k])
        tps = [tps_of[c.removeprefix(f"{CLUSTER}-")] for c in by_node[node] if c.removeprefix(f"{CLUSTER}-") in tps_of]
        rows.append({
            "node": node, "tenants": len(by_node[node]),
            "cpu_allocatable": alloc["cpu"], "cpu_requested": round(req["cpu"], 3),
            "memory_allocatable_mib": round(alloc["memory"] / 2**20),
            "memory_requested_mib": round(req["memory"] / 2**20),
            "pods_allocatable": int(alloc["pods"]), "pods": int(req["pods"]),
            "room": room, "fit": len(by_node[node]) + room[bound], "bound": bound,
            "tps_median": round(statistics.median(tps), 1) if tps else None,
            "working_set_peak_mib": round(watch.peak_ws[node] / 2**20) if node in watch.peak_ws else None,
            "cpu_s": round(cpu_s[node], 1) if node in cpu_s else None})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--image", required=True, help="the PostgreSQL operand image the nodes have")
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--cpu", default="100m", help="each instance's CPU (requests = limits)")
    ap.add_argument("--memory", default="256Mi")
    ap.add_argument("--duration", type=int, default=20)
    ap.add_argument("--database-nodes", metavar="LABEL=VALUE", help="the instances' node selector (default: any node)")
    ap.add_argument("--client-nodes", metavar="LABEL=VALUE", help="the pgbench pods' node selector")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pglab-kdensity-"))
    plan = work / "plan.yaml"
    plan.write_text(PLAN.format(**vars(args), database=selector(args.database_nodes),
                                clients=selector(args.client_nodes)))
    watch = Watch(args.kubeconfig)
    watch.start()
    cpu_before = lab_cpu_seconds()
    started = time.monotonic()
    interrupted: list[int] = []  # Ctrl-C (or timeout's SIGINT to the group) reaches pglab, which cleans up first
    signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    with subprocess.Popen([sys.executable, "-m", "pglab.cli", "run", str(plan), "--results", str(work / "results")],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as pglab:
        stdout, stderr = pglab.communicate()
    proc = subprocess.CompletedProcess(pglab.args, pglab.returncode, stdout, stderr)
    wall = time.monotonic() - started
    cpu_s = {n: s - cpu_before[n] for n, s in lab_cpu_seconds().items() if n in cpu_before}
    watch.stopped.set()
    watch.join(timeout=30)
    out: dict[str, object] = {"tenants": args.tenants, "cpu": args.cpu, "memory": args.memory, "exit": proc.returncode,
                              "wall_s": round(wall, 1), "database_nodes": args.database_nodes,
                              "client_nodes": args.client_nodes, "interrupted": bool(interrupted)}
    print(f"results: {work / 'results'}", file=sys.stderr)
    tps_of: dict[str, float] = {}
    runs: dict[str, float] = {}
    if (work / "results" / "results.db").exists():  # none when pglab stopped before its first sweep
        db = sqlite3.connect(work / "results" / "results.db")
        tps_of = {t: v for t, v in db.execute("SELECT tenant, value FROM tenant_metrics WHERE name = 'tps'")}
        runs = dict(db.execute("SELECT name, value FROM run_metrics"))
    tps = list(tps_of.values())
    out.update({"tenants_with_results": len(tps), "host_tps": runs.get("tps"),
                "tps_per_tenant_median": statistics.median(tps) if tps else None,
                "tps_per_tenant_min": min(tps, default=None), "tps_per_tenant_max": max(tps, default=None),
                "common_window_s": runs.get("common_window_s"), "start_spread_s": runs.get("start_spread_s"),
                "most_running_at_once": watch.best["running"],
                "nodes": per_node(watch, quantity(args.cpu), quantity(args.memory), tps_of, cpu_s),
                "lab_cpu_s": {n: round(s, 1) for n, s in sorted(cpu_s.items())},
                "lab_working_set_peak_mib": {n: round(b / 2**20) for n, b in sorted(watch.peak_ws.items())},
                "watch_errors": dict(watch.errors)})
    if proc.returncode != 0:
        out["error"] = proc.stderr.strip().splitlines()[-1:] or proc.stdout.strip().splitlines()[-1:]
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
