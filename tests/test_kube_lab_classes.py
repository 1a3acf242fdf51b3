"""The multi-node lab's two storage classes compared by a storage axis, on the real lab (tools/kube-lab) with the
real CloudNativePG operator: "lab-local" (each node's own disk) and "lab-throttled" (each node's second disk, its
loop device limited by a cgroup v1 blkio throttle, kubelab.THROTTLE). The throttled class must come out slower by
pglab's own verdict, and each class's volumes must be on their node's own device for that class.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import pglab
from kube_lab_support import dev_of, kubelab, namespace_gone, pgbench_tps, small_plan, storage_phase

pytestmark = pytest.mark.kube_lab

AXIS = """storage: {profiles: [wal-fdatasync-8k], runtime: 3s, size: 64MiB, paths: [data]}
matrix:
  clients: [1]
  jobs: [1]
  storage:
    - {name: fast, storage: {class: lab-local, size: 1Gi}, cost: {monthly: 100}}
    - {name: throttled, storage: {class: lab-throttled, size: 1Gi}, cost: {monthly: 40}}
run: {duration: 6s, repeats: 3}
"""
CLASSES = {"fast": kubelab.STORAGE_CLASS, "throttled": kubelab.THROTTLED_CLASS}


def test_the_throttled_class_is_slower_and_each_class_is_on_its_own_device(lab: kubelab.KubeLab,
                                                                             tmp_path: Path) -> None:
    ns = "pglab-e2e-classes"
    plan = tmp_path / "plan.yaml"
    plan.write_text(small_plan(lab, "cl", ns, AXIS).replace("cpu: 0.25, memory", "cpu: 0.5, memory"))
    results = tmp_path / "results"
    proc = pglab("run", str(plan), "--results", str(results), timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    namespace_gone(lab, ns, proc.stderr)
    # every node has a disk per class, each a loop device of its own
    disks = {(n.name, c): dev_of(lab.node_disk(n.name, c)) for n in lab.nodes for c in CLASSES.values()}
    assert len(set(disks.values())) == len(disks), disks
    for (node_name, cls), dev in disks.items():
        loop = lab.node_device(node_name, cls)
        assert Path(f"/sys/block/{loop}/dev").read_text().strip() == dev, (node_name, cls, loop)

    # the storage phase: each class's fio volume on that class's disk of its node
    store, sweep_id, node, fio_rows = storage_phase(lab, results, list(CLASSES))
    iops = {}
    for value, cls in CLASSES.items():
        row = fio_rows[value]
        mount = (results / "storage" / value / "data" / node / "volume-mount.txt").read_text().split()
        assert mount[2] == disks[(node, cls)], (value, mount, disks)
        assert row["device"].split()[0] == disks[(node, cls)], row
        raw = json.loads((results / "storage" / value / "data" / node / f"{row['job']}.json").read_text())["jobs"][0]
        iops[value] = raw["write"]["iops"]
        assert row["iops"] == iops[value] > 0
    # in the pod, each 8 KiB write and its fdatasync are at least one request: the throttle's request rate bounds
    # them (blk-throttle lets a slice's first burst through: a quarter over)
    assert iops["throttled"] <= kubelab.THROTTLE["write_iops_device"] * 1.25, iops

    # each run's instance volume: on its class's disk of the instance's node
    runs = [r for r in store.runs(sweep_id) if r.status == "ok"]
    assert sorted((r.axes["storage"], r.repeat) for r in runs) == [(v, k) for v in CLASSES for k in (1, 2, 3)]
    tps: dict[str, list[float]] = {v: [] for v in CLASSES}
    for r in runs:
        run_dir = store.dir / r.dir
        assert r.metrics["tps"] == pgbench_tps((run_dir / "pgbench.out").read_text()) > 0
        tps[r.axes["storage"]].append(r.metrics["tps"])
        (instance,) = json.loads((run_dir / "disk" / "disk.json").read_text())["instances"].values()
        (volume,) = instance["volumes"]
        expected = disks[(instance["node"], CLASSES[r.axes["storage"]])]
        assert volume["how"].endswith(f"on device {expected}"), (r.axes, volume, disks)
    store.close()

    # pglab's own verdict: the throttled class is slower, significantly
    cmp = pglab("compare", str(results), "--axis", "storage", "--a", "fast", "--b", "throttled", "--format", "json")
    assert cmp.returncode == 0, cmp.stderr
    (row,) = json.loads(cmp.stdout)
    assert row["tps_verdict"] == "slower", (row, tps)
    # and its cost table from each class's own price
    cost = pglab("report", str(results), "--table", "cost", "--format", "json")
    assert cost.returncode == 0, cost.stderr
    per = {c["storage"]: c for c in json.loads(cost.stdout)}
    assert per["fast"]["per_tps"] == pytest.approx(100 / np.mean(tps["fast"]))
    assert per["throttled"]["per_tps"] == pytest.approx(40 / np.mean(tps["throttled"]))
