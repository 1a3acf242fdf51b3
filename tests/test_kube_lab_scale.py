"""pglab's Kubernetes target at scale, on the multi-node lab (tools/kube-lab): one point's load spread over two
pgbench pods (run.load_pods), checked against both pods' raw transaction logs read here without pglab,
and the run's disk, CPU and CloudNativePG figures read from a real Prometheus scraping the lab (a node-exporter
per node, in the node's network namespace, and each node's kubelet), checked against this machine's own
/proc/diskstats of the instance's node's disk and the primary's cgroup. Kept short for the CI track that runs
beside the whole suite: one sweep for both, a 1-instance Cluster on a database node, scale 1, one 10 s run.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import pglab
from kube_lab_support import SCRAPE_S, Prometheus, _log_text, kubelab, namespace_gone, small_plan
from pglab.store.sqlite import Store

pytestmark = pytest.mark.kube_lab

DURATION_S = 10


def pod_log(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One load pod's -l logs, read here: each successful transaction's start and end (epoch s: time_epoch +
    time_us / 1e6, its latency before) and latency (µs)."""
    rows = [
        (int(f[4]) + int(f[5]) / 1e6, int(f[2]))
        for path in sorted(folder.glob("pgbench.[0-9]*"))
        for line in _log_text(path).splitlines()
        if len(f := line.split()) >= 6 and f[2].isdigit()
    ]
    ended = np.array([e for e, _ in rows])
    lat_us = np.array([lat for _, lat in rows], dtype=np.int64)
    return ended - lat_us / 1000.0 / 1000.0, ended, lat_us


# ------------------------------------------------------------------ one point over two pgbench pods
def test_a_point_over_two_load_pods_merges_exactly(sweep: Sweep) -> None:
    results = sweep.results
    store = Store.open(results, create=False)
    [run] = store.runs()
    assert run.status == "ok", run.metrics
    m: dict[str, Any] = run.metrics
    run_dir = store.dir / run.dir
    assert m["load_pods"] == 2

    # each pod ran its share of the 5 clients and 2 threads (3 + 2 clients, one thread each), as pgbench says
    starts, ends, lats = [], [], []
    for index, clients in ((0, 3), (1, 2)):
        folder = run_dir / f"load-{index}"
        out = (folder / "pgbench.out").read_text()
        assert re.search(rf"^number of clients: {clients}$", out, re.M), out
        assert re.search(r"^number of threads: 1$", out, re.M), out
        # its progress is kept: pgbench's own per-second lines
        assert re.search(r"^progress: \d+\.\d+ s, [\d.]+ tps", (folder / "pgbench.err").read_text(), re.M)
        began, ended, lat = pod_log(folder)
        assert lat.size > 0
        starts.append(began)
        ends.append(ended)
        lats.append(lat)

    # the common window: from the last pod's first transaction start to the first pod's last transaction end
    start = max(float(b.min()) for b in starts)
    end = min(float(e.max()) for e in ends)
    assert end > start
    assert m["window_s"] == pytest.approx(end - start, abs=1e-6)
    assert m["load_start_skew_s"] == pytest.approx(abs(float(starts[0].min()) - float(starts[1].min())), abs=1e-6)
    # the pods loaded together for most of the run: the barrier started both after pod 0's dataset reset
    assert end - start > DURATION_S / 2, (start, end)

    # TPS: every transaction of either pod that ended inside the window, over its length
    inside = [(e >= start) & (e <= end) for e in ends]
    count = sum(int(k.sum()) for k in inside)
    assert m["transactions"] == count
    assert m["tps"] == pytest.approx(count / (end - start), rel=1e-9)
    # latency: the merged logs' transactions of the window, percentiles exactly as numpy computes them
    merged_ms = np.concatenate([lat[k] for lat, k in zip(lats, inside, strict=True)]) / 1000.0
    assert m["logged_transactions"] == merged_ms.size
    for q in (50, 95, 99):
        assert m[f"latency_p{q}_ms"] == pytest.approx(float(np.percentile(merged_ms, q)), rel=1e-12), q
    assert m["latency_avg_ms"] == pytest.approx(float(merged_ms.mean()), rel=1e-9)
    assert m["latency_max_ms"] == pytest.approx(float(merged_ms.max()), rel=1e-12)
    # the run's histogram is the two pods' histograms added, and holds exactly the window's transactions
    hist = json.loads((run_dir / "latency_histogram.json").read_text())
    pods_hist = [json.loads((run_dir / f"load-{i}" / "latency_histogram.json").read_text()) for i in (0, 1)]
    assert hist["count"] == merged_ms.size == sum(h["count"] for h in pods_hist)
    added: dict[int, int] = {}
    for h in pods_hist:
        for b, n in zip(h["bucket"], h["n"], strict=True):
            added[b] = added.get(b, 0) + n
    assert dict(zip(hist["bucket"], hist["n"], strict=True)) == added
    assert hist["min"] == round(merged_ms.min() * 1000) and hist["max"] == round(merged_ms.max() * 1000)

    # per-pod progress is stored as series beside the merged per-second one
    sources = {src for _, src, _, _ in store.series(run.id)}
    assert {"pgbench", "pgbench:0", "pgbench:1"} <= sources, sources
    record = json.loads((run_dir / "run.json").read_text())
    assert record["load"]["pods"] == 2 and [p["clients"] for p in record["load"]["per_pod"]] == [3, 2]
    store.close()

    # the report says how many pods drove the point
    table = pglab("report", str(results), "--format", "csv")
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()[:2]
    assert row.split(",")[header.split(",").index("load_pods")] in ("2", "2.0"), table.stdout
    terminal = pglab("report", str(results))
    assert "load_pods" in terminal.stdout, terminal.stdout


# ------------------------------------------------------------------ figures from a real Prometheus scraping the lab
CGROUP_CPU = Path("/sys/fs/cgroup/cpuacct") / kubelab.CGROUP  # cgroup v1: <node>/kubepods/… (cgroupfs driver)


class Oracle(threading.Thread):
    """This machine's own counters every 0.1 s while pglab runs: /proc/diskstats of every node's disk (the
    instance lands on one of them) and the cgroup CPU time (cpuacct.usage) of the primary's postgres container,
    found by its pod's uid."""

    def __init__(self, lab: kubelab.KubeLab, namespace: str, pod: str, devices: list[str]):
        super().__init__(daemon=True)
        self.lab, self.namespace, self.pod, self.devices = lab, namespace, pod, devices
        # major:minor → (ts, writes completed, sectors written)
        self.disk: dict[str, list[tuple[float, int, int]]] = {d: [] for d in devices}
        self.cpu: list[tuple[float, int]] = []  # (ts, ns of CPU)
        self.halt = threading.Event()
        self.cgroup: Path | None = None
        self.next_look = 0.0

    def _find_cgroup(self) -> Path | None:
        proc = self.lab.kubectl("get", "pod", self.pod, "-n", self.namespace, "-o", "json", check=False, timeout=10)
        if proc.returncode != 0:
            return None
        pod = json.loads(proc.stdout)
        cid = next((c.get("containerID", "") for c in pod["status"].get("containerStatuses", [])
                    if c["name"] == "postgres" and c.get("state", {}).get("running")), "")
        if not cid:
            return None
        found = list(CGROUP_CPU.glob(f"**/pod{pod['metadata']['uid']}/{cid.split('://')[-1]}/cpuacct.usage"))
        return found[0] if found else None

    def run(self) -> None:
        while not self.halt.is_set():
            ts = time.time()
            for line in Path("/proc/diskstats").read_text().splitlines():
                f = line.split()
                if (number := f"{f[0]}:{f[1]}") in self.disk:
                    self.disk[number].append((ts, int(f[7]), int(f[9])))
            if self.cgroup is None and time.monotonic() >= self.next_look:
                self.next_look = time.monotonic() + 1
                self.cgroup = self._find_cgroup()
            if self.cgroup is not None:
                with contextlib.suppress(OSError, ValueError):  # the pod went: the run is over
                    before = time.time()
                    used = int(self.cgroup.read_text())
                    self.cpu.append(((before + time.time()) / 2, used))
            self.halt.wait(0.1)


def growth(samples: list[tuple[float, int]], first: tuple[float, float],
           last: tuple[float, float]) -> tuple[int, int]:
    """The fewest and most a counter can have grown between a read made during ``first`` (earliest, latest time)
    and one made during ``last``, from the oracle's own samples around them."""
    ts = [t for t, _ in samples]
    after_first = bisect.bisect_left(ts, first[1])  # first sample at or after the first read
    before_last = bisect.bisect_right(ts, last[0]) - 1  # last sample at or before the last read
    before_first = bisect.bisect_right(ts, first[0]) - 1
    after_last = bisect.bisect_left(ts, last[1])
    assert before_first >= 0 and after_last < len(ts) and after_first <= before_last, (
        "the oracle's samples do not cover the reads", first, last, ts[:1], ts[-1:])
    return (samples[before_last][1] - samples[after_first][1],
            samples[after_last][1] - samples[before_first][1])


def test_disk_and_cpu_figures_from_a_real_prometheus(sweep: Sweep) -> None:
    prom, oracle, name, ns = sweep.prometheus, sweep.oracle, sweep.name, sweep.namespace
    store = Store.open(sweep.results, create=False)
    [run] = store.runs()
    m: dict[str, Any] = run.metrics
    run_dir = store.dir / run.dir
    record = json.loads((run_dir / "run.json").read_text())
    start, end = record["window"]
    env = json.loads(store.sweeps()[-1]["environment"])
    assert env["prometheus"]["url"] == prom.url and env["prometheus"]["version"] == "3.16.0"

    # disk: the instance's volume is on its node's own disk (a loop device of that node), its writes as this
    # machine's /proc/diskstats counted them. pglab's figure is the writes of that node's node-exporter scrapes
    # around the window, the edge intervals prorated: between the writes from the first to the last scrape inside
    # the window and those from the last before it to the first after it. A scrape reads /proc/diskstats during
    # [its timestamp, + its duration].
    assert record["disk"]["source"] == "prometheus"
    assert not (run_dir / "disk").exists()  # no disk sampler ran
    instance = record["disk"]["instances"][f"{name}-1"]
    node = instance["node"]
    assert sweep.lab.node(node).role == "database" and record["placement"]["instances"] == {f"{name}-1": node}
    # the two load pods spread over the two client nodes, one each
    assert sorted(record["placement"]["pgbench"].values()) == sorted(
        n.name for n in sweep.lab.nodes if n.role == "client"), record["placement"]
    device = instance["volumes"][0]["device"]
    assert device == sweep.lab.node_device(node), (instance, node)  # its own node's disk, none of the others'
    number = device_of(sweep.lab, node)
    writes = f'node_disk_writes_completed_total{{instance="{node}",device="{device}"}}'
    stamps = prom.sample_times(writes, start - 3 * SCRAPE_S, end + 3 * SCRAPE_S)
    took = max(float(r["value"][1]) for r in prom.query(
        f'max_over_time(scrape_duration_seconds{{job="node"}}[{math.ceil(end - start) + 10}s])', at=end + 5
    )["result"])
    a_in = min(t for t in stamps if t >= start)
    b_in = max(t for t in stamps if t <= end)
    a_out = max(t for t in stamps if t <= start)
    b_out = min(t for t in stamps if t >= end)
    disk = [(t, w) for t, w, _ in oracle.disk[number]]
    fewest, _ = growth(disk, (a_in, a_in + took), (b_in, b_in + took))
    _, most = growth(disk, (a_out, a_out + took), (b_out, b_out + took))
    counted = m["write_iops"] * m["window_s"]
    assert fewest - 0.5 <= counted <= most + 0.5, (counted, fewest, most, stamps, start, end)
    assert m["write_iops"] > 0

    # CPU of the primary's postgres container: cAdvisor's counter (the cgroup's cpuacct.usage, stamped with when
    # it read it) between its first and last sample inside the window, against the same cgroup read here
    cpu = record["cpu"]
    assert cpu["source"] == "prometheus"
    usage = f'container_cpu_usage_seconds_total{{namespace="{ns}",pod="{name}-1",container="postgres"}}'
    stamps = prom.sample_times(usage, start, end)
    assert len(stamps) >= 2, stamps
    t0, t1 = stamps[0], stamps[-1]
    slack = 0.1  # cAdvisor stamps a sample right after reading the cgroup
    fewest, most = growth(oracle.cpu, (t0 - slack, t0), (t1 - slack, t1))
    used_ns = m["primary_cpu_cores"] * (t1 - t0) * 1e9
    assert fewest <= used_ns <= most, (used_ns, fewest, most, t0, t1)
    assert m["server_cpu_cores"] == m["primary_cpu_cores"] > 0  # one instance
    # the two pgbench pods' containers, each from its own samples
    assert len(cpu["groups"]["client"]["per_pod"]) == 2, cpu
    assert m["client_cgroup_cpu_cores"] == pytest.approx(
        sum(p["cores"] for p in cpu["groups"]["client"]["per_pod"].values()))
    assert m["client_cgroup_cpu_cores"] > 0

    # CloudNativePG's figures came from Prometheus too, under the exporter's names
    assert record["exporter"]["source"] == "prometheus"
    assert m["commits_s"] > 0 and m["wal_mb_s"] > 0
    assert (run_dir / "prometheus" / "exporter.json").is_file()
    store.close()


def device_of(lab: kubelab.KubeLab, node: str) -> str:
    """major:minor of a node's disk (its volumes' block device), as this machine's kernel says."""
    st = os.stat(lab.node_disk(node))
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


# ------------------------------------------------------------------ the one sweep both tests read
LOAD = f"""matrix: {{clients: [5], jobs: [2]}}
run: {{duration: {DURATION_S}s, load_pods: 2}}
"""


@dataclass
class Sweep:
    results: Path
    name: str
    namespace: str
    prometheus: Prometheus
    oracle: Oracle
    lab: kubelab.KubeLab


@pytest.fixture(scope="module")
def sweep(lab: kubelab.KubeLab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sweep]:
    """One pglab sweep for the module (a Cluster's life is most of a run's time on the lab): one point over two
    pgbench pods, its disk, CPU and CloudNativePG figures from a real Prometheus scraping the lab, this machine's
    own counters sampled meanwhile."""
    tmp = tmp_path_factory.mktemp("scale")
    ns, name = "pglab-e2e-scale", "scale"
    prom = Prometheus(lab, tmp / "prometheus", ns)
    oracle = Oracle(lab, ns, f"{name}-1", [device_of(lab, n.name) for n in lab.nodes])
    try:
        plan = tmp / "plan.yaml"
        extra = f"    prometheus: {{url: '{prom.url}', interval: {SCRAPE_S}s}}\n"
        plan.write_text(small_plan(lab, name, ns, LOAD, extra))
        results = tmp / "results"
        oracle.start()
        proc = pglab("run", str(plan), "--results", str(results), timeout=1200)
        oracle.halt.set()
        oracle.join()
        assert proc.returncode == 0, proc.stdout + proc.stderr
        namespace_gone(lab, ns, proc.stderr)
        yield Sweep(results, name, ns, prom, oracle, lab)
    finally:
        oracle.halt.set()
        prom.stop()
