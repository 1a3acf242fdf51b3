"""Many Clusters in one plan, on the real lab (tools/kube-lab) with the real CloudNativePG operator: the storage axis
(a Cluster per storage class, one after the other) and tenants (a Cluster per tenant, loaded together, in tiers on
different storage classes, each tenant's CPU, memory and disk figures from a real Prometheus scraping the lab).

The lab offers two storage classes of its own ("lab-local": hostPath volumes on each node's disk; "lab-throttled":
on a second disk of each node held to 100 IOPS and 8 MiB/s each way by a blkio throttle, kubelab.THROTTLE). The
storage-axis sweep adds a third, "lab-tmpfs": statically provisioned hostPath volumes on a tmpfs it mounts under the
lab's root, so the classes are different media, and each volume's device can be told apart by this machine's
kernel. The sweep is study 002's example (examples/study-storage-classes.yaml: lab-throttled as its capped disk,
lab-local) at its smallest, with the tmpfs class appended as a third value of its storage axis (not the study's).
One sweep over the three (a Cluster each) carries three tests: the memory class is faster than the disk, the
throttled class slower by pglab's own verdict, each class's volumes are on their node's own device for it, and the
table study 002 published (TPS, uplift with its interval, price per TPS and its parts) is the store's.

The tenants test runs study 001's tier half (examples/study-qos-tiers.yaml) at its smallest: no QoS, then QoS
tiers that hold CPU (the tiers' cores) and IOPS (the best-effort tier on the throttled class), three tenants each,
with the tests' Prometheus for each tenant's CPU, memory and disk figures, after the storage phase the study ran
first (fio on a volume of each tier's class); it checks the study's tiers table and the storage table.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from conftest import REPO, pglab
from kube_lab_support import (
    MEMORY_VALUE,
    SCRAPE_S,
    TMPFS_CLASS,
    DiskStats,
    Prometheus,
    dev_of,
    kubelab,
    namespace_gone,
    pgbench_tps,
    storage_phase,
    study_plan,
    txn_latencies_ms,
    txn_times,
)
from pglab.store.sqlite import Store

pytestmark = pytest.mark.kube_lab

TMPFS_VOLUMES = 3  # the memory value's fio claim and its Cluster's one instance, and one spare


def tmpfs_class(lab: kubelab.KubeLab, folder: Path) -> Iterator[Path]:
    """A third storage class on another medium: hostPath PersistentVolumes (no provisioner) on a tmpfs under the
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
    manifest = folder / "tmpfs-class.json"
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


# ------------------------------------------------------------------ the storage axis: three classes, one sweep
STUDY = "study-storage-classes.yaml"  # study 002: its example, at its smallest (kube_lab_support.STUDY_EDITS)
REPEATS = 5  # kube_lab_support.STUDY_EDITS
VALUES = ("capped", "local", "memory")  # the study's two classes, then this test's memory class (MEMORY_VALUE)
CLASSES = {"capped": kubelab.THROTTLED_CLASS, "local": kubelab.STORAGE_CLASS}  # the lab's own, on node disks
# the example's fio profiles, each of their jobs run on every class's volume
JOBS = {"randread-8k-qd1", "randread-8k-qd32", "randwrite-8k-qd1", "randwrite-8k-qd32", "wal-fdatasync-8k-qd1",
        "seqread-1m-qd8", "seqwrite-1m-qd8"}


@dataclass
class StorageSweep:
    results: Path
    memory: Path  # the tmpfs the memory class's volumes are on
    plan: dict[str, Any]  # the plan the sweep ran (its prices)


@pytest.fixture(scope="module")
def storage_sweep(lab: kubelab.KubeLab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageSweep]:
    """One storage-axis sweep for the tests below (a Cluster per class is most of its time): study 002's example
    (examples/study-storage-classes.yaml) at its smallest — one-instance Clusters on lab-throttled and lab-local,
    one client, 5 repeats of 6 s a class, its five fio profiles for 1 s each — with a third class appended that is
    not the study's: the tmpfs class, for the memory-vs-disk check."""
    tmp = tmp_path_factory.mktemp("storage-axis")
    ns = "pglab-e2e-storage"
    with contextlib.contextmanager(tmpfs_class)(lab, tmp) as memory:
        plan = tmp / "plan.yaml"
        plan.write_text(study_plan(STUDY, lab.kubeconfig, namespace=ns, memory=MEMORY_VALUE))
        assert yaml.safe_load(plan.read_text())["run"]["repeats"] == REPEATS
        results = tmp / "results"
        proc = pglab("run", str(plan), "--results", str(results), timeout=1800)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        lab.kubectl("delete", "pv", *(f"{TMPFS_CLASS}-{i}" for i in range(1, TMPFS_VOLUMES + 1)), "--wait=false",
                    check=False)
        namespace_gone(lab, ns, proc.stderr)
        yield StorageSweep(results, memory, yaml.safe_load(plan.read_text()))


def stored_tps(store: Store, sweep_id: int) -> dict[str, list[float]]:
    """Each class's TPS of its ok runs, every repeat, from the store."""
    runs = [r for r in store.runs(sweep_id) if r.status == "ok"]
    repeats = range(1, REPEATS + 1)
    assert sorted((r.axes["storage"], r.repeat) for r in runs) == sorted((v, k) for v in VALUES for k in repeats)
    tps: dict[str, list[float]] = {v: [] for v in VALUES}
    for r in runs:
        value = r.metrics.get("tps")
        assert value is not None, r.reason
        tps[str(r.axes["storage"])].append(value)
    return tps


def test_a_storage_axis_builds_a_cluster_per_class(lab: kubelab.KubeLab, storage_sweep: StorageSweep) -> None:
    results = storage_sweep.results
    # the lab-local class's volumes are on the disk of their pod's node: a loop device of its own, ext4 or XFS
    node_disks = {dev_of(lab.node_disk(n.name)): n.fstype for n in lab.nodes}
    memory = dev_of(storage_sweep.memory)
    assert memory not in node_disks and len(node_disks) == len(lab.nodes)

    # the storage phase ran on each class's own volume: the mount its fio pod had is on that medium
    store, sweep_id, node, fio_rows = storage_phase(lab, results, list(VALUES))
    fsyncs = {}
    for value in VALUES:  # every job of the example's profiles on every class, each as fio's JSON has it
        assert set(fio_rows[value]) == JOBS, (value, sorted(fio_rows[value]))
        for job, row in fio_rows[value].items():
            raw = json.loads((results / "storage" / value / "data" / node / f"{job}.json").read_text())["jobs"][0]
            assert row["iops"] == raw[row["direction"]]["iops"] > 0, (value, row)
    for value in ("local", "memory"):
        row = fio_rows[value]["wal-fdatasync-8k-qd1"]
        folder = results / "storage" / value / "data" / node
        mount = (folder / "volume-mount.txt").read_text().split()
        device = mount[2]
        fstype = node_disks.get(device) if value == "local" else "tmpfs"
        # lab-local's volume on that node's own disk, none of the others'
        assert device == (dev_of(lab.node_disk(node)) if value == "local" else memory), (value, mount, node_disks)
        assert mount[mount.index("-") + 1] == fstype, (value, mount)
        assert row["device"].split()[:2] == [device, fstype], row
        raw = json.loads((folder / f"{row['job']}.json").read_text())["jobs"][0]
        assert row["iops"] == raw["write"]["iops"] > 0
        fsyncs[value] = raw["sync"]["lat_ns"]["mean"]
    assert fsyncs["memory"] < fsyncs["local"], fsyncs  # an fdatasync on tmpfs writes nothing to a device

    # each value's runs ran on a Cluster of its own class: the volume probe found its claim on that medium
    tps = stored_tps(store, sweep_id)
    for r in store.runs(sweep_id):
        if r.axes["storage"] not in ("local", "memory"):
            continue  # the throttled class's: the test below
        run_dir = store.dir / r.dir
        assert r.metrics["tps"] == pgbench_tps((run_dir / "pgbench.out").read_text()) > 0
        lat = txn_latencies_ms(run_dir)
        assert r.metrics["latency_p99_ms"] == pytest.approx(float(np.percentile(lat, 99)))
        # the volume probe read the instance's claim on the value's medium (tmpfs has no block device)
        (instance,) = json.loads((run_dir / "disk" / "disk.json").read_text())["instances"].values()
        (volume,) = instance["volumes"]
        node_disk = dev_of(lab.node_disk(instance["node"]))  # its own node's
        assert volume["how"] == (f"{node_disks[node_disk]} on device {node_disk}" if r.axes["storage"] == "local"
                                 else "tmpfs (tmpfs) has no block device on the node"), volume
    events = [d for (k, d) in store.conn.execute("SELECT kind, detail FROM events") if k == "storage-switch"]
    assert [e.split(":")[0] for e in events] == ["local", "memory"], events
    assert all(": new Cluster" in e for e in events), events
    store.close()

    # memory against the local disk with its interval (pglab's own comparison of two values of the axis)
    cmp = pglab("compare", str(results), "--axis", "storage", "--a", "local", "--b", "memory", "--format", "json")
    assert cmp.returncode == 0, cmp.stderr
    (row,) = json.loads(cmp.stdout)
    assert row["tps_a"] == pytest.approx(np.mean(tps["local"])) and row["tps_b"] == pytest.approx(
        np.mean(tps["memory"]))
    assert row["tps_delta_pct"] == pytest.approx((np.mean(tps["memory"]) / np.mean(tps["local"]) - 1) * 100)
    if row["tps_ci95_low_pct"] is not None:  # unbounded (None) when a side's repeats are too far apart (Fieller)
        assert row["tps_ci95_low_pct"] <= row["tps_delta_pct"] <= row["tps_ci95_high_pct"], row
    # one client at a time, each commit waiting for its WAL flush: the medium whose flush costs nothing is faster
    assert row["tps_delta_pct"] > 0, row
    text = pglab("report", str(results))
    assert text.returncode == 0 and "storage=memory vs storage=capped" in text.stdout, text.stdout


def test_the_throttled_class_is_slower_and_each_class_is_on_its_own_device(lab: kubelab.KubeLab,
                                                                             storage_sweep: StorageSweep) -> None:
    results = storage_sweep.results
    # every node has a disk per class, each a loop device of its own
    disks = {(n.name, c): dev_of(lab.node_disk(n.name, c)) for n in lab.nodes for c in CLASSES.values()}
    assert len(set(disks.values())) == len(disks), disks
    for (node_name, cls), dev in disks.items():
        loop = lab.node_device(node_name, cls)
        assert Path(f"/sys/block/{loop}/dev").read_text().strip() == dev, (node_name, cls, loop)

    # the storage phase: each class's fio volume on that class's disk of its node
    store, sweep_id, node, fio_rows = storage_phase(lab, results, list(VALUES))
    iops = {}
    for value, cls in CLASSES.items():
        row = fio_rows[value]["wal-fdatasync-8k-qd1"]
        mount = (results / "storage" / value / "data" / node / "volume-mount.txt").read_text().split()
        assert mount[2] == disks[(node, cls)], (value, mount, disks)
        assert all(r["device"].split()[0] == disks[(node, cls)] for r in fio_rows[value].values()), fio_rows[value]
        raw = json.loads((results / "storage" / value / "data" / node / f"{row['job']}.json").read_text())["jobs"][0]
        iops[value] = raw["write"]["iops"]
        assert row["iops"] == iops[value] > 0
    # in the pod, each 8 KiB write and its fdatasync are at least one request: the throttle's request rate bounds
    # them (blk-throttle lets a slice's first burst through: a quarter over)
    assert iops["capped"] <= kubelab.THROTTLE["write_iops_device"] * 1.25, iops

    # each run's instance volume: on its class's disk of the instance's node
    tps = stored_tps(store, sweep_id)
    for r in store.runs(sweep_id):
        if r.axes["storage"] not in CLASSES:
            continue
        run_dir = store.dir / r.dir
        assert r.metrics["tps"] == pgbench_tps((run_dir / "pgbench.out").read_text()) > 0
        (instance,) = json.loads((run_dir / "disk" / "disk.json").read_text())["instances"].values()
        (volume,) = instance["volumes"]
        expected = disks[(instance["node"], CLASSES[r.axes["storage"]])]
        assert volume["how"].endswith(f"on device {expected}"), (r.axes, volume, disks)
    store.close()

    # pglab's own verdict: the throttled class is slower, significantly
    cmp = pglab("compare", str(results), "--axis", "storage", "--a", "local", "--b", "capped", "--format", "json")
    assert cmp.returncode == 0, cmp.stderr
    (row,) = json.loads(cmp.stdout)
    assert row["tps_verdict"] == "slower", (row, tps)


def test_study_002s_table_of_the_storage_classes(storage_sweep: StorageSweep) -> None:
    """The table study 002 published: each class's TPS, its uplift over the first class (the capped disk) with its
    95 % interval and verdict, its price per TPS and the price's parts — from the store and the plan's prices."""
    results = storage_sweep.results
    store = Store.open(results, create=False)
    tps = stored_tps(store, store.sweeps()[-1]["id"])
    store.close()
    mean = {v: float(np.mean(t)) for v, t in tps.items()}
    prices = {s["name"]: s["cost"] for s in storage_sweep.plan["matrix"]["storage"]}
    assert list(prices) == list(VALUES)

    up = pglab("report", str(results), "--table", "uplift", "--format", "json")
    assert up.returncode == 0, up.stderr
    rows = json.loads(up.stdout)
    assert [r["comparison"] for r in rows] == ["storage=local vs storage=capped", "storage=memory vs storage=capped"]
    for r, value in zip(rows, ("local", "memory"), strict=True):
        assert next(iter(r)) == "comparison" and list(r)[-7:] == [
            "a", "b", "uplift_pct", "ci95_low_pct", "ci95_high_pct", "verdict", "flags"], r
        assert (r["workload"], r["synchronous_commit"], r["clients"]) == ("tpcb-like", "on", 1), r
        assert r["a"] == pytest.approx(mean["capped"], rel=1e-9) and r["b"] == pytest.approx(mean[value], rel=1e-9)
        assert r["uplift_pct"] == pytest.approx((mean[value] - mean["capped"]) / mean["capped"] * 100, rel=1e-6)
        # the study's finding: the uncapped class is faster, the interval clear of 0
        assert r["verdict"] == "faster" and r["ci95_low_pct"] is not None, r
        assert 0 < r["ci95_low_pct"] < r["uplift_pct"] < r["ci95_high_pct"], r

    cost = pglab("report", str(results), "--table", "cost", "--format", "json")
    assert cost.returncode == 0, cost.stderr
    rows = json.loads(cost.stdout)
    assert [r["storage"] for r in rows] == list(VALUES)
    for r in rows:
        price = prices[r["storage"]]
        assert list(r) == ["storage", "workload", "peak_tps", "at_clients", "at_synchronous_commit", "monthly",
                           *(f"monthly.{p}" for p in price["breakdown"]), "currency", "per_tps"], r
        assert (r["workload"], r["at_clients"], r["at_synchronous_commit"]) == ("tpcb-like", 1, "on"), r
        assert r["peak_tps"] == pytest.approx(mean[r["storage"]], rel=1e-9)
        assert r["monthly"] == price["monthly"] == sum(price["breakdown"].values())
        assert {p: r[f"monthly.{p}"] for p in price["breakdown"]} == price["breakdown"]
        assert r["per_tps"] == pytest.approx(price["monthly"] / mean[r["storage"]], rel=1e-9)


# ------------------------------------------------------------------ tenants: study 001's tiers, a Cluster per tenant
TIERS = "study-qos-tiers.yaml"  # study 001's tier half: its example at its smallest (kube_lab_support.STUDY_EDITS)
TIERS_EXAMPLE = yaml.safe_load((REPO / "examples" / TIERS).read_text())
# the tenants of each arrangement at its smallest (t01…t03 in the order of its tiers) and their tiers
ARRANGED = {"no-qos": {"t01": "all", "t02": "all", "t03": "all"},
            "qos-tiers": {"t01": "high", "t02": "medium", "t03": "best-effort"}}


def tiers_plan(lab: kubelab.KubeLab, namespace: str, prometheus_url: str) -> str:
    """Study 001's tiers at its smallest: no QoS (three tenants alike, 0.25 core on lab-local), then QoS tiers (high
    0.5 core and medium 0.25 on lab-local, best-effort 0.1 on lab-throttled in a namespace of its own); the instances
    on the database nodes, pgbench on the client nodes, figures from the test's Prometheus."""
    k8s = TIERS_EXAMPLE["target"]["kubernetes"]
    assert k8s["image"] == lab.image_names["postgresql"] and k8s["storage"]["class"] == kubelab.STORAGE_CLASS
    return study_plan(TIERS, lab.kubeconfig, namespace=namespace, slow=f"{namespace}-slow",
                      prometheus=f"{{url: '{prometheus_url}', interval: {SCRAPE_S}s}}")


def tier_cpus(arrangement: str, tier: str) -> float:
    """The tier's CPU as the example gives it (its own, or the target's)."""
    (found,) = [t for a in TIERS_EXAMPLE["tenants"]["arrangements"] if a["name"] == arrangement
                for t in a["tiers"] if t["name"] == tier]
    return float(found.get("resources", {}).get("cpus", TIERS_EXAMPLE["target"]["kubernetes"]["resources"]["cpu"]))


@dataclass(eq=False)
class WalReads(threading.Thread):
    """pg_stat_wal of one instance read by the test itself, as a superuser in its postgres container (kubectl exec),
    as often as it answers, each row stamped by the server's clock: (epoch, records, full-page images, bytes)."""

    lab: kubelab.KubeLab
    namespace: str
    pod: str
    rows: list[tuple[float, float, float, float]] = field(default_factory=list)
    halt: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        super().__init__(daemon=True)

    def run(self) -> None:
        sql = "SELECT extract(epoch FROM clock_timestamp()), wal_records, wal_fpi, wal_bytes FROM pg_stat_wal"
        while not self.halt.wait(0.5):
            proc = self.lab.kubectl("-n", self.namespace, "exec", self.pod, "-c", "postgres", "--", "psql", "-tAq",
                                    "-d", "postgres", "-c", sql, check=False, timeout=20)
            with contextlib.suppress(ValueError):
                ts, records, fpi, size = (float(v) for v in proc.stdout.strip().split("|"))
                self.rows.append((ts, records, fpi, size))

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)

    def bracket(self, start: float, end: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """The increases (records, images, bytes) from the first read at or after ``start`` to the last at or before
        ``end`` (the least the span can have seen), and from the last read before ``start`` to the first after
        ``end`` (the most)."""
        inside = [r for r in self.rows if start <= r[0] <= end]
        before, after = [r for r in self.rows if r[0] < start], [r for r in self.rows if r[0] > end]
        assert inside and before and after, (start, end, self.rows)

        def increase(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
            return tuple(y - x for x, y in zip(a[1:], b[1:], strict=True))

        return increase(inside[0], inside[-1]), increase(before[-1], after[0])


def test_study_001s_tiers_each_tenant_measured_in_the_same_window(lab: kubelab.KubeLab, tmp_path: Path) -> None:
    """Study 001's tiers: each tenant's TPS and latency are its own pgbench's, its CPU its tier's share at most; the
    throttled tier's disk figures (its volume's device, from node-exporter through Prometheus) are those this
    machine's /proc/diskstats counted for that loop device over the tenant's window; the tiers table is the study's
    (TPS and latency per tier, against the no-QoS arrangement) from the stored runs; the storage phase measured each
    tier's class once, fio's JSON in each row, the throttled class at the lab's limit."""
    ns = "pglab-e2e-tenants"
    prom = Prometheus(lab, tmp_path / "prometheus", ns)
    slow_disks = {n.name: lab.node_device(n.name, kubelab.THROTTLED_CLASS) for n in lab.nodes if n.role == "database"}
    oracle = DiskStats(list(slow_disks.values()))
    try:
        plan = tmp_path / "plan.yaml"
        plan.write_text(tiers_plan(lab, ns, prom.url))
        results = tmp_path / "results"
        oracle.start()
        wal = WalReads(lab, ns, "qos-t01-1")  # tenant t01's one instance in each arrangement: reads fail between
        wal.start()
        try:
            proc = pglab("run", str(plan), "--results", str(results), timeout=1800)
        finally:
            wal.stop()
        oracle.stop()
    finally:
        prom.stop()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    namespace_gone(lab, f"{ns}-slow", proc.stderr)
    namespace_gone(lab, ns, proc.stderr)

    store = Store.open(results, create=False)
    sweep = store.sweeps()[-1]
    assert sweep["status"] == "done"
    runs = {r.axes["arrangement"]: r for r in store.runs(sweep["id"])}
    assert list(runs) == list(ARRANGED) and all(r.status == "ok" for r in runs.values())
    for arrangement, run in runs.items():
        run_dir = store.dir / run.dir
        record = json.loads((run_dir / "tenants.json").read_text())
        assert json.loads((run_dir / "run.json").read_text())["tenants"] == record["tenants"]
        tenants = record["tenants"]
        # one Cluster per tenant, the best-effort tier in its own namespace
        assert {n: (t["tier"], t["cluster"], t["namespace"]) for n, t in tenants.items()} == {
            n: (tier, f"qos-{n}", f"{ns}-slow" if tier == "best-effort" else ns)
            for n, tier in ARRANGED[arrangement].items()}
        figures: dict[str, dict[str, float]] = {}
        for tenant, metric, value in store.conn.execute(
                "SELECT tenant, name, value FROM tenant_metrics WHERE run_id = ?", (run.id,)):
            figures.setdefault(tenant, {})[metric] = value
        begun, ended = {}, {}
        for name, tier in ARRANGED[arrangement].items():
            tdir = run_dir / "tenants" / name
            f = figures[name]
            # each tenant's figures are its own pgbench's, in its own pod (output and -l logs shipped as artifacts)
            assert f["tps"] == pgbench_tps((tdir / "pgbench.out").read_text()) > 0
            lat = txn_latencies_ms(tdir)
            assert f["logged_transactions"] == len(lat) > 0
            assert f["latency_p99_ms"] == pytest.approx(float(np.percentile(lat, 99)))
            job = (tdir / "job.yaml").read_text()
            assert f"value: qos-{name}-rw" in job, job
            b, e = txn_times(tdir)
            begun[name], ended[name] = float(b.min()), float(e.max())
            # its primary's CPU and memory: its postgres container's, within its tier's limits
            cpus = tier_cpus(arrangement, tier)
            assert "cpu_cores" in f, (name, tier, tenants[name]["primary_figures"].get("cpu"))
            assert 0 < f["cpu_cores"] <= cpus * 1.05, (name, tier, f)
            assert f["cpu_limit_pct"] == pytest.approx(f["cpu_cores"] / cpus * 100)
            start, end = tenants[name]["window"]
            assert f["cpu_s"] == pytest.approx(f["cpu_cores"] * (end - start))
            assert 0 < f["memory_mb"] < 512, f
            # its disk figures are its volume's device on its primary's node: the tier's class's disk of that node
            seen = tenants[name]["primary_figures"]
            node = seen["node"]
            assert lab.node(node).role == "database"
            (volume,) = seen["disk"]["volumes"]
            cls = kubelab.THROTTLED_CLASS if tier == "best-effort" else kubelab.STORAGE_CLASS
            assert volume["device"] == lab.node_device(node, cls), (name, seen)
            assert f["write_iops"] > 0 and f["total_iops"] == pytest.approx(f["read_iops"] + f["write_iops"])
            assert f["wal_records"] > 0 and f["wal_bytes_per_commit"] > 0 and "buffers_backend" in f, f
        # the windows overlap: every tenant's first transaction began before any tenant's last one ended
        assert max(begun.values()) < min(ended.values()), (begun, ended)
        assert (run.metrics["common_window_s"] or 0) > 0
        assert run.metrics["tps"] == pytest.approx(sum(figures[n]["tps"] for n in figures))
        for tier in set(ARRANGED[arrangement].values()):
            mine = [figures[n]["tps"] for n, t in ARRANGED[arrangement].items() if t == tier]
            assert run.metrics[f"tier.{tier}.tps"] == pytest.approx(sum(mine) / len(mine))
        assert run.metrics["tenants_cpu_cores"] == pytest.approx(sum(figures[n]["cpu_cores"] for n in figures))
        assert run.metrics["wal_records"] == sum(figures[n]["wal_records"] for n in figures)

        # t01's WAL as its Job read pg_stat_wal around its window, against the test's own reads of it: between the
        # increase over the test's reads inside the Job's two and that over those around them
        read = tenants["t01"]["pgstats"]
        least, at_most = wal.bracket(*read["window"])
        got = (read["deltas"]["wal_records"], read["deltas"]["wal_fpi"], read["deltas"]["wal_stat_bytes"])
        print(arrangement, "t01 WAL (records, full pages, bytes): least", least, "pglab", got, "most", at_most)
        assert all(lo <= g <= hi for lo, g, hi in zip(least, got, at_most, strict=True)), (least, got, at_most)
        assert figures["t01"]["wal_records"] == got[0] and figures["t01"]["wal_fpi"] == got[1]

        if arrangement != "qos-tiers":
            continue
        # the best-effort tenant's writes as this machine counted them on its node's throttled loop device: pglab's
        # figure comes from node-exporter's scrapes (1 s apart) around the tenant's window, the edges prorated, so
        # it lies between the writes from 1.5 s after the window's start to 1.5 s before its end and those from
        # 1.5 s before to 1.5 s after (a scrape's interval and its duration)
        slow = tenants["t03"]
        assert "shared_with" not in slow["primary_figures"]["disk"], slow  # the only volume on that device
        device = slow_disks[slow["primary_figures"]["node"]]
        start, end = slow["window"]
        counted = figures["t03"]["write_iops"] * (end - start)
        fewest, most = oracle.writes(device, start + 1.5, end - 1.5), oracle.writes(device, start - 1.5, end + 1.5)
        assert fewest - 0.5 <= counted <= most + 0.5, (counted, fewest, most)
    store.close()

    # the table study 001 published: per arrangement and tier, TPS and latency per instance, each QoS tier against
    # the no-QoS arrangement's TPS per instance (one run a side: no verdict, "too few repeats")
    table = pglab("report", str(results), "--table", "tiers", "--format", "json")
    assert table.returncode == 0, table.stderr
    rows = json.loads(table.stdout)
    assert [(r["arrangement"], r["tier"]) for r in rows] == [("no-qos", "all"), ("qos-tiers", "high"),
                                                             ("qos-tiers", "medium"), ("qos-tiers", "best-effort")]
    base = float(runs["no-qos"].metrics["tps"] or 0) / len(ARRANGED["no-qos"])
    for r in rows:
        m = runs[r["arrangement"]].metrics
        assert r["tps_per_instance"] == pytest.approx(m[f"tier.{r['tier']}.tps"]), r
        assert r["latency_p99_ms"] == pytest.approx(m[f"tier.{r['tier']}.latency_p99_ms"]), r
        if r["arrangement"] == "no-qos":
            assert r["tps_vs_base_pct"] is None, r
        else:
            assert r["tps_vs_base_pct"] == pytest.approx((r["tps_per_instance"] - base) / base * 100, rel=1e-6), r
            assert r["tps_verdict"] == "too few repeats", r

    # the storage phase, before the first arrangement: each tier's class once, by fio on a volume of that class on a
    # database node; each row is fio's JSON; the throttled class is held to the lab's blkio limit, the local one not
    table = pglab("report", str(results), "--table", "storage", "--format", "csv")
    assert table.returncode == 0, table.stderr
    fio_rows = list(csv.DictReader(io.StringIO(table.stdout)))
    classes = {r["label"].split("@")[0]: r["label"].split("@")[1] for r in fio_rows}
    assert sorted(classes) == sorted(f"{c}/data" for c in (kubelab.STORAGE_CLASS, kubelab.THROTTLED_CLASS)), classes
    assert all(lab.node(node).role == "database" for node in classes.values()), classes
    jobs = {"randread-8k-qd1", "randread-8k-qd32", "randwrite-8k-qd1", "randwrite-8k-qd32"}
    iops: dict[tuple[str, str], float] = {}
    for r in fio_rows:
        raw = json.loads((results / r["json_file"]).read_text())["jobs"][0]
        assert float(r["iops"]) == pytest.approx(raw[r["direction"]]["iops"], rel=1e-3), r
        iops[(r["label"].split("/")[0], r["job"])] = float(r["iops"])
    assert {job for _, job in iops} == jobs and len(iops) == len(fio_rows) == 2 * len(jobs), fio_rows
    print("fio IOPS per class and job:", iops)
    limit = kubelab.THROTTLE["write_iops_device"]
    assert kubelab.THROTTLE["read_iops_device"] == limit
    for job in jobs:
        assert iops[(kubelab.THROTTLED_CLASS, job)] <= limit * 1.05, (job, iops)  # 100.0–100.3 measured
    assert iops[(kubelab.STORAGE_CLASS, "randread-8k-qd32")] > 2 * limit, iops
