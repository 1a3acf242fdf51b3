"""Studies 000 and 003 on the multi-node lab (issue 28): each study's example plan run as written at its smallest
(kube_lab_support.STUDY_EDITS: sizes only, and for 003 the lab's own directory of each node's disk as its host
path), and the table the study published checked against what the run stored and against fio's and pgbench's own
outputs kept as artifacts.

- 000 (examples/study-cpu-sync-scaling.yaml): 3 instances on separate database nodes, each with a WAL volume,
  pgbench on a client node; CPU 0.5 → 1 core (a rolling update between the steps) × TPC-B-like / select-only ×
  synchronous_commit local / on / remote_apply; per run the database and the volumes' disk figures in one window.
- 003 (examples/study-fio-then-pgbench.yaml): fio per database node (8 KiB random and sequential reads and writes,
  WAL-like fdatasync writes) in the pod on the instances' class and on the node's own directory of the same disk,
  side by side (the study's bare metal vs in-pod); then pgbench from a client node against 3 instances.

The two sweeps run side by side on the lab (two namespaces, two pglab processes), as two teams would share a
cluster: their Clusters are each other's neighbours, so no figure here is compared with another run's, only with
its own oracles. That halves what the two add to the test command's Kubernetes track.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_lab_support import kubelab, namespace_gone, pgbench_tps, study_plan
from pglab.store.sqlite import Store

pytestmark = pytest.mark.kube_lab

CPU_SYNC = "study-cpu-sync-scaling.yaml"
FIO_THEN_PGBENCH = "study-fio-then-pgbench.yaml"


@dataclass
class Study:
    plan: dict[str, Any]
    results: Path
    stderr: str
    seconds: float


def report(results: Path, *args: str) -> list[dict[str, str]]:
    """``pglab report RESULTS ARGS --format csv``, its rows as a reader of the CSV gets them."""
    proc = subprocess.run([sys.executable, "-m", "pglab.cli", "report", str(results), *args, "--format", "csv"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return list(csv.DictReader(io.StringIO(proc.stdout)))


@pytest.fixture(scope="module")
def studies(lab: kubelab.KubeLab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Study]]:
    """Both studies' sweeps, started together and each waited for."""
    tmp = tmp_path_factory.mktemp("studies")
    host_path = str(kubelab.node_root(lab.root, "{node}") / "disk")
    procs: dict[str, tuple[subprocess.Popen[str], Path, dict[str, Any], float]] = {}
    try:
        for example in (CPU_SYNC, FIO_THEN_PGBENCH):
            text = study_plan(example, lab.kubeconfig, host_path=host_path)
            plan = tmp / example
            plan.write_text(text)
            results = tmp / example.removesuffix(".yaml")
            cmd = [sys.executable, "-m", "pglab.cli", "run", str(plan), "--results", str(results)]
            procs[example] = (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
                              results, yaml.safe_load(text), time.monotonic())
        out = {}
        for example, (proc, results, plan_doc, started) in procs.items():
            stdout, stderr = proc.communicate(timeout=1800)
            seconds = time.monotonic() - started
            print(f"{example}: {seconds:.0f} s")
            assert proc.returncode == 0, stdout + stderr
            namespace_gone(lab, plan_doc["target"]["kubernetes"]["namespace"], stderr)
            out[example] = Study(plan_doc, results, stderr, seconds)
    finally:
        for proc, *_ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    yield out


def ok_runs(results: Path) -> tuple[Store, list[Any]]:
    store = Store.open(results, create=False)
    sweep = store.sweeps()[-1]
    assert sweep["status"] == "done"
    runs = store.runs(sweep["id"])
    assert all(r.status == "ok" for r in runs), [(r.axes, r.status, r.reason) for r in runs]
    return store, runs


def test_study_000s_table_cpu_steps_sync_levels_and_workloads_with_a_wal_volume(lab: kubelab.KubeLab,
                                                                                studies: dict[str, Study]) -> None:
    """Every point of the study's matrix ran once, its TPS pgbench's own, at its CPU and synchronous_commit, the
    instances on three database nodes each with a data and a WAL volume, pgbench on a client node; the database
    table holds the study's axes beside TPS, latency and the volumes' IOPS of the same window."""
    study = studies[CPU_SYNC]
    matrix = study.plan["matrix"]
    store, runs = ok_runs(study.results)
    database_nodes = sorted(n.name for n in lab.nodes if n.role == "database")
    client_nodes = {n.name for n in lab.nodes if n.role == "client"}
    points = {(r.axes["cpus"], r.axes["workload"], r.axes["synchronous_commit"], r.axes["clients"]) for r in runs}
    assert len(runs) == len(points) == 12
    assert points == set(itertools.product(matrix["cpus"], matrix["workload"], matrix["synchronous_commit"],
                                           matrix["clients"]))
    by_point = {}
    for r in runs:
        m, run_dir = r.metrics, store.dir / r.dir
        assert m["tps"] == pgbench_tps((run_dir / "pgbench.out").read_text()) > 0
        assert m["limit_cpus"] == r.axes["cpus"]  # the step in force in the instances' pods
        job = yaml.safe_load((run_dir / "job.yaml").read_text())
        env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["PGOPTIONS"] == f"-c synchronous_commit={r.axes['synchronous_commit']}", env
        record = json.loads((run_dir / "run.json").read_text())
        placement = record["placement"]
        assert sorted(placement["instances"].values()) == database_nodes, placement
        assert set(placement["pgbench"].values()) <= client_nodes, placement
        # each instance's two claims, its data and its WAL volume, found on its node's disk in the run's window
        disk = json.loads((run_dir / "disk" / "disk.json").read_text())
        for pod, found in disk["instances"].items():
            assert sorted(v["claim"] for v in found["volumes"]) == [pod, f"{pod}-wal"], (pod, found)
            assert {v["device"] for v in found["volumes"]} == {lab.node_device(found["node"])}, (pod, found)
        if r.axes["workload"] == "tpcb-like":  # what the study read beside TPS: commits, WAL and the volumes' writes
            assert m["write_iops"] > 0 and m["wal_mb_s"] > 0 and m["commits_s"] > 0, (sorted(m), record["exporter"])
        by_point[r.axes["cpus"], r.axes["workload"], r.axes["synchronous_commit"]] = m
    events = [d for k, d in store.conn.execute("SELECT kind, detail FROM events") if k == "cpu-step"]
    assert any(f"cpus={matrix['cpus'][-1]}" in d for d in events), events
    # the storage phase: the two profiles on each node's data and WAL volume
    fio = store.fio_results(store.sweeps()[-1]["id"])
    assert {(f["label"].split("@")[0], f["label"].split("@")[1]) for f in fio} == {
        (path, node) for path in ("data", "wal") for node in database_nodes}
    store.close()

    # the study's table: each point's axes beside its TPS, latency and IOPS, as stored
    rows = report(study.results, "--table", "database", "--wide")
    assert len(rows) == 12
    for row in rows:
        m = by_point[float(row["cpus"]), row["workload"], row["synchronous_commit"]]
        assert row["clients"] == "1"
        assert float(row["tps"]) == pytest.approx(m["tps"], rel=1e-3), (row, m)
        assert float(row["latency_avg_ms"]) == pytest.approx(m["latency_avg_ms"], rel=1e-3), (row, m)
        assert float(row["write_iops"]) == pytest.approx(m["write_iops"], rel=1e-3), (row, m)
        if row["workload"] == "tpcb-like":
            assert float(row["wal_mb_s"]) == pytest.approx(m["wal_mb_s"], rel=1e-3, abs=0.005), (row, m)


def test_study_003s_fio_in_the_pod_and_on_the_host_then_pgbench_off_the_database_nodes(
        lab: kubelab.KubeLab, studies: dict[str, Study]) -> None:
    """fio's five 8 KiB profiles on each database node, in a pod on the instances' class and on the node's own
    directory of the same disk: the storage table's IOPS are fio's JSON, and each in-pod row carries the host's IOPS
    of the same job and their ratio; then pgbench from a client node, TPS its own output."""
    study = studies[FIO_THEN_PGBENCH]
    store, runs = ok_runs(study.results)
    database_nodes = sorted(n.name for n in lab.nodes if n.role == "database")
    client_nodes = {n.name for n in lab.nodes if n.role == "client"}
    matrix = study.plan["matrix"]
    assert sorted((r.axes["workload"], r.axes["clients"], r.repeat) for r in runs) == sorted(
        itertools.product(matrix["workload"], matrix["clients"], range(1, study.plan["run"]["repeats"] + 1)))
    for r in runs:
        run_dir = store.dir / r.dir
        assert r.metrics["tps"] == pgbench_tps((run_dir / "pgbench.out").read_text()) > 0
        placement = json.loads((run_dir / "run.json").read_text())["placement"]
        assert sorted(placement["instances"].values()) == database_nodes, placement
        assert set(placement["pgbench"].values()) <= client_nodes, placement
    fio = store.fio_results(store.sweeps()[-1]["id"])
    store.close()
    profiles = study.plan["storage"]["profiles"]
    assert {p.rsplit("-", 1)[0] for p in profiles} == {"randread", "randwrite", "wal-fdatasync", "seqread",
                                                        "seqwrite"}

    rows = report(study.results, "--table", "storage", "--wide")
    pvc = [r for r in rows if r["place"].startswith("pvc:")]
    host = [r for r in rows if r["place"].startswith("host:")]
    assert len(pvc) == len(host) > 0 and len(pvc) + len(host) == len(rows)
    # each row is fio's own JSON for that job
    for row in rows:
        raw = json.loads((study.results / row["json_file"]).read_text())["jobs"][0]
        assert float(row["iops"]) == pytest.approx(raw[row["direction"]]["iops"], rel=1e-3), row
    jobs_of: dict[str, set[tuple[str, str]]] = {}
    for row in pvc:
        node = row["label"].split("@")[1]
        jobs_of.setdefault(node, set()).add((row["job"], row["direction"]))
        same = [h for h in host if h["job"] == row["job"] and h["direction"] == row["direction"]
                and h["place"].endswith(str(kubelab.node_root(lab.root, node) / "disk"))]
        assert len(same) == 1, (row, host)
        assert float(row["host_iops"]) == pytest.approx(float(same[0]["iops"]), rel=1e-3), (row, same)
        assert float(row["pod_host"]) == pytest.approx(float(row["iops"]) / float(row["host_iops"]), rel=1e-2)
    assert sorted(jobs_of) == database_nodes
    assert len({frozenset(j) for j in jobs_of.values()}) == 1  # every node the same jobs
    (jobs,) = {frozenset(j) for j in jobs_of.values()}
    assert {j.split("-qd")[0] for j, _ in jobs} >= {p for p in profiles}, jobs
    assert len(fio) == len(rows)
