"""The Kubernetes sweep's axes that change the Cluster between points (matrix.cpus, matrix.parameters), and the
instances' exporter read through the pod proxy, against the fake API server of tests/k8s_fake.py.

The fake plays CloudNativePG's rolling update: after a merge PATCH of the Cluster's resources or parameters, one
more read still reports it healthy with the old pods (the operator has not reconciled yet), then it reads
"Upgrading cluster" while the instance pods are recreated with the new spec, replicas first, the primary last.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from k8s_fake import FakeAPI, serve
from pglab.plan.load import parse_plan
from pglab.store.sqlite import Store
from pglab.targets.kubernetes.orchestrate import K8sError
from pglab.targets.kubernetes.render import cluster, cpu_quantity, millicores, render
from test_k8s_run import JOBS, assert_all_deleted, pod_log, posted_jobs, rows, run

CLUSTER = "/apis/postgresql.cnpg.io/v1/namespaces/bench/clusters/pg"

CPU_PLAN = """
name: k
target:
  kubernetes:
    namespace: bench
    cluster_name: pg
    instances: 2
    resources: {cpu: 1, memory: 1Gi}
matrix: {clients: [1, 2], jobs: [1], cpus: [0.5, 2]}
run: {duration: 4s}
"""


@pytest.fixture
def fake() -> Iterator[tuple[FakeAPI, client.ApiClient]]:
    with serve() as (api, api_client):
        api.default_log = pod_log
        yield api, api_client


def amounts(cpu: str) -> dict[str, Any]:
    return {"requests": {"cpu": cpu, "memory": "1Gi"}, "limits": {"cpu": cpu, "memory": "1Gi"}}


# ------------------------------------------------------------------ matrix.cpus
def test_cpu_quantities() -> None:
    assert [cpu_quantity(c) for c in (0.5, 1, 1.5, 2, 0.25)] == ["500m", "1", "1500m", "2", "250m"]
    assert [millicores(q) for q in ("500m", "1", "1.5", "2", "1500m")] == [500, 1000, 1500, 2000, 1500]


def test_the_cluster_is_rendered_at_the_first_cpu_step(tmp_path: Path) -> None:
    plan = parse_plan(CPU_PLAN, base_dir=tmp_path)
    assert cluster(plan)["spec"]["resources"] == amounts("500m")  # not the target's cpu: 1
    (m,) = [m for m in render(plan, tmp_path) if m.kind == "Cluster"]
    assert m.body["spec"]["resources"] == amounts("500m")


def test_cpu_steps_patch_the_cluster_wait_for_the_rollout_and_record_it(fake: tuple[FakeAPI, client.ApiClient],
                                                                       tmp_path: Path) -> None:
    api, api_client = fake
    seen_at_job: dict[str, dict[str, Any]] = {}
    api.on_job_created = lambda job: seen_at_job.setdefault(job, api.pod_resources())
    result = run(api_client, tmp_path, CPU_PLAN)
    assert (result.ok, result.failed) == (4, 0)
    assert posted_jobs(api) == ["pg-pgbench-init", "pg-run-0000-1", "pg-run-0001-1", "pg-run-0002-1",
                                "pg-run-0003-1"]

    # created at the first step; one patch, whole resources (requests = limits, memory kept), between the steps
    (created,) = [b for b in api.posted if b["kind"] == "Cluster"]
    assert created["spec"]["resources"] == amounts("500m")
    assert api.patches == [{"spec": {"resources": amounts("2")}}]
    patch_at = api.requests.index(("PATCH", CLUSTER))
    posts = [i for i, (m, p) in enumerate(api.requests) if m == "POST" and p == JOBS]
    assert posts[2] < patch_at < posts[3]  # after both clients of step 0.5, before the first of step 2
    # the Job of the new step started only once every instance pod had the new limits and the rollout was over
    assert seen_at_job["pg-run-0001-1"] == {"pg-1": amounts("500m"), "pg-2": amounts("500m")}
    assert seen_at_job["pg-run-0002-1"] == {"pg-1": amounts("2"), "pg-2": amounts("2")}
    reads_after = [api.requests[i] for i in range(patch_at, posts[3]) if api.requests[i] == ("GET", CLUSTER)]
    assert len(reads_after) == 1 + api.rollout_reads + 1  # the stale healthy read, the rollout, healthy again
    assert "Upgrading cluster" in api.phases and api.phases[-1] == "Cluster in healthy state"

    store = Store.open(tmp_path / "results", create=False)
    runs = store.runs()
    assert [(r.axes["cpus"], r.axes["clients"], r.metrics["limit_cpus"]) for r in runs] == [
        (0.5, 1, 0.5), (0.5, 2, 0.5), (2, 1, 2), (2, 2, 2)]
    events = rows(store, "SELECT kind, detail, run_id FROM events WHERE kind LIKE 'cpu-step%'")
    assert len(events) == 1 and events[0]["run_id"] is None
    assert events[0]["kind"] == "cpu-step" and events[0]["detail"].startswith("cpus=2: rolling update took ")
    assert store.sweeps()[-1]["status"] == "done"
    store.close()
    assert_all_deleted(api)


def test_a_rollout_that_never_ends_fails_the_step_and_cleans_up(fake: tuple[FakeAPI, client.ApiClient],
                                                                tmp_path: Path) -> None:
    api, api_client = fake
    api.stuck_rollout = True
    with pytest.raises(K8sError) as exc:
        run(api_client, tmp_path, CPU_PLAN, ready_timeout_s=0.3)
    message = str(exc.value)
    assert message.startswith("CPU step cpus=2: Cluster/pg still rolling out after 0 s (phase: Upgrading cluster, "
                              "ready instances: 1 of 2; instance pods with cpu 2: 1 of 2)"), message
    assert posted_jobs(api)[-1] == "pg-run-0001-1"  # nothing ran on a half-rolled Cluster
    assert_all_deleted(api)
    store = Store.open(tmp_path / "results", create=False)
    sweep = store.sweeps()[-1]
    assert sweep["status"] == "failed" and sweep["reason"] == message
    assert [r.status for r in store.runs()] == ["ok", "ok"]
    (event,) = rows(store, "SELECT kind, detail FROM events WHERE kind LIKE 'cpu-step%'")
    assert event == {"kind": "cpu-step-failed", "detail": message}
    store.close()


def test_interrupted_during_a_rollout_cleans_up_and_resumes_at_that_step(fake: tuple[FakeAPI, client.ApiClient],
                                                                         tmp_path: Path) -> None:
    api, api_client = fake
    api.stuck_rollout = True  # the signal comes while pglab waits for it
    api.on_patch = lambda patch: threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
    result = run(api_client, tmp_path, CPU_PLAN, ready_timeout_s=30)
    assert result.interrupted and result.ok == 2
    assert_all_deleted(api)
    store = Store.open(tmp_path / "results", create=False)
    assert (store.sweeps()[-1]["status"], store.sweeps()[-1]["reason"]) == ("interrupted", "interrupted by SIGTERM")
    store.close()

    # the rerun builds its Cluster at the step still to run: no patch, no rollout
    api.stuck_rollout, api.on_patch, api.patches = False, lambda patch: None, []
    before = len(api.requests)
    again = run(api_client, tmp_path, CPU_PLAN)
    assert (again.resumed, again.ok) == (True, 2)
    assert api.patches == [] and ("PATCH", CLUSTER) not in api.requests[before:]
    assert [b["spec"]["resources"] for b in api.posted if b["kind"] == "Cluster"] == [amounts("500m"), amounts("2")]
    store = Store.open(tmp_path / "results", create=False)
    assert sorted((r.axes["cpus"], r.axes["clients"]) for r in store.runs()) == [(0.5, 1), (0.5, 2), (2, 1), (2, 2)]
    env = store.sweeps()[-1]["environment"]
    assert '"limit": "2"' in env  # the Cluster of the resumed sweep was made at cpus 2
    store.close()
    assert_all_deleted(api)
