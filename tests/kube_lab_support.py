"""What the real-cluster tests (marked ``kube_lab``) share: plans for the lab, waits for what pglab must leave
behind, and oracles read without pglab (pgbench's own output and -l logs, the results store's rows).

The lab itself is the session fixture ``lab`` in conftest.py: one lab for every kube_lab module of a pytest run.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gzip
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import pytest

from conftest import REPO
from pglab.store.sqlite import Store
from pglab.targets.local.ports import free_port

sys.path.insert(0, str(REPO / "tools" / "kube-lab"))
import kubelab

T = TypeVar("T")
NAMESPACE_GONE_S = 300  # a namespace's deletion waits for its pods and claims


def plan_text(lab: kubelab.KubeLab, name: str, namespace: str, body: str, target: str = "",
              instances: int = 3) -> str:
    """A plan for the lab as the studies place it: one instance per database node (a quorum of one synchronous
    standby), pgbench on a client node, each instance ready at the first 1 s probe after its PostgreSQL is (as in the
    lab's examples); ``target``: more lines of target.kubernetes."""
    apart = "required" if instances > 1 else "none"
    synchronous = "    synchronous: {method: any, number: 1}\n" if instances > 1 else ""
    return f"""
name: {name}
target:
  kubernetes:
    kubeconfig: {lab.kubeconfig}
    namespace: {namespace}
    cluster_name: {name}
    instances: {instances}
    image: {lab.image_names["postgresql"]}
    startup_probe_period: 1
    storage: {{size: 1Gi}}
    resources: {{cpu: 0.25, memory: 384Mi}}
{synchronous}    database: {{node_selector: {{pglab.io/role: database}}, anti_affinity: {apart}}}
    clients: {{node_selector: {{pglab.io/role: client}}, anti_affinity: {apart}}}
{target}postgres:
  parameters: {{shared_buffers: 32MB, max_connections: 40}}
dataset: {{scale: 1}}
{body}"""


# ------------------------------------------------------------------ the studies' example plans, run on the lab
# Each lab test that carries a study runs that study's example (examples/study-*.yaml) as written, at its smallest:
# the edits below (each an exact text found once in the example → its replacement) change sizes only, or what the
# lab needs (a fresh archive destination); study_plan adds the lab's kubeconfig. tests/test_study_examples.py checks
# that each result differs from its example in those fields alone.
STUDY_EDITS: dict[str, dict[str, str]] = {
    "study-backup-under-load.yaml": {  # tests/test_kube_lab_backup.py; the destination: DESTINATION's value
        "dataset: {scale: 10}": "dataset: {scale: 1}",
        "clients: [4]": "clients: [2]",
        "at: 10s": "at: 5s",
        "run: {duration: 60s}": "run: {duration: 40s}",  # a backup took 25 s+ on a loaded CI: 35 s left after it
        "destination: s3://pglab/study-backup-under-load-1": "destination: {destination}",
    },
    # tests/test_kube_lab_clusters.py (the storage-axis sweep): one client (each commit waits for its WAL flush,
    # which is what the classes differ in), 1 s fio jobs on a small file; 5 repeats, not the example's 3: the verdicts
    # rest on them, and at one client the host's disk, shared with the local tests, spread lab-local's TPS 55–111
    # in a CI run whose 3 repeats left it "no significant difference" from the throttled class (34 ± 6);
    # {memory}: the test's own third class (MEMORY_VALUE), appended to the study's two
    "study-storage-classes.yaml": {
        "namespace: pglab-study-classes": "namespace: {namespace}",
        "dataset: {scale: 10}": "dataset: {scale: 1}",
        "runtime: 5s, size: 128MiB": "runtime: 1s, size: 16MiB",
        "clients: [8]": "clients: [1]",
        "jobs: [2]": "jobs: [1]",
        "      cost: {monthly: 180, breakdown: {compute: 80, storage: 100}}\n":
            "      cost: {monthly: 180, breakdown: {compute: 80, storage: 100}}\n{memory}",
        "run: {duration: 20s, warmup: 2s, repeats: 3}": "run: {duration: 6s, warmup: 0s, repeats: 5}",
    },
    # tests/test_kube_lab_studies.py: every CPU step, workload and synchronous_commit level of the study, at 1
    # client, for 10 s each (the primary's exporter, read every 2 s, is read twice inside the window: the commits and
    # WAL figures; at 5 s it was read once); its two fio profiles for 1 s on 16 MiB, on the data and WAL volumes
    "study-cpu-sync-scaling.yaml": {
        "dataset: {scale: 10}": "dataset: {scale: 1}",
        "runtime: 5s, size: 128MiB": "runtime: 1s, size: 16MiB",
        "clients: [1, 4]": "clients: [1]",
        "run: {duration: 20s, warmup: 2s}": "run: {duration: 10s, warmup: 0s}",
    },
    # tests/test_kube_lab_clusters.py (the tenants test): both arrangements at 3 tenants each (the no-QoS one's
    # tenants alike, one tenant a tier in the other: the same density), fio for 1 s on 16 MiB per class, the
    # study's 20 s runs (8 s left a tenant with one cAdvisor sample inside its window, so no CPU figure, on a
    # loaded CI); the lab's Prometheus ({prometheus}: each tenant's CPU, memory and disk figures) and, not the
    # study's, the best-effort tier in a namespace of its own ({slow}: the lab's check of a tier placed apart)
    "study-qos-tiers.yaml": {
        "namespace: pglab-study-tiers": "namespace: {namespace}",
        "\npostgres:\n": "\n    prometheus: {prometheus}\npostgres:\n",  # the last line of target.kubernetes
        "  runtime: 5s\n  size: 128MiB\n": "  runtime: 1s\n  size: 16MiB\n",
        "{name: all, tenants: 6,": "{name: all, tenants: 3,",
        "{name: high, tenants: 2,": "{name: high, tenants: 1,",
        "{name: medium, tenants: 2,": "{name: medium, tenants: 1,",
        "{name: best-effort, tenants: 2,": "{name: best-effort, tenants: 1,",
        "storage: {class: lab-throttled, size: 1Gi}}": "storage: {class: lab-throttled, size: 1Gi}, namespace: {slow}}",
    },
    # tests/test_kube_lab_studies.py: its five fio profiles for 1 s on 16 MiB in the pod and on the node's own
    # directory of the same disk (the study's bare metal vs in-pod view: {host_path}, the lab's), then both
    # workloads at 1 client, 5 s × the example's 2 repeats
    "study-fio-then-pgbench.yaml": {
        "dataset: {scale: 10}": "dataset: {scale: 1}",
        "  runtime: 5s\n  size: 128MiB\n  paths: [data]\n":
            "  runtime: 1s\n  size: 16MiB\n  paths: [data]\n  host_path: '{host_path}'\n",
        "clients: [1, 4]": "clients: [1]",
        "run: {duration: 20s, repeats: 2}": "run: {duration: 5s, repeats: 2}",
    },
}
# the fields a study's edits may change (dotted paths; a list's items by index); the rest must be the example's
STUDY_SIZES = ("dataset.scale", "run.duration", "run.warmup", "run.repeats", "matrix.clients", "matrix.jobs",
               "matrix.scenario.*.at", "storage.runtime", "storage.size", "tenants.arrangements.*.tiers.*.tenants")
STUDY_LAB = ("target.kubernetes.kubeconfig", "target.kubernetes.namespace",
             "target.kubernetes.wal_archive.s3.destination", "storage.host_path", "target.kubernetes.prometheus.url",
             "target.kubernetes.prometheus.interval")
# Not part of study 002: the storage-axis test's third value of its storage axis, a class on memory (statically
# provisioned hostPath volumes on a tmpfs the test mounts), which carries its memory-vs-disk check. One of the two
# additions a study's lab plan makes beyond sizes and what the lab gives it, with study 001's best-effort tier's
# namespace (tests/test_study_examples.py checks both).
TMPFS_CLASS = "lab-tmpfs"
MEMORY_VALUE = (f"    - name: memory\n      storage: {{class: {TMPFS_CLASS}, size: 1Gi}}\n"
                "      cost: {monthly: 300, breakdown: {compute: 80, storage: 220}}\n")


def study_plan(example: str, kubeconfig: Path | str, **values: str) -> str:
    """``examples/<example>`` with its STUDY_EDITS (``{name}`` in a replacement: ``values[name]``) and the lab's
    kubeconfig."""
    text = (REPO / "examples" / example).read_text()
    for old, new in STUDY_EDITS[example].items():
        assert text.count(old) == 1, (example, old)
        wanted = set(re.findall(r"\{([a-z_]+)\}", new))
        assert wanted <= values.keys(), (example, new)  # a value the edit needs was not given
        for name in wanted:
            new = new.replace(f"{{{name}}}", values[name])
        text = text.replace(old, new)
    head = "target:\n  kubernetes:\n"
    assert text.count(head) == 1, example
    return text.replace(head, f"{head}    kubeconfig: {kubeconfig}\n")


def small_plan(lab: kubelab.KubeLab, name: str, namespace: str, body: str, target_extra: str = "") -> str:
    """One instance, no standby: the smallest Cluster the lab starts quickly."""
    return plan_text(lab, name, namespace, body, target_extra, instances=1)


def node_fault(lab: kubelab.KubeLab) -> str:
    """The plan's target.kubernetes.node_fault for the lab: its own node stop and start (as root, as the tests)."""
    script = REPO / "tools" / "kube-lab" / "kubelab.py"
    stop = [sys.executable, str(script), "node", "stop", "{node}"]
    start = [sys.executable, str(script), "node", "start", "{node}"]
    return f"    node_fault: {{stop: {stop}, start: {start}}}\n"


class DiskStats:
    """This machine's /proc/diskstats read every 0.1 s in a thread of the test while pglab runs: the oracle of
    the nodes' disk figures (the lab's nodes share this kernel; each node's disk is a loop device of its own).
    Each read is kept with the time just before and just after it."""

    def __init__(self, devices: list[str], every_s: float = 0.1) -> None:
        self.devices, self.every_s = set(devices), every_s
        self.samples: list[tuple[float, float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def start(self) -> DiskStats:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _read(self) -> None:
        while not self._stop.is_set():
            before = time.time()
            text = Path("/proc/diskstats").read_text()
            after = time.time()
            writes = {}
            for line in text.splitlines():
                f = line.split()
                if f[2] in self.devices:
                    writes[f[2]] = int(f[7])  # writes completed
            self.samples.append((before, after, writes))
            self._stop.wait(self.every_s)

    def bracket(self, device: str, first: float, last: float) -> tuple[int, int]:
        """The device's writes completed as of a read made between ``first`` and ``last`` lie between two of these
        reads: the last one over by ``first`` and the next one begun at ``last`` or later."""
        before = [w.get(device, 0) for _, t, w in self.samples if t <= first]
        after = [w.get(device, 0) for t, _, w in self.samples if t >= last]
        assert before and after, ("the read is not inside the oracle's reads", first, last)
        return before[-1], after[0]

    def writes(self, device: str, start: float, end: float) -> float:
        """Writes the device completed between start and end, each edge interpolated between the two reads
        around it (each read placed in the middle of its own before and after)."""
        ts = np.array([(t0 + t1) / 2 for t0, t1, _ in self.samples])
        counts = np.array([w.get(device, 0) for _, _, w in self.samples], dtype=float)
        assert ts[0] <= start and end <= ts[-1], ("the window is not inside the oracle's reads", start, end, ts[0])
        return float(np.interp(end, ts, counts) - np.interp(start, ts, counts))


def sampler_writes(log: Path, device: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(epochs before, epochs after, writes completed) of ``device`` in each complete block of pglab's disk-sampler
    log as kept in the run's folder (a block: ``pglab-diskstats <epoch> <node> <boot id>``, /proc/diskstats,
    ``pglab-diskstats end <epoch>``), read here by splitting its lines."""
    out: list[tuple[float, float, int]] = []
    stamp: float | None = None
    writes: int | None = None
    for line in log.read_text().splitlines():
        f = line.split()
        if f[:1] == ["pglab-diskstats"]:
            if f[1:2] == ["end"] and len(f) == 3 and stamp is not None and writes is not None:
                out.append((stamp, float(f[2]), writes))
            stamp, writes = (float(f[1]), None) if f[1] != "end" else (None, None)
        elif len(f) > 7 and f[2] == device:
            writes = int(f[7])
    return (np.array([t for t, _, _ in out]), np.array([u for _, u, _ in out]),
            np.array([w for _, _, w in out], dtype=float))


# ------------------------------------------------------------------ a real Prometheus scraping the lab
SCRAPE_S = 1  # the scrape interval of the lab's Prometheus: the plan's prometheus.interval
NODE_EXPORTER_PORT = 9100  # on each node's own address


# ------------------------------------------------------------------ builds ./setup.sh test makes beside the first tests
BUILD_WAIT_S = 3600  # from nothing, on 2 cores shared with the tests: the object store ~15 min, then Prometheus ~15


def built_already(name: str) -> bool:
    """Whether the lab build ``name`` is there now: the lab cache's, or done beside the tests (not failed, not under
    way), so that a test can start what needs it without waiting for a build from nothing."""
    folder = os.environ.get("PGLAB_KUBE_LAB_BUILDING")
    return not folder or (Path(folder) / f"{name}.path").exists()


def built_beside(name: str) -> Path | None:
    """The folder of the lab build ``name`` (objectstore, prometheus) that ./setup.sh test runs beside the lab's first
    tests (it names the folder where each says it is done: PGLAB_KUBE_LAB_BUILDING), waited for; None when nothing
    builds beside the tests (the build is then the lab cache's)."""
    folder = os.environ.get("PGLAB_KUBE_LAB_BUILDING")
    if not folder:
        return None
    done, failed, log = (Path(folder) / f"{name}.{ext}" for ext in ("path", "failed", "log"))
    deadline = time.monotonic() + BUILD_WAIT_S
    while not done.exists():
        if failed.exists() or time.monotonic() > deadline:
            said = log.read_text()[-1500:] if log.exists() else ""
            how = f"failed (exit {failed.read_text().strip()})" if failed.exists() else f"took over {BUILD_WAIT_S} s"
            pytest.fail(f"the lab's {name} build beside the tests {how}: {said}", pytrace=False)
        time.sleep(0.5)
    return Path(done.read_text().strip())


class Beside:
    """A sweep a test starts in a thread beside its own (its own namespace: as two teams share a cluster), ended
    before that test ends, its outcome (a value or the failure) kept for the module that checks it, which runs the
    sweep itself when nothing started it (run alone, say). A suite's track shorter by the sweep's length."""

    done: ClassVar[dict[str, Future[Any]]] = {}

    @classmethod
    @contextlib.contextmanager
    def running(cls, name: str, sweep: Callable[[], Any]) -> Iterator[None]:
        """``sweep`` under way while the block runs, waited for at its end whatever happened in it; its failure is
        raised where its outcome is taken, not here."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"beside-{name}") as pool:
            future = pool.submit(sweep)
            try:
                yield
            finally:
                concurrent.futures.wait([future])
                cls.done[name] = future

    @classmethod
    def take(cls, name: str, sweep: Callable[[], T]) -> T:
        """The outcome of the sweep ``name`` that ran beside another test (its failure raised here), else
        ``sweep()`` run now."""
        future = cls.done.pop(name, None)
        return future.result() if future is not None else sweep()


def prometheus_build() -> Path:
    """The Prometheus and node-exporter tools/kube-lab/prometheus/build.sh built into the lab cache."""
    if built := built_beside("prometheus"):
        return built
    builds = sorted((p for p in kubelab.cache_dir().glob("prometheus-*") if (p / ".complete").exists()),
                    key=lambda p: (p / ".complete").stat().st_mtime)
    if not builds:
        pytest.fail(f"no Prometheus build in {kubelab.cache_dir()}: ./setup.sh test builds it "
                    "(tools/kube-lab/prometheus/build.sh)", pytrace=False)
    return builds[-1]


class Prometheus:
    """A real Prometheus on this machine's loopback, scraping the lab as a cluster's would: a node-exporter on each
    node (in its network namespace, on its address; its instance label the node's name, as kube-prometheus
    relabels it; loop devices not filtered out: they are the nodes' disks), each node's kubelet
    /metrics/cadvisor, and the CloudNativePG instance pods' exporters found by Kubernetes service discovery."""

    def __init__(self, lab: kubelab.KubeLab, root: Path, namespace: str):
        build = prometheus_build()
        self.url = f"http://127.0.0.1:{free_port()}"
        pki = lab.root / "pki"
        config = {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": f"{SCRAPE_S}s"},
            "scrape_configs": [
                {"job_name": "node", "static_configs": [{"targets": [f"{n.ip}:{NODE_EXPORTER_PORT}"],
                                                         "labels": {"instance": n.name}} for n in lab.nodes]},
                {"job_name": "cadvisor", "scheme": "https", "metrics_path": "/metrics/cadvisor",
                 "tls_config": {"ca_file": str(pki / "ca.crt"), "cert_file": str(pki / "admin.crt"),
                                "key_file": str(pki / "admin.key")},
                 "static_configs": [{"targets": [f"{n.ip}:10250" for n in lab.nodes]}]},
                {"job_name": "cnpg", "kubernetes_sd_configs": [
                    {"role": "pod", "kubeconfig_file": str(lab.kubeconfig), "namespaces": {"names": [namespace]}}],
                 "relabel_configs": [
                     {"source_labels": ["__meta_kubernetes_pod_label_cnpg_io_podRole"], "regex": "instance",
                      "action": "keep"},
                     {"source_labels": ["__meta_kubernetes_pod_container_port_number"], "regex": "9187",
                      "action": "keep"},
                     {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                     {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}]},
            ],
        }
        root.mkdir(parents=True, exist_ok=True)
        (root / "prometheus.yml").write_text(json.dumps(config))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = root
        for n in lab.nodes:
            self._spawn(f"node_exporter-{n.name}", "nsenter", f"--net=/run/netns/{n.netns}", "--",
                        build / "node_exporter", f"--web.listen-address={n.ip}:{NODE_EXPORTER_PORT}",
                        "--collector.disable-defaults", "--collector.diskstats",
                        r"--collector.diskstats.device-exclude=^(z?ram|fd)\d+$")
        self._spawn("prometheus", build / "prometheus", f"--config.file={root / 'prometheus.yml'}",
                    f"--storage.tsdb.path={root / 'data'}", f"--web.listen-address={self.url[7:]}")
        deadline = time.monotonic() + 60  # a fresh Prometheus answers within seconds
        while True:
            try:
                if self.query("up")["result"]:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"Prometheus not answering after 60 s: {self.tail()}"
            time.sleep(0.5)

    def _spawn(self, name: str, *cmd: str | Path) -> None:
        with open(self.logs / f"{name}.log", "wb") as log:
            self.procs.append(subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT))

    def tail(self) -> str:
        return (self.logs / "prometheus.log").read_text(errors="replace")[-2000:]

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        args = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{urllib.parse.urlencode(args)}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return dict(body["data"])

    def sample_times(self, selector: str, start: float, end: float) -> list[float]:
        """The raw samples' timestamps of the one series ``selector`` names, between start and end."""
        result = self.query(f"{selector}[{math.ceil(end - start) + 1}s]", at=end)["result"]
        assert len(result) == 1, (selector, result)
        return [float(t) for t, _ in result[0]["values"] if start <= float(t) <= end]

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def namespace_gone(lab: kubelab.KubeLab, namespace: str, said: str = "", beside: tuple[str, ...] = ()) -> None:
    """pglab left nothing: its namespace gone, no volume left, no Cluster anywhere; the namespaces ``beside``
    (a sweep running beside this one) excepted."""
    deadline = time.monotonic() + NAMESPACE_GONE_S
    while time.monotonic() < deadline:
        proc = lab.kubectl("get", "namespace", namespace, check=False)
        if proc.returncode != 0 and "NotFound" in proc.stderr:
            break
        time.sleep(0.5)
    else:
        left = lab.kubectl(
            "get",
            "all,pvc",
            "-n",
            namespace,
            "-o",
            "custom-columns=KIND:.kind,NAME:.metadata.name,"
            "DELETED:.metadata.deletionTimestamp,GRACE:.spec.terminationGracePeriodSeconds,"
            "PHASE:.status.phase",
            check=False,
        ).stdout
        pytest.fail(
            f"namespace {namespace} still there {NAMESPACE_GONE_S} s after pglab ended; left:\n{left}\n"
            f"pglab said:\n{said[-3000:]}"
        )
    # the claims' volumes were released and removed too (the lab's provisioner deletes Released volumes)
    deadline = time.monotonic() + 60
    while _left(lab, "pv", beside) and time.monotonic() < deadline:
        time.sleep(1)
    assert _left(lab, "pv", beside) == []
    assert _left(lab, "clusters.postgresql.cnpg.io", beside) == []


def _left(lab: kubelab.KubeLab, kind: str, beside: tuple[str, ...]) -> list[str]:
    """The objects of ``kind`` in the whole lab but those of the namespaces ``beside`` (a volume's: its claim's)."""
    where = "{.spec.claimRef.namespace}" if kind == "pv" else "{.metadata.namespace}"
    jsonpath = "jsonpath={range .items[*]}{.metadata.name} " + where + '{"\\n"}{end}'
    rows = [line.split(" ", 1) for line in lab.kubectl("get", kind, "-A", "-o", jsonpath).stdout.splitlines()]
    return [row[0] for row in rows if row[0] and row[1:] not in [[n] for n in beside]]


def jobs(lab: kubelab.KubeLab, namespace: str) -> list[str]:
    proc = lab.kubectl("get", "jobs", "-n", namespace, "-o", "name", check=False, timeout=20)
    return [line.split("/", 1)[1] for line in proc.stdout.split()] if proc.returncode == 0 else []


def pgbench_tps(out: str) -> float:
    """pgbench's own TPS line, read here without pglab."""
    match = re.search(r"^tps = ([\d.]+) \(without initial connection time\)", out, re.M)
    assert match, out
    return float(match.group(1))


def _log_text(path: Path) -> str:
    """A -l log as pgbench wrote it: pglab keeps it gzip-compressed (``.gz``) once summarised."""
    return gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()


def txn_latencies_ms(run_dir: Path) -> np.ndarray:
    """Every transaction's latency in pgbench's -l logs shipped with the run, read here without pglab."""
    lat = [
        int(line.split()[2]) / 1000
        for f in sorted(run_dir.glob("pgbench.[0-9]*"))
        for line in _log_text(f).splitlines()
        if line.strip()
    ]
    return np.array(lat)


def txn_times(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """When each successful transaction of the -l logs began and ended (epoch s), read without pglab: it ended at
    time_epoch + time_us, its latency (µs) before."""
    rows = [
        (int(f[4]) + int(f[5]) / 1e6, int(f[2]) / 1e6)
        for path in sorted(run_dir.glob("pgbench.[0-9]*"))
        for line in _log_text(path).splitlines()
        if len(f := line.split()) >= 6 and f[2].isdigit()
    ]
    ended = np.array([e for e, _ in rows])
    return ended - np.array([lat for _, lat in rows]), ended


def rows(store: Store, sql: str, *args: Any) -> list[dict[str, Any]]:
    cur = store.conn.execute(sql, args)
    cols = [c[0] for c in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur]


def dev_of(path: Path) -> str:
    """The device (major:minor) a path is on, as this machine's kernel sees it."""
    st = os.stat(path)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


def storage_phase(lab: kubelab.KubeLab, results: Path,
                  values: list[str]) -> tuple[Store, int, str, dict[str, dict[str, dict[str, Any]]]]:
    """A finished storage-axis sweep's store, its id, and its storage phase's fio rows of each value's data path by
    job (every value the same jobs), all on one database node (that of the Cluster's one instance: fio runs before
    the first run), returned too."""
    store = Store.open(results, create=False)
    sweep = store.sweeps()[-1]
    assert sweep["status"] == "done"
    rows = store.fio_results(sweep["id"])
    (node,) = {f["label"].split("@")[1] for f in rows}
    assert lab.node(node).role == "database"
    assert {f["label"] for f in rows} == {f"{v}/data@{node}" for v in values}, rows
    by_value: dict[str, dict[str, dict[str, Any]]] = {v: {} for v in values}
    for f in rows:
        jobs = by_value[f["label"].split("/")[0]]
        assert f["job"] not in jobs, f  # one row per job and value
        jobs[f["job"]] = f
    assert all(set(jobs) == set(by_value[values[0]]) for jobs in by_value.values()), by_value
    return store, sweep["id"], node, by_value


# ------------------------------------------------------------------ what a lab leaves on the machine
def _out(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60).stdout


def cni_netns() -> set[str]:
    """The pods' network namespaces on this machine (the lab's CNI names them cni-*)."""
    return {p.name for p in Path("/run/netns").glob("cni-*")} if Path("/run/netns").exists() else set()


def leftovers(root: Path, cni_before: set[str]) -> dict[str, list[str]]:
    """Everything of the lab in ``root`` still on this machine, by kind (empty lists left out)."""
    me = os.getpid()
    found = {
        "processes": [f"{p.name}: {cmd[:120]}" for p in Path("/proc").iterdir() if p.name.isdigit()
                      and int(p.name) != me and str(root) in (cmd := _cmdline(p))],
        "mounts": [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                   if line.split()[1].startswith(str(root))],
        "node network namespaces": [n for n in _out("ip", "netns", "list").split() if n.startswith("pglab-kl-")],
        "pod network namespaces": sorted(cni_netns() - cni_before),
        "links": [n for line in _out("ip", "-o", "link").splitlines()
                  if (n := line.split(": ")[1].split("@")[0]).startswith(("pglabkube", "pglabkl"))],
        "loop devices": [line for line in _out("losetup", "-a").splitlines() if str(root) in line],
        "cgroups": [str(h) for h in Path("/sys/fs/cgroup").glob(f"*/{kubelab.CGROUP}")],
        "iptables rules": [r for r in _out("iptables", "-S").splitlines() if "pglab-kube-lab" in r],
        "log links": [str(p) for p in Path("/var/log/containers").glob("*.log")
                      if os.readlink(p).startswith(str(root))] if Path("/var/log/containers").exists() else [],
        "folder": [str(root)] if root.exists() else [],
    }
    return {k: v for k, v in found.items() if v}


def _cmdline(p: Path) -> str:
    try:
        return (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
