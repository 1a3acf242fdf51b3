"""What the Kubernetes tests share, written once: the small plan they run, the pod logs of real tools the fake's
Jobs print (tests/data/k8s), the sweep run against the fake, the CLI in this process, and the checks of what was
posted and deleted. The fake itself is tests/k8s_fake/; its fixtures (``k8s_api``, ``fake``) are in conftest.py."""

from __future__ import annotations

import functools
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kubernetes import client

from k8s_fake import FakeAPI, results_log
from pglab.drivers import kubernetes as k8s_driver
from pglab.engine.sweep import run_sweep
from pglab.engine.types import SweepResult
from pglab.plan.expand import Point
from pglab.plan.load import parse_plan
from pglab.store.sqlite import Store
from pglab.workloads.pgbench import ProgressPoint

DATA = Path(__file__).parent / "data" / "k8s"
PGBENCH = DATA / "pgbench15"
FIO = DATA / "fio333"
TXN_LOGS = ("pgbench.25728", "pgbench.25728.1")
JOBS = "/apis/batch/v1/namespaces/bench/jobs"
CLUSTER = "/apis/postgresql.cnpg.io/v1/namespaces/bench/clusters/pg"
JOB_S = 1.2  # how long the fake keeps a run's Job running (timed_log)

# ------------------------------------------------------------------ the plan
PLAN_HEADER = """
name: k
target:
  kubernetes:
    namespace: bench
    cluster_name: pg
    instances: 2
    resources: {cpu: 1, memory: 1Gi}
"""


# a plan of tenants: the target their Clusters (mt-<tenant>) are made from, before its tenants: section
TENANTS_TARGET = """
name: mt
target:
  kubernetes:
    namespace: bench
    cluster_name: mt
    resources: {cpu: 1, memory: 1Gi}
    storage: {class: standard, size: 10Gi}
"""


def k8s_plan(*sections: str, kubernetes: tuple[str, ...] = ()) -> str:
    """The tests' plan: namespace bench, Cluster pg of 2 instances (1 CPU, 1 GiB) and the ``kubernetes`` lines
    given, then these top-level sections (``matrix: …``, ``run: …``, ``storage: …``), a line each."""
    return PLAN_HEADER + "".join(f"    {k}\n" for k in kubernetes) + "".join(f"{s}\n" for s in sections)


# ------------------------------------------------------------------ what the fake's Jobs print
def pod_log(job: str) -> str:
    """What each Job of the plan prints, from the real outputs in tests/data/k8s."""
    if re.search(r"-fio-data(-\d+)?$", job):  # the storage phase's Job of a node
        files = {f.name: f.read_text() for f in FIO.iterdir()}
        return results_log({**files, "fio-version.txt": "fio-3.33\n"}, text="")
    if job.endswith("-pgbench-init"):
        init = (PGBENCH / "init.log").read_text()
        return results_log({"init.log": init}, text=init)
    files = {name: (PGBENCH / name).read_text() for name in ("pgbench.out", "pgbench.err", *TXN_LOGS)}
    return results_log({**files, "reset.log": "TRUNCATE TABLE\nVACUUM\n"}, text="")


def statements_row(userid: int | None, queryid: int | None, query: str, calls: int, ms: float,
                   **more: float) -> dict[str, Any]:
    """A row of pg_stat_statements as to_jsonb gives it (userid an oid: text)."""
    return {"userid": None if userid is None else str(userid), "dbid": "16384", "toplevel": True,
            "queryid": queryid, "query": query, "calls": calls, "total_exec_time": ms, "rows": calls,
            "shared_blks_hit": 4 * calls, "shared_blks_read": 0, "shared_blks_dirtied": 0, "shared_blks_written": 0,
            "wal_bytes": 0, **more}


def statements_read(epoch: float, rows: list[dict[str, Any]], dealloc: int) -> str:
    """One read of pg_stat_statements as a run Job's psql -XAt writes it (targets.kubernetes.statements): the pod's
    epoch, the view as one jsonb line, the evictions."""
    return f"{epoch:.9f}\n{json.dumps({'version': '1.10', 'statements': rows})}\n{dealloc}\n"


def timed_log(api: FakeAPI) -> Callable[[str], str]:
    """A run Job whose transactions (per-transaction log) end between 0.3 and 0.9 s after the Job was created,
    this machine's clock: the window falls among the exporter reads pglab takes while the Job runs."""

    def log(job: str) -> str:
        if "-run-" not in job:
            return pod_log(job)
        t0 = api.job_created_at[job]
        ends = [t0 + 0.3 + 0.6 * i / 59 for i in range(60)]
        txn = "".join(f"0 {i} 1000 0 {int(e)} {int((e % 1) * 1e6)}\n" for i, e in enumerate(ends))
        files = {"pgbench.out": (PGBENCH / "pgbench.out").read_text(), "pgbench.err": "", "pgbench.77": txn}
        return results_log(files, text="")

    return log


def sample_latencies() -> tuple[np.ndarray, np.ndarray]:
    """(latency ms, end epoch s) of every transaction in the sample's -l logs, read here without pglab."""
    lat, end = [], []
    for name in TXN_LOGS:
        for line in (PGBENCH / name).read_text().splitlines():
            f = line.split()
            lat.append(int(f[2]) / 1000)
            end.append(int(f[4]) + int(f[5]) / 1e6)
    return np.array(lat), np.array(end)


# ------------------------------------------------------------------ the sweep against the fake
class Recorder:
    """An observer that keeps what the CLI would show."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.finished: list[tuple[str, int, str]] = []

    def log(self, message: str) -> None:
        self.messages.append(message)

    def sweep_started(self, runs: int, estimate_s: float | None, at_most: bool = False) -> None:
        self.messages.append(f"sweep of {runs} runs")

    def run_started(self, point: Point, repeat: int, phase: str) -> None:
        pass

    def progress(self, p: ProgressPoint) -> None:
        pass

    def run_finished(self, point: Point, repeat: int, status: str, metrics: dict[str, Any]) -> None:
        self.finished.append((point.label(), repeat, status))


def run(api_client: client.ApiClient, tmp_path: Path, text: str, **kw: Any) -> SweepResult:
    """The Kubernetes sweep of ``text`` against the fake, polling fast, results in tmp_path/results."""
    plan = parse_plan(text, base_dir=tmp_path)
    kw.setdefault("ready_timeout_s", 5.0)
    observer, force_new, results = kw.pop("observer", Recorder()), kw.pop("force_new", False), tmp_path / "results"
    driver = k8s_driver.KubernetesDriver(plan, text, tmp_path, results, observer, api=api_client, poll_s=0.01, **kw)
    return run_sweep(driver, plan, text, tmp_path, results, observer, force_new=force_new)


def rows(store: Store, sql: str, *args: Any) -> list[dict[str, Any]]:
    cur = store.conn.execute(sql, args)
    cols = [c[0] for c in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur]


def assert_all_deleted(api: FakeAPI) -> None:
    deleted = {p for m, p in api.requests if m == "DELETE"}
    assert api.created and set(api.created) <= deleted, set(api.created) - deleted
    assert api.objects == {}


def started(api: FakeAPI) -> list[tuple[int, str]]:
    """(index in ``api.requests``, name) of the benchmark's Jobs created and of the runs exec'd in its client pods
    (a run keeps its Job's name), in order; the volume probes, the disk figures' helpers, left out."""
    return sorted([*((i, n) for i, n in api.job_posts if "-volumes-" not in n), *((i, n) for i, n, _ in api.execs)])


def posted_jobs(api: FakeAPI, since: int = 0) -> list[str]:
    """The benchmark's Jobs and exec'd runs (``started``) in the order they started, from request ``since`` on."""
    return [name for i, name in started(api) if i >= since]


def job_posts(api: FakeAPI) -> list[int]:
    """Where in ``api.requests`` the benchmark's Jobs were created or its runs exec'd."""
    return [i for i, _ in started(api)]


# ------------------------------------------------------------------ the command line, the manifests' checker
def kubeconfig(tmp_path: Path, api_client: client.ApiClient) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": api_client.configuration.host}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}]}))
    return path


def cli(monkeypatch: pytest.MonkeyPatch, *args: str, ready_timeout_s: float = 3.0) -> int:
    """pglab's own entry point in this process, with the sweep's polling shortened (the plan is untouched). The fake
    Cluster is healthy at its third read: 3 s for it leaves room on a loaded machine (0.3 s once did not)."""
    from pglab import cli as cli_module

    # the factory looks the driver up when it builds it: a faster-polling one, the plan untouched
    monkeypatch.setattr(k8s_driver, "KubernetesDriver", functools.partial(k8s_driver.KubernetesDriver, poll_s=0.01,
                                                                          ready_timeout_s=ready_timeout_s))
    monkeypatch.setattr(sys, "argv", ["pglab", *args])
    with pytest.raises(SystemExit) as exc:
        cli_module.main()
    return int(exc.value.code or 0)


def check(checker: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    """tools/cnpg-check on rendered manifests: CloudNativePG's Go types, strictly decoded."""
    return subprocess.run([str(checker), *map(str, files)], capture_output=True, text=True, timeout=60, check=False)


# ------------------------------------------------------------------ a disk sampler's counters (fake nodes)
# per second on each node: (writes, sectors per write, ms per write, I/O ms) of vdb, the database volume
LOAD = {"node-1": (300, 16, 2, 400), "node-2": (100, 8, 1, 150)}


def counters(k: int, node: str) -> dict[str, list[int]]:
    """The counters after ``k`` seconds: vdb writes at the node's rate (and a few reads), vda a little."""
    w, sect, ms, io = LOAD[node]
    vdb = [10 * k, 0, 80 * k, 5 * k, w * k, 3 * k, w * sect * k, w * ms * k, 1, io * k, (w * ms + 5) * k,
           0, 0, 0, 0, 2 * k, 1 * k]
    vda = [1000 + k, 10, 8000 + 8 * k, 500 + k, 2000, 5, 16000, 900, 0, 1200 + 3 * k, 1400 + 4 * k,
           0, 0, 0, 0, 40, 20]
    return {"vda": vda, "vdb": vdb}


def node_blocks(node: str) -> list[tuple[float, dict[str, list[int]]]]:
    """One block a second over the sample run's window and 5 s either side, stamps a little off the second."""
    lat, end = sample_latencies()
    first, last = math.floor(float((end - lat / 1000).min())) - 5, math.ceil(float(end.max())) + 5
    return [(first + k + 0.000217 * (k % 3), counters(k, node)) for k in range(last - first + 1)]
