"""pglab against CloudNativePG's own ``kubectl cnpg pgbench`` for the same point on the same Cluster spec (issue 33
item 2): the wall time end to end, from nothing in the namespace to the TPS in hand, each side its own way.

Why: a user who only wants one pgbench number on a CloudNativePG Cluster can have it from the operator's kubectl
plugin. pglab does more per run (the exporters and the disks read, the standbys' replay waited for, the figures
stored); this says what that costs in wall time, for one point and for a small sweep.

How, on a running lab (``kubelab.py up``) and a plan with ``target.kubernetes`` (one point, or a few, no storage
phase):

- pglab: ``pglab run PLAN`` from ``--tree`` (its ``src/`` on PYTHONPATH), the process's wall time: the Cluster, the
  dataset, every run with its probes and summary, the store, the teardown.
- the plugin: the Namespace and the Cluster as ``pglab k8s render`` writes them for the plan (the same spec), applied
  with kubectl; ``kubectl wait`` for the Cluster's Ready condition; ``kubectl cnpg pgbench -- --initialize --scale S``
  and ``kubectl wait`` for its Job; then per point and repeat ``kubectl cnpg pgbench -- --time T --client C --jobs J``,
  waited for, its log read (the TPS parsed); then the namespace deleted. The plugin's Job pulls its image Always:
  on a lab whose nodes have the images imported and no registry, ``--if-not-present`` creates the Job the plugin
  prints (``--dry-run``) with kubectl, its pull policy IfNotPresent. Its wall time is given with and without the
  wait for the namespace's deletion (pglab's teardown waits for the instance pods only).

The sides take turns (``--rounds``: A B, then B A, …). The plugin is built by ``--build`` from the operator's Go
module through the Go module proxy (the version the lab's operator runs), with the lab's Go toolchain, cached under
``~/.cache/pglab/kubectl-cnpg``.

    .venv/bin/python bench/kube_plugin.py --kubeconfig LAB/admin.kubeconfig --plan point.yaml --build --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CNPG_VERSION = "1.28.2"  # tools/kube-lab/build.sh's CNPG_VERSION: the operator the lab runs
CACHE = Path.home() / ".cache" / "pglab"
WAIT_S = 900  # every kubectl wait's deadline


def build_plugin(go: Path | None) -> Path:
    """kubectl-cnpg of the lab's operator version, built once from the module (proxy only) and cached."""
    out = CACHE / "kubectl-cnpg" / f"kubectl-cnpg-{CNPG_VERSION}"
    if out.is_file():
        return out
    if go is None:
        found = sorted((CACHE / "kube-lab" / "go" / "mod" / "golang.org").glob("toolchain@*/bin/go"))
        if not found:
            raise SystemExit("no Go toolchain: give --go (the one setup.sh finds or installs)")
        go = found[0]
    work = CACHE / "kubectl-cnpg" / "build"
    work.mkdir(parents=True, exist_ok=True)
    (work / "go.mod").write_text(f"module pglab.local/kubectlcnpg\n\ngo 1.25.0\n\n"
                                 f"require github.com/cloudnative-pg/cloudnative-pg v{CNPG_VERSION}\n")
    env = {**os.environ, "GOPATH": str(CACHE / "kube-lab" / "go"), "GOMODCACHE": str(CACHE / "kube-lab" / "go" / "mod"),
           "GOCACHE": str(work.parent / "gocache"), "GOFLAGS": "-buildvcs=false -modcacherw", "GOTOOLCHAIN": "local",
           "CGO_ENABLED": "0"}
    pkg = "github.com/cloudnative-pg/cloudnative-pg/cmd/kubectl-cnpg"
    subprocess.run([str(go), "get", f"{pkg}@v{CNPG_VERSION}"], cwd=work, env=env, check=True)
    subprocess.run([str(go), "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out), pkg], cwd=work, env=env,
                   check=True)
    return out


def lab_kubectl() -> Path:
    found = sorted((CACHE / "kube-lab").glob("bin-*/kubectl"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit("no kubectl in the lab's cache: give --kubectl")
    return found[-1]


def pglab_sweep(tree: Path, plan: Path, results: Path, python: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    t0 = time.time()
    proc = subprocess.run([python, "-m", "pglab.cli", "run", str(plan), "--results", str(results)], env=env,
                          capture_output=True, text=True, cwd=tree)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"pglab run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    db = sqlite3.connect(results / "results.db")
    try:
        phases = dict(db.execute("SELECT name, sum(ended - started) FROM phases GROUP BY name").fetchall())
        # the plugin's side stops its clock at its last TPS, before deleting anything: pglab's at its last row
        last_row = db.execute("SELECT max(ended) FROM phases WHERE name = 'record'").fetchone()[0]
        tps = [r[0] for r in db.execute("SELECT m.value FROM runs r JOIN run_metrics m ON m.run_id = r.id "
                                        "WHERE m.name = 'tps' ORDER BY r.started")]
    except sqlite3.OperationalError:
        phases, tps, last_row = {}, [], None
    finally:
        db.close()
    return {"wall_s": wall, "to_last_result_s": last_row - t0 if last_row else None, "phases": phases, "tps": tps}


def plugin_sweep(kubectl: Path, plugin: Path, kubeconfig: str, rendered: Path, namespace: str, cluster: str,
                 node_selector: str | None, scale: int, points: list[tuple[int, int]], duration: int,
                 repeats: int, if_not_present: bool) -> dict[str, Any]:
    def k(*args: str) -> str:
        return subprocess.run([str(kubectl), "--kubeconfig", kubeconfig, *args], check=True, capture_output=True,
                              text=True, timeout=WAIT_S + 60).stdout

    def pgbench(job: str, *args: str) -> str:
        # the plugin's Job pulls its image Always; the lab's nodes have it imported and no registry to pull from:
        # its Job as the plugin makes it (--dry-run), IfNotPresent, created by kubectl (one API call, as the plugin)
        sel = ["--node-selector", node_selector] if node_selector else []
        body = subprocess.run([str(plugin), "pgbench", cluster, "--kubeconfig", kubeconfig, "-n", namespace,
                               "--job-name", job, *sel, "--dry-run", "--", *args], check=True, capture_output=True,
                              text=True, timeout=120).stdout
        if if_not_present:
            body = body.replace("imagePullPolicy: Always", "imagePullPolicy: IfNotPresent")
        subprocess.run([str(kubectl), "--kubeconfig", kubeconfig, "create", "-f", "-"], input=body, check=True,
                       capture_output=True, text=True, timeout=120)
        k("wait", "-n", namespace, "--for=condition=complete", f"job/{job}", f"--timeout={WAIT_S}s")
        return k("logs", "-n", namespace, f"job/{job}")

    deadline = time.monotonic() + WAIT_S  # pglab's teardown leaves its namespace going: gone first, not counted
    while subprocess.run([str(kubectl), "--kubeconfig", kubeconfig, "get", "namespace", namespace],
                         capture_output=True, timeout=60).returncode == 0:
        if time.monotonic() > deadline:
            raise SystemExit(f"namespace {namespace} still there after {WAIT_S} s")
        time.sleep(1)
    marks: dict[str, float] = {}
    t0 = time.time()
    k("apply", "-f", str(rendered / "00-namespace.yaml"))
    k("apply", "-f", str(rendered / "10-cluster.yaml"))
    k("wait", "-n", namespace, "--for=condition=Ready", f"cluster/{cluster}", f"--timeout={WAIT_S}s")
    marks["cluster_s"] = time.time() - t0
    pgbench(f"{cluster}-init", "--initialize", "--scale", str(scale))
    marks["dataset_s"] = time.time() - t0 - marks["cluster_s"]
    tps = []
    for r in range(repeats):
        for clients, jobs in points:
            log = pgbench(f"{cluster}-run-c{clients}-j{jobs}-{r + 1}", "--time", str(duration), "--client",
                          str(clients), "--jobs", str(jobs))
            found = re.search(r"^tps = ([0-9.]+)", log, re.M)
            tps.append(float(found[1]) if found else None)
    results_s = time.time() - t0
    t1 = time.time()
    k("delete", "namespace", namespace, f"--timeout={WAIT_S}s")  # waits until it is gone
    return {"wall_s": results_s, "wall_with_namespace_delete_s": results_s + time.time() - t1,
            "namespace_delete_s": time.time() - t1, **marks, "tps": tps}


def render_plan(tree: Path, plan: Path, python: str, work: Path) -> tuple[Any, Any]:
    """The plan as the tree reads it (its Kubernetes target) and rendered by the tree's `pglab k8s render` into
    ``work/rendered``."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    subprocess.run([python, "-m", "pglab.cli", "k8s", "render", str(plan), "-o", str(work / "rendered")],
                   env=env, check=True, capture_output=True)
    sys.path.insert(0, str(tree / "src"))
    from pglab.plan.load import parse_plan  # the tree's own reading of the plan

    p = parse_plan(plan.read_text(), base_dir=plan.parent)
    k8s = p.target.kubernetes
    assert k8s is not None
    return p, k8s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--plan", type=Path, required=True, help="a Kubernetes plan: its points, duration, repeats")
    ap.add_argument("--tree", default=".", help="the pglab source tree to run")
    ap.add_argument("--kubectl", type=Path)
    ap.add_argument("--plugin", type=Path, help="kubectl-cnpg (default: the cached build, see --build)")
    ap.add_argument("--build", action="store_true", help="build kubectl-cnpg if it is not cached yet")
    ap.add_argument("--go", type=Path, help="the go to build it with (default: the lab's toolchain)")
    ap.add_argument("--if-not-present", action="store_true",
                    help="the plugin's Job with imagePullPolicy IfNotPresent (a lab whose images are imported)")
    ap.add_argument("--rounds", type=int, default=1, help="turns of both sides: A B, then B A, …")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    tree = Path(args.tree).resolve()
    plugin = args.plugin or (build_plugin(args.go) if args.build else
                             CACHE / "kubectl-cnpg" / f"kubectl-cnpg-{CNPG_VERSION}")
    kubectl = args.kubectl or lab_kubectl()
    work = Path(tempfile.mkdtemp(prefix="pglab-plugin-"))
    plan = args.plan.resolve()
    p, k8s = render_plan(tree, plan, args.python, work)
    points = [(c, j) for c in p.matrix.clients or [1] for j in p.matrix.jobs or [1]]
    if p.run.measured_seconds is None or not isinstance(p.run.repeats, int):
        raise SystemExit("--plan: give run.duration in seconds and a fixed number of repeats")
    duration, repeats = round(p.run.measured_seconds), p.run.repeats
    selector = ",".join(f"{a}={b}" for a, b in sorted(k8s.clients.node_selector.items())) or None
    out: dict[str, list[dict[str, Any]]] = {"pglab": [], "plugin": []}
    for r in range(args.rounds):
        for side in (("pglab", "plugin") if r % 2 == 0 else ("plugin", "pglab")):
            load = os.getloadavg()[0]
            if side == "pglab":
                fig = pglab_sweep(tree, plan, work / f"pglab-{r}", args.python)
            else:
                fig = plugin_sweep(kubectl, plugin, args.kubeconfig, work / "rendered" / "cluster", k8s.namespace,
                                   k8s.cluster_name, selector, p.dataset.scale, points, duration, repeats,
                                   args.if_not_present)
            fig["load_before"], fig["load_after"] = load, os.getloadavg()[0]
            out[side].append(fig)
            print(f"round {r + 1} {side}: wall {fig['wall_s']:.1f} s"
                  + (f" ({fig['wall_with_namespace_delete_s']:.1f} s with the namespace's deletion; Cluster "
                     f"{fig['cluster_s']:.1f} s, dataset {fig['dataset_s']:.1f} s)" if side == "plugin" else
                     f" ({fig['to_last_result_s']:.1f} s to its last run's row; phases: "
                     + ", ".join(f"{n} {s:.1f}" for n, s in sorted(fig["phases"].items())) + ")")
                  + f"; tps {fig['tps']}; load average {fig['load_before']:.1f} → {fig['load_after']:.1f}",
                  flush=True)
    med = {side: statistics.median(f["wall_s"] for f in figs) for side, figs in out.items()}
    # like for like: each side to its last result (pglab's last row, the plugin's last TPS), and each side with
    # what it created gone (pglab's whole process, the plugin's namespace deleted)
    med["pglab_to_last_result"] = statistics.median(f["to_last_result_s"] for f in out["pglab"])
    med["plugin_with_namespace_delete"] = statistics.median(f["wall_with_namespace_delete_s"] for f in out["plugin"])
    print(f"medians: pglab {med['pglab']:.1f} s, plugin {med['plugin']:.1f} s; pglab / plugin "
          f"{med['pglab'] / med['plugin']:.2f}")
    print(f"to the last result: pglab {med['pglab_to_last_result']:.1f} s, plugin {med['plugin']:.1f} s "
          f"({med['pglab_to_last_result'] / med['plugin']:.2f}); with what each created gone: pglab "
          f"{med['pglab']:.1f} s, plugin {med['plugin_with_namespace_delete']:.1f} s "
          f"({med['pglab'] / med['plugin_with_namespace_delete']:.2f})")
    if args.json:
        args.json.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
                                         "plugin": CNPG_VERSION, "points": points, "duration_s": duration,
                                         "repeats": repeats, "sides": out, "medians": med}, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
