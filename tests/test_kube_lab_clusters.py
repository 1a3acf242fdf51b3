"""Many Clusters in one plan, on the real single-node lab (tools/kube-lab) with the real CloudNativePG operator: the
storage axis (a Cluster per storage class, one after the other) and tenants (a Cluster per tenant, loaded together).

The lab offers one storage class of its own ("lab-local": hostPath volumes on the lab's disk). The storage-axis test
adds a second one, "lab-tmpfs": statically provisioned hostPath volumes on a tmpfs it mounts under the lab's root, so
the two classes are different media, and each volume's device can be told apart by this machine's kernel.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from conftest import pglab
from kube_lab_support import (
    dev_of,
    kubelab,
    namespace_gone,
    pgbench_tps,
    plan_text,
    storage_phase,
    txn_latencies_ms,
    txn_times,
)
from pglab.store.sqlite import Store

pytestmark = pytest.mark.kube_lab

TMPFS_CLASS = "lab-tmpfs"
TMPFS_VOLUMES = 3  # the memory value's fio claim and its Cluster's one instance, and one spare


def single_instance(text: str) -> str:
    """The lab's plan (kube_lab_support.plan_text) with one instance per Cluster (no standby to wait for) of half a
    core: one client's commits then wait mostly for their WAL flush, which is what the storage classes differ in."""
    for old, new in (("instances: 3", "instances: 1"), ("    synchronous: {method: any, number: 1}\n", ""),
                     ("resources: {cpu: 0.25, memory: 384Mi}", "resources: {cpu: 0.5, memory: 384Mi}")):
        assert text.count(old) == 1, (old, text)  # kube_lab_support.plan_text as this was written against
        text = text.replace(old, new)
    return text


@pytest.fixture
def tmpfs_class(lab: kubelab.KubeLab, tmp_path: Path) -> Iterator[Path]:
    """A second storage class on another medium: hostPath PersistentVolumes (no provisioner) on a tmpfs under the
    lab's root; removed afterwards (the volumes, the class, the mount)."""
    mnt = lab.root / "tmpfs-pv"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g,mode=0755", "tmpfs", str(mnt)], check=True)
    docs = [{"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": TMPFS_CLASS},
             "provisioner": "kubernetes.io/no-provisioner", "reclaimPolicy": "Retain",
             "volumeBindingMode": "Immediate"}]
    names = []
    for i in range(1, TMPFS_VOLUMES + 1):
        d = mnt / f"v{i}"
        d.mkdir()
        d.chmod(0o777)  # PostgreSQL runs as its own user in the pod
        names.append(f"{TMPFS_CLASS}-{i}")
        docs.append({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": names[-1]},
                     "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"],
                              "persistentVolumeReclaimPolicy": "Retain", "storageClassName": TMPFS_CLASS,
                              "hostPath": {"path": str(d), "type": "Directory"}}})
    manifest = tmp_path / "tmpfs-class.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    lab.kubectl("apply", "-f", str(manifest))
    try:
        yield mnt
    finally:
        lab.kubectl("delete", "pv", *names, "--ignore-not-found", "--wait=false", check=False)
        lab.kubectl("delete", "storageclass", TMPFS_CLASS, "--ignore-not-found", check=False)
        # the volumes go once their claims have (the namespace's deletion): only then can the tmpfs be unmounted
        lab.kubectl("wait", "--for=delete", "pv", *names, "--timeout=300s", check=False, timeout=320)
        subprocess.run(["umount", str(mnt)], check=False)


# ------------------------------------------------------------------ the storage axis
STORAGE_AXIS = f"""storage: {{profiles: [wal-fdatasync-8k], runtime: 3s, size: 64MiB, paths: [data]}}
matrix:
  clients: [1]
  jobs: [1]
  storage:
    - {{name: disk, storage: {{class: lab-local, size: 1Gi}}, cost: {{monthly: 100}}}}
    - {{name: memory, storage: {{class: {TMPFS_CLASS}, size: 1Gi}}, cost: {{monthly: 300}}}}
run: {{duration: 8s, repeats: 2}}
"""


def test_a_storage_axis_builds_a_cluster_per_class(lab: kubelab.KubeLab, tmpfs_class: Path, tmp_path: Path) -> None:
    ns = "pglab-e2e-storage"
    plan = tmp_path / "plan.yaml"
    plan.write_text(single_instance(plan_text(lab, "sa", ns, STORAGE_AXIS)))
    results = tmp_path / "results"
    proc = pglab("run", str(plan), "--results", str(results), timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lab.kubectl("delete", "pv", *(f"{TMPFS_CLASS}-{i}" for i in range(1, TMPFS_VOLUMES + 1)), "--wait=false",
                check=False)
    namespace_gone(lab, ns, proc.stderr)
    # the lab-local class's volumes are on the disk of their pod's node: a loop device of its own, ext4 or XFS
    node_disks = {dev_of(lab.node_disk(n.name)): n.fstype for n in lab.nodes}
    memory = dev_of(tmpfs_class)
    assert memory not in node_disks and len(node_disks) == len(lab.nodes)

    # the storage phase ran on each class's own volume: the mount its fio pod had is on that medium
    store, sweep_id, node, fio_rows = storage_phase(lab, results, ["disk", "memory"])
    fsyncs = {}
    for value in ("disk", "memory"):
        row = fio_rows[value]
        folder = results / "storage" / value / "data" / node
        mount = (folder / "volume-mount.txt").read_text().split()
        device = mount[2]
        fstype = node_disks.get(device) if value == "disk" else "tmpfs"
        # lab-local's volume on that node's own disk, none of the others'
        assert device == (dev_of(lab.node_disk(node)) if value == "disk" else memory), (value, mount, node_disks)
        assert mount[mount.index("-") + 1] == fstype, (value, mount)
        assert row["device"].split()[:2] == [device, fstype], row
        raw = json.loads((folder / f"{row['job']}.json").read_text())["jobs"][0]
        assert row["iops"] == raw["write"]["iops"] > 0
        fsyncs[value] = raw["sync"]["lat_ns"]["mean"]
    assert fsyncs["memory"] < fsyncs["disk"], fsyncs  # an fdatasync on tmpfs writes nothing to a device

    # each value's runs ran on a Cluster of its own class: the volume probe found its claim on that medium
    runs = [r for r in store.runs(sweep_id) if r.status == "ok"]
    assert sorted((r.axes["storage"], r.repeat) for r in runs) == [(v, k) for v in ("disk", "memory") for k in (1, 2)]
    tps: dict[str, list[float]] = {"disk": [], "memory": []}
    for r in runs:
        run_dir = store.dir / r.dir
        assert r.metrics["tps"] == pgbench_tps((run_dir / "pgbench.out").read_text()) > 0
        lat = txn_latencies_ms(run_dir)
        assert r.metrics["latency_p99_ms"] == pytest.approx(float(np.percentile(lat, 99)))
        tps[r.axes["storage"]].append(r.metrics["tps"])
        # the volume probe read the instance's claim on the value's medium (tmpfs has no block device)
        (instance,) = json.loads((run_dir / "disk" / "disk.json").read_text())["instances"].values()
        (volume,) = instance["volumes"]
        node_disk = dev_of(lab.node_disk(instance["node"]))  # its own node's
        assert volume["how"] == (f"{node_disks[node_disk]} on device {node_disk}" if r.axes["storage"] == "disk"
                                 else "tmpfs (tmpfs) has no block device on the node"), volume
    events = [d for (k, d) in store.conn.execute("SELECT kind, detail FROM events") if k == "storage-switch"]
    assert len(events) == 1 and events[0].startswith("memory: new Cluster"), events
    store.close()

    # one report: the uplift of memory over disk with its interval, and each class's price per TPS
    up = pglab("report", str(results), "--table", "uplift", "--format", "json")
    assert up.returncode == 0, up.stderr
    (row,) = json.loads(up.stdout)
    assert row["comparison"] == "storage=memory vs storage=disk"
    assert row["a"] == pytest.approx(np.mean(tps["disk"])) and row["b"] == pytest.approx(np.mean(tps["memory"]))
    assert row["uplift_pct"] == pytest.approx((np.mean(tps["memory"]) / np.mean(tps["disk"]) - 1) * 100)
    if row["ci95_low_pct"] is not None:  # unbounded (None) when a side's repeats are too far apart (Fieller)
        assert row["ci95_low_pct"] <= row["uplift_pct"] <= row["ci95_high_pct"], row
    # one client at a time, each commit waiting for its WAL flush: the medium whose flush costs nothing is faster
    assert row["uplift_pct"] > 0, row
    cost = pglab("report", str(results), "--table", "cost", "--format", "json")
    assert cost.returncode == 0, cost.stderr
    per = {c["storage"]: c for c in json.loads(cost.stdout)}
    assert per["disk"]["per_tps"] == pytest.approx(100 / np.mean(tps["disk"]))
    assert per["memory"]["per_tps"] == pytest.approx(300 / np.mean(tps["memory"]))
    text = pglab("report", str(results))
    assert text.returncode == 0 and "storage=memory vs storage=disk" in text.stdout, text.stdout


# ------------------------------------------------------------------ tenants: a Cluster per tenant, loaded together
def tenants_plan(lab: kubelab.KubeLab, namespace: str) -> str:
    return f"""
name: mt
target:
  kubernetes:
    kubeconfig: {lab.kubeconfig}
    namespace: {namespace}
    cluster_name: mt
    image: {lab.image_names["postgresql"]}
    storage: {{size: 1Gi}}
    resources: {{cpu: 0.25, memory: 384Mi}}
    database: {{anti_affinity: none}}
    clients: {{anti_affinity: none}}
postgres:
  parameters: {{shared_buffers: 32MB, max_connections: 20}}
dataset: {{scale: 1}}
tenants:
  arrangements:
    - name: two-tiers
      tiers:
        - {{name: gold, tenants: 1, clients: 2, jobs: 1, resources: {{cpus: 0.5, memory: 512MiB}},
           namespace: {namespace}-gold}}
        - {{name: bronze, tenants: 2, clients: 1, jobs: 1, resources: {{cpus: 0.2}}}}
run: {{duration: 8s, repeats: 1}}
"""


def test_three_tenants_in_two_tiers_run_in_the_same_window(lab: kubelab.KubeLab, tmp_path: Path) -> None:
    ns = "pglab-e2e-tenants"
    plan = tmp_path / "plan.yaml"
    plan.write_text(tenants_plan(lab, ns))
    results = tmp_path / "results"
    proc = pglab("run", str(plan), "--results", str(results), timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    namespace_gone(lab, f"{ns}-gold", proc.stderr)
    namespace_gone(lab, ns, proc.stderr)

    store = Store.open(results, create=False)
    sweep = store.sweeps()[-1]
    assert sweep["status"] == "done"
    (run,) = store.runs(sweep["id"])
    assert run.status == "ok" and run.axes == {"arrangement": "two-tiers"}
    run_dir = store.dir / run.dir
    record = json.loads((run_dir / "tenants.json").read_text())
    tenants = record["tenants"]
    # one Cluster per tenant, the gold tier in its own namespace, each with its tier's resources
    assert {n: (t["tier"], t["cluster"], t["namespace"]) for n, t in tenants.items()} == {
        "t01": ("gold", "mt-t01", f"{ns}-gold"), "t02": ("bronze", "mt-t02", ns), "t03": ("bronze", "mt-t03", ns)}
    figures: dict[str, dict[str, float]] = {}
    for tenant, metric, value in store.conn.execute(
            "SELECT tenant, name, value FROM tenant_metrics WHERE run_id = ?", (run.id,)):
        figures.setdefault(tenant, {})[metric] = value
    begun, ended = {}, {}
    for name in ("t01", "t02", "t03"):
        tdir = run_dir / "tenants" / name
        # each tenant's figures are its own pgbench's, in its own pod (output and -l logs shipped as artifacts)
        assert figures[name]["tps"] == pgbench_tps((tdir / "pgbench.out").read_text()) > 0
        lat = txn_latencies_ms(tdir)
        assert figures[name]["logged_transactions"] == len(lat) > 0
        assert figures[name]["latency_p99_ms"] == pytest.approx(float(np.percentile(lat, 99)))
        job = (tdir / "job.yaml").read_text()
        assert f"PGHOST\n          value: mt-{name}-rw" in job or f"value: mt-{name}-rw" in job, job
        b, e = txn_times(tdir)
        begun[name], ended[name] = float(b.min()), float(e.max())
    # the windows overlap: every tenant's first transaction began before any tenant's last one ended
    assert max(begun.values()) < min(ended.values()), (begun, ended)
    assert (run.metrics["common_window_s"] or 0) > 0
    assert run.metrics["tps"] == pytest.approx(sum(figures[n]["tps"] for n in figures))
    assert run.metrics["tier.gold.tps"] == pytest.approx(figures["t01"]["tps"])
    assert run.metrics["tier.bronze.tps"] == pytest.approx((figures["t02"]["tps"] + figures["t03"]["tps"]) / 2)
    store.close()

    for table in ("tiers", "tenants"):
        out = pglab("report", str(results), "--table", table, "--format", "json")
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout)
        if table == "tiers":
            assert {r["tier"] for r in rows} == {"gold", "bronze"}
        else:
            by = {r["tenant"]: r for r in rows}
            assert set(by) == {"t01", "t02", "t03"} and by["t01"]["tps"] == pytest.approx(figures["t01"]["tps"])
