"""Why pglab's TPS on Kubernetes is below ``kubectl cnpg pgbench``'s for the same point (issue 33 item 2).

Why: on the 5-node lab pglab's TPS for a point was 24-32 % below the CloudNativePG plugin's on the same Cluster
spec (``bench/kube_plugin.py``). The two sides differ in what happens around pgbench: pglab reads every instance's
exporter every 2 s during the run (H1), resets the dataset with VACUUM ANALYZE and a CHECKPOINT before each run
(H2), runs pgbench with ``-n -P 1 --progress-timestamp -l`` and takes its TPS over its own window (H3); and the
machine is shared (H4). This measures each difference alone, on one Cluster, with the plugin's own Job.

How, on a running lab (``kubelab.py up``) and a Kubernetes plan (``kduty.yaml`` of docs/benchmarks.md):

1. The plugin's side as ``bench/kube_plugin.py`` makes it: the Namespace and Cluster as ``pglab k8s render`` writes
   them, ``kubectl cnpg pgbench -- --initialize --scale S``. Then, per point and condition, the plugin's run Job
   (``--time T --client C --jobs 1``, waited for, its ``tps =`` line parsed) under one of:

   - ``plain``: as the plugin runs it, one Job after another;
   - ``reset``: pglab's reset just before (TRUNCATE pgbench_history, VACUUM (ANALYZE) of the four tables,
     CHECKPOINT), through ``kubectl exec`` in the primary;
   - ``scrape``: every instance's exporter read every 2 s while the Job runs, as pglab reads them (its own
     ``Scraper``, through the API server's pod proxy);
   - ``options``: pglab's pgbench options added (``-n -M simple -P 1 --progress-timestamp -l``, the log in an
     emptyDir);
   - ``novacuum``, ``log``, ``progress``: each of those options alone (``-n``: no vacuum of the small tables
     before the run; ``-l``; ``-P 1 --progress-timestamp``);
   - ``all``: reset, scrape and options together.

   The conditions take turns (A B C D E, then E D C B A, …). Around each Job the primary pod's CPU cgroup is read on
   this machine (CPU seconds used, throttled periods): how much of its 0.5 CPU each condition leaves to pgbench.
2. The namespace deleted, then ``pglab run`` of the plan with its probes on and of the same plan with
   ``probes: {enabled: false}`` (nothing else changed), in turns (on, off, off, on, …); per run pglab's window TPS
   and pgbench's own ``tps =`` line from the run's folder.

    .venv/bin/python bench/kube_gap.py --kubeconfig LAB/admin.kubeconfig --plan kduty.yaml --if-not-present \\
        --cycles 4 --sweeps 2 --json out.json
    .venv/bin/python bench/kube_gap.py --report out.json    # the tables of docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kube_plugin import CACHE, CNPG_VERSION, WAIT_S, lab_kubectl, pglab_sweep, render_plan

CONDITIONS = ("plain", "reset", "scrape", "options", "novacuum", "log", "progress", "all")
LOG_DIR = "/pgbench-log"
_LOG = ["-l", f"--log-prefix={LOG_DIR}/pgbench_log"]
_PROGRESS = ["-P", "1", "--progress-timestamp"]
OPTIONS: dict[str, tuple[list[str], list[str]]] = {  # pgbench's options before and after the plugin's own
    "options": (["-n", "-M", "simple", *_PROGRESS], _LOG), "all": (["-n", "-M", "simple", *_PROGRESS], _LOG),
    "novacuum": (["-n"], []), "log": ([], _LOG), "progress": (_PROGRESS, [])}
SCRAPE_S = 2.0  # pglab's default (drivers/kubernetes.py, scrape_s)
RESET = ("TRUNCATE pgbench_history",  # targets/kubernetes/scripts.py RESET_SQL, then its CHECKPOINT
         "VACUUM (ANALYZE) pgbench_branches, pgbench_tellers, pgbench_accounts, pgbench_history", "CHECKPOINT")


class Lab:
    """kubectl and the plugin against one namespace and Cluster."""

    def __init__(self, kubectl: Path, plugin: Path, kubeconfig: str, namespace: str, cluster: str,
                 selector: str | None, if_not_present: bool):
        self.kubectl, self.plugin, self.kubeconfig = kubectl, plugin, kubeconfig
        self.ns, self.cluster, self.selector, self.if_not_present = namespace, cluster, selector, if_not_present

    def k(self, *args: str, stdin: str | None = None) -> str:
        return subprocess.run([str(self.kubectl), "--kubeconfig", self.kubeconfig, *args], check=True, input=stdin,
                              capture_output=True, text=True, timeout=WAIT_S + 60).stdout

    def primary(self) -> str:
        return self.k("get", "-n", self.ns, f"cluster/{self.cluster}", "-o", "jsonpath={.status.currentPrimary}")

    def instances(self) -> list[str]:
        out = self.k("get", "-n", self.ns, "pods", "-l", f"cnpg.io/cluster={self.cluster},cnpg.io/podRole=instance",
                     "-o", "jsonpath={.items[*].metadata.name}")
        return sorted(out.split())

    def cpu_stat(self, pod: str) -> dict[str, int]:
        """The pod's CPU cgroup (v1) as the lab's host sees it (the lab's nodes are this machine's cgroups; the
        image has no cat): cpuacct.usage (ns) and cpu.stat (nr_periods, nr_throttled, throttled_time ns)."""
        uid = self.k("get", "-n", self.ns, f"pod/{pod}", "-o", "jsonpath={.metadata.uid}")
        found = sorted(Path("/sys/fs/cgroup/cpu").glob(f"pglab-kube-lab/*/kubepods/**/pod{uid}"))
        if not found:
            print(f"cpu cgroup of {pod} not found", flush=True)
            return {}
        text = (found[0] / "cpu.stat").read_text()
        stat = {a: int(b) for a, b in (line.split() for line in text.splitlines() if len(line.split()) == 2)}
        acct = Path("/sys/fs/cgroup/cpuacct") / found[0].relative_to("/sys/fs/cgroup/cpu")  # its own mount here
        stat["usage_ns"] = int((acct / "cpuacct.usage").read_text())
        return stat

    def psql(self, pod: str, database: str, *statements: str) -> str:
        args = ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", database]
        for s in statements:
            args += ["-c", s]
        return self.k("exec", "-n", self.ns, pod, "-c", "postgres", "--", *args)

    def pgbench_job(self, job: str, args: list[str], log_volume: bool = False) -> dict[str, Any]:
        """The plugin's Job (``--dry-run``), IfNotPresent when asked, an emptyDir at LOG_DIR with ``log_volume``."""
        sel = ["--node-selector", self.selector] if self.selector else []
        text = subprocess.run([str(self.plugin), "pgbench", self.cluster, "--kubeconfig", self.kubeconfig, "-n",
                               self.ns, "--job-name", job, *sel, "--dry-run", "--", *args], check=True,
                              capture_output=True, text=True, timeout=120).stdout
        body: dict[str, Any] = yaml.safe_load(text)
        pod = body["spec"]["template"]["spec"]
        for c in pod["containers"]:
            if self.if_not_present:
                c["imagePullPolicy"] = "IfNotPresent"
            if log_volume:
                c.setdefault("volumeMounts", []).append({"name": "pgbench-log", "mountPath": LOG_DIR})
        if log_volume:
            pod.setdefault("volumes", []).append({"name": "pgbench-log", "emptyDir": {}})
        return body

    def run_job(self, body: dict[str, Any]) -> str:
        name = body["metadata"]["name"]
        self.k("create", "-f", "-", stdin=json.dumps(body))
        self.k("wait", "-n", self.ns, "--for=condition=complete", f"job/{name}", f"--timeout={WAIT_S}s")
        return self.k("logs", "-n", self.ns, f"job/{name}")


def scraper(kubeconfig: str, namespace: str, pods: list[str], primary: str) -> Any:
    """pglab's own exporter reader (targets/kubernetes/exporter.py), reading through the API server's pod proxy
    as pglab's orchestrator does."""
    from kubernetes import client, config

    from pglab.targets.kubernetes import exporter

    api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))

    def read(pod: str) -> str:
        resp = api.connect_get_namespaced_pod_proxy_with_path(f"{pod}:9187", namespace, "metrics",
                                                              _preload_content=False, _request_timeout=10)
        return bytes(resp.data).decode("utf-8", errors="replace")

    return exporter.Scraper(read, pods, SCRAPE_S, primary)


def one_run(lab: Lab, condition: str, clients: int, duration: int, n: int, database: str) -> dict[str, Any]:
    OPTIONS.setdefault(condition, ([], []))
    primary = lab.primary()
    fig: dict[str, Any] = {"condition": condition, "clients": clients, "primary": primary,
                           "load_before": os.getloadavg()[0]}
    if condition in ("reset", "all"):
        t = time.time()
        lab.psql(primary, database, *RESET)
        fig["reset_s"] = time.time() - t
    args = [*OPTIONS[condition][0], "--time", str(duration), "--client", str(clients), "--jobs", "1",
            *OPTIONS[condition][1]]
    body = lab.pgbench_job(f"{lab.cluster}-gap-{n}-{condition}-c{clients}", args,
                           log_volume=condition in ("options", "log", "all"))
    reader = scraper(lab.kubeconfig, lab.ns, lab.instances(), primary) if condition in ("scrape", "all") else None
    cpu0 = lab.cpu_stat(primary)
    t0 = fig["started"] = time.time()
    if reader is not None:
        reader.start()
    try:
        log = lab.run_job(body)
    finally:
        if reader is not None:
            reader.stop()
    fig["job_s"] = time.time() - t0
    cpu1 = lab.cpu_stat(primary)
    fig["primary_cpu"] = {k: cpu1[k] - cpu0.get(k, 0) for k in cpu1}
    found = re.search(r"^tps = ([0-9.]+)", log, re.M)
    fig["tps"] = float(found[1]) if found else None
    lat = re.search(r"^latency average = ([0-9.]+) ms", log, re.M)
    fig["latency_ms"] = float(lat[1]) if lat else None
    txs = re.search(r"^number of transactions actually processed: ([0-9]+)", log, re.M)
    fig["transactions"] = int(txs[1]) if txs else None
    if reader is not None:
        took = [s.took for s in reader.scrapes]
        fig["scrapes"] = {"n": len(took), "errors": len(reader.errors()),
                          "took_median_s": statistics.median(took) if took else None}
    fig["load_after"] = os.getloadavg()[0]
    if fig["tps"] is None:
        fig["log_tail"] = log[-2000:]
    return fig


def plugin_part(lab: Lab, rendered: Path, scale: int, points: list[int], duration: int, cycles: int,
                conditions: list[str], until: float) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": []}
    t0 = time.time()
    lab.k("apply", "-f", str(rendered / "00-namespace.yaml"))
    lab.k("apply", "-f", str(rendered / "10-cluster.yaml"))
    lab.k("wait", "-n", lab.ns, "--for=condition=Ready", f"cluster/{lab.cluster}", f"--timeout={WAIT_S}s")
    out["cluster_s"] = time.time() - t0
    database = lab.k("get", "-n", lab.ns, f"cluster/{lab.cluster}", "-o",
                     "jsonpath={.spec.bootstrap.initdb.database}") or "app"
    log = lab.run_job(lab.pgbench_job(f"{lab.cluster}-init", ["--initialize", "--scale", str(scale)]))
    out["init_log"] = log[-1500:]
    n = 0
    try:
        for cycle in range(cycles):
            order = conditions if cycle % 2 == 0 else conditions[::-1]
            for clients in (points if cycle % 2 == 0 else points[::-1]):
                for condition in order:
                    if time.time() + duration + 15 > until:
                        out["stopped"] = f"deadline, cycle {cycle + 1}"
                        return out
                    n += 1
                    try:
                        fig = one_run(lab, condition, clients, duration, n, database)
                    except subprocess.CalledProcessError as exc:  # noted; the next run may still work
                        print(f"cycle {cycle + 1} c{clients} {condition}: failed: {exc} {exc.stderr}", flush=True)
                        out["runs"].append({"condition": condition, "clients": clients, "cycle": cycle + 1,
                                            "tps": None, "error": f"{exc} {exc.stderr}"[-1000:]})
                        continue
                    fig["cycle"] = cycle + 1
                    out["runs"].append(fig)
                    print(f"cycle {cycle + 1} c{clients} {condition}: tps {fig['tps']} job {fig['job_s']:.1f} s "
                          f"primary cpu {fig['primary_cpu'].get('usage_ns', 0) / 1e9:.1f} s throttled "
                          f"{fig['primary_cpu'].get('nr_throttled', 0)}/{fig['primary_cpu'].get('nr_periods', 0)}"
                          f"{' scrapes ' + str(fig['scrapes']) if 'scrapes' in fig else ''}; load "
                          f"{fig['load_before']:.1f} → {fig['load_after']:.1f}", flush=True)
    finally:
        t = time.time()
        lab.k("delete", "namespace", lab.ns, f"--timeout={WAIT_S}s")
        out["namespace_delete_s"] = time.time() - t
    return out


def pgbench_lines(results: Path) -> list[dict[str, Any]]:
    """pgbench's own ``tps =`` line of every run pglab kept (its run folders' logs), by folder."""
    rows = []
    for f in sorted(results.rglob("*")):
        if not f.is_file() or f.stat().st_size > 5_000_000 or "pgbench_log" in f.name:
            continue
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        if found := re.search(r"^tps = ([0-9.]+)", text, re.M):
            rows.append({"file": str(f.relative_to(results)), "tps": float(found[1])})
    return rows


def window_rows(results: Path) -> list[dict[str, Any]]:
    db = sqlite3.connect(results / "results.db")
    try:
        db.row_factory = sqlite3.Row
        runs = [dict(r) for r in db.execute("SELECT r.*, p.axes FROM runs r JOIN points p ON p.id = r.point_id "
                                            "ORDER BY r.started")]
        for r in runs:
            r["clients"] = json.loads(r["axes"]).get("clients")
            r["metrics"] = dict(db.execute("SELECT name, value FROM run_metrics WHERE run_id = ?", (r["id"],)))
        return runs
    finally:
        db.close()


def pglab_part(tree: Path, plan: Path, work: Path, sweeps: int, python: str, until: float,
               sweep_s: float) -> list[dict[str, Any]]:
    raw = yaml.safe_load(plan.read_text())
    plans = {}
    for probes in (True, False):
        body = {**raw, "probes": {**raw.get("probes", {}), "enabled": probes}}
        plans[probes] = work / f"plan-probes-{'on' if probes else 'off'}.yaml"
        plans[probes].write_text(yaml.safe_dump(body, sort_keys=False))
    order = [True, False, False, True] * sweeps
    out = []
    for i, probes in enumerate(order[:2 * sweeps]):
        if time.time() + sweep_s > until:
            print(f"pglab sweep {i + 1}: deadline, stopped", flush=True)
            break
        results = work / f"pglab-{i + 1}-probes-{'on' if probes else 'off'}"
        load = os.getloadavg()[0]
        try:
            fig = pglab_sweep(tree, plans[probes], results, python)
        except SystemExit as exc:  # a failed sweep is noted; the next one may still run
            print(f"pglab sweep {i + 1}: {exc}", flush=True)
            out.append({"probes": probes, "failed": str(exc)[-2000:], "results": str(results)})
            continue
        fig.update(probes=probes, load_before=load, load_after=os.getloadavg()[0], results=str(results),
                   pgbench_lines=pgbench_lines(results), runs=window_rows(results))
        out.append(fig)
        print(f"pglab sweep {i + 1} probes {'on' if probes else 'off'}: wall {fig['wall_s']:.1f} s, window tps "
              f"{[round(t, 1) for t in fig['tps']]}, pgbench lines {[r['tps'] for r in fig['pgbench_lines']]}; "
              f"load {load:.1f} → {fig['load_after']:.1f}", flush=True)
    return out


def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f}" if xs else "–"


def report(data: dict[str, Any]) -> str:
    """Markdown tables from a ``--json`` file: per point and condition the plugin's TPS (median, range), its ratio
    to plain (of the medians; and the median of the ratios within a cycle, which the machine's drift affects
    less), the primary's CPU; then pglab's sweeps by probes on and off."""
    runs = [r for r in data["plugin_side"]["runs"] if r.get("tps")]
    lines = ["| clients | condition | n | TPS median (range) | / plain (medians) | / plain (same cycle, median) | "
             "primary CPU s per run | primary CPU ms per transaction | throttled periods | load (1 min) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for clients in data["points"]:
        mine = [r for r in runs if r["clients"] == clients]
        plain = {r["cycle"]: r["tps"] for r in mine if r["condition"] == "plain"}
        base = statistics.median(plain.values()) if plain else None
        for cond in dict.fromkeys(r["condition"] for r in mine):
            rs = [r for r in mine if r["condition"] == cond]
            tps = [r["tps"] for r in rs]
            paired = [r["tps"] / plain[r["cycle"]] for r in rs if r["cycle"] in plain]
            cpu = [r["primary_cpu"]["usage_ns"] / 1e9 for r in rs if "usage_ns" in r.get("primary_cpu", {})]
            per_tx = [r["primary_cpu"]["usage_ns"] / 1e6 / r["transactions"] for r in rs
                      if "usage_ns" in r.get("primary_cpu", {}) and r.get("transactions")]
            thr = [r["primary_cpu"]["nr_throttled"] for r in rs if "nr_throttled" in r.get("primary_cpu", {})]
            lines.append(f"| {clients} | {cond} | {len(tps)} | {_med(tps)} ({min(tps):.1f}–{max(tps):.1f}) | "
                         f"{statistics.median(tps) / base:.2f} | "
                         f"{statistics.median(paired):.2f} | {_med(cpu)} | "
                         f"{statistics.median(per_tx):.2f} | {_med([float(t) for t in thr])} | "
                         f"{_med([r['load_before'] for r in rs])} |" if base and paired and per_tx else
                         f"| {clients} | {cond} | {len(tps)} | {_med(tps)} | | | | | | |")
    lines += ["", "| pglab sweep | probes | wall s | window TPS (c1, c1, c4, c4 as run) | pgbench's `tps =` lines |"
              " load |", "|---|---|---|---|---|---|"]
    for i, sw in enumerate(data.get("pglab_sweeps", [])):
        if "failed" in sw:
            lines.append(f"| {i + 1} | {'on' if sw['probes'] else 'off'} | failed | | | |")
            continue
        win = ", ".join(f"c{r['clients']} {r['metrics'].get('tps', 0):.1f}" for r in sw["runs"])
        pg = ", ".join(f"{r['tps']:.1f}" for r in sw["pgbench_lines"])
        lines.append(f"| {i + 1} | {'on' if sw['probes'] else 'off'} | {sw['wall_s']:.1f} | {win} | {pg} | "
                     f"{sw['load_before']:.1f} → {sw['load_after']:.1f} |")
    for clients in data["points"]:
        for probes in (True, False):
            tps = [r["metrics"]["tps"] for sw in data.get("pglab_sweeps", []) if sw.get("probes") is probes
                   for r in sw.get("runs", []) if r["clients"] == clients and r["metrics"].get("tps")]
            if tps:
                lines.append(f"pglab c{clients} probes {'on' if probes else 'off'}: median {_med(tps)} "
                             f"({min(tps):.1f}–{max(tps):.1f}, n {len(tps)})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", type=Path, help="print the tables of a finished run's JSON and stop (no lab needed)")
    ap.add_argument("--kubeconfig")
    ap.add_argument("--plan", type=Path, help="a Kubernetes plan: its points and duration")
    ap.add_argument("--tree", default=".", help="the pglab source tree to run")
    ap.add_argument("--kubectl", type=Path)
    ap.add_argument("--plugin", type=Path, default=CACHE / "kubectl-cnpg" / f"kubectl-cnpg-{CNPG_VERSION}")
    ap.add_argument("--if-not-present", action="store_true",
                    help="the plugin's Job with imagePullPolicy IfNotPresent (a lab whose images are imported)")
    ap.add_argument("--cycles", type=int, default=4, help="turns of the conditions (forward, then backward, …)")
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument("--sweeps", type=int, default=2, help="pglab sweeps per side (probes on, probes off)")
    ap.add_argument("--plugin-until", help="HH:MM UTC: no plugin run starts that would end after it")
    ap.add_argument("--until", help="HH:MM UTC: no pglab sweep starts that would end after it (see --sweep-s)")
    ap.add_argument("--sweep-s", type=float, default=260.0, help="a pglab sweep's expected wall time")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--keep", type=Path, help="keep pglab's results folders here")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.report is not None:
        print(report(json.loads(args.report.read_text())))
        return 0
    if args.kubeconfig is None or args.plan is None:
        ap.error("--kubeconfig and --plan are needed to measure (or --report JSON to print a run's tables)")

    def deadline(hhmm: str | None) -> float:
        if not hhmm:
            return float("inf")
        today = time.strftime("%Y-%m-%d", time.gmtime())
        return float(subprocess.run(["date", "-u", "-d", f"{today} {hhmm}", "+%s"], check=True, capture_output=True,
                                    text=True).stdout)

    tree = Path(args.tree).resolve()
    work = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="pglab-gap-"))
    work.mkdir(parents=True, exist_ok=True)
    plan = args.plan.resolve()
    p, k8s = render_plan(tree, plan, args.python, work)
    if p.run.measured_seconds is None:
        raise SystemExit("--plan: give run.duration in seconds")
    duration = round(p.run.measured_seconds)
    points = list(p.matrix.clients or [1])
    selector = ",".join(f"{a}={b}" for a, b in sorted(k8s.clients.node_selector.items())) or None
    lab = Lab(args.kubectl or lab_kubectl(), args.plugin, args.kubeconfig, k8s.namespace, k8s.cluster_name, selector,
              args.if_not_present)
    machine = {"cpus": os.cpu_count(), "kernel": platform.release(), "load_start": os.getloadavg(),
               "cpu_model": next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                                  .splitlines() if line.startswith("model name")), "?")}
    started = time.time()
    conditions = [c for c in args.conditions.split(",") if c]
    plugin = plugin_part(lab, work / "rendered" / "cluster", p.dataset.scale, points, duration, args.cycles,
                         conditions, deadline(args.plugin_until))
    if args.json:  # the plugin's side kept even if pglab's fails
        args.json.write_text(json.dumps({"machine": machine, "plugin_side": plugin}, indent=2, default=str))
    sweeps = pglab_part(tree, plan, work, args.sweeps, args.python, deadline(args.until), args.sweep_s)
    machine["load_end"] = os.getloadavg()
    summary: dict[str, Any] = {}
    for clients in points:
        for c in conditions:
            tps = [r["tps"] for r in plugin["runs"] if r["clients"] == clients and r["condition"] == c and r["tps"]]
            if tps:
                summary[f"plugin c{clients} {c}"] = {"median": statistics.median(tps), "min": min(tps),
                                                     "max": max(tps), "n": len(tps)}
    for s in sweeps:
        for r in s.get("runs", []):
            key = f"pglab c{r.get('clients', '?')} probes {'on' if s['probes'] else 'off'}"
            if (tps := r["metrics"].get("tps")) is not None:
                summary.setdefault(key, {"tps": []})["tps"].append(tps)
    for k, v in summary.items():
        print(f"{k}: {v}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "plugin_version": CNPG_VERSION, "points": points,
                                         "duration_s": duration, "command": shlex.join(sys.argv),
                                         "wall_s": time.time() - started, "plugin_side": plugin,
                                         "pglab_sweeps": sweeps, "summary": summary}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
