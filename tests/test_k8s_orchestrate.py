"""Orchestration (create → wait → collect → clean up) against a fake Kubernetes API at the HTTP boundary.

The fake (tests/k8s_fake/) is a real HTTP server speaking the REST paths the official client uses; it keeps the
objects, plays the operator and the Job controller. Nothing is mocked inside pglab or the client.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from k8s_fake import FakeAPI, results_log
from k8s_support import k8s_plan
from pglab.plan.load import parse_plan
from pglab.targets.kubernetes.orchestrate import K8sError, Orchestrator, extract_results
from pglab.targets.kubernetes.scripts import BEGIN_MARK, END_MARK

PLAN = k8s_plan("storage: {profiles: [randread-8k], runtime: 2s, size: 64MiB, paths: [data]}",
                "matrix: {clients: [1, 2], jobs: [1]}", "run: {duration: 2s}")


@pytest.fixture
def fake(k8s_api: tuple[FakeAPI, client.ApiClient]) -> tuple[FakeAPI, client.ApiClient]:
    """The fake as it starts: its Jobs print ``NAME done`` (these tests check the orchestration, not figures)."""
    return k8s_api


def orchestrator(api_client: client.ApiClient, tmp_path: Path, text: str = PLAN, **kw: Any) -> Orchestrator:
    plan = parse_plan(text, base_dir=tmp_path)
    return Orchestrator(plan, tmp_path, api_client, poll_s=0.01, **kw)


def test_create_wait_collect_cleanup(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = fake
    api.logs["pg-fio-data"] = results_log({"randread-8k-qd1.json": '{"jobs": []}',
                                           "randread-8k-qd1_iops.1.log": "1000, 5000, 0, 8192\n"})
    outcomes = orchestrator(api_client, tmp_path).run(tmp_path / "out")
    assert [o.name for o in outcomes] == ["pg-fio-data", "pg-pgbench-init", "pg-run-0000-1", "pg-run-0001-1"]
    assert all(o.succeeded for o in outcomes)
    # the fio logs came back from the pod's log as files; the markers are gone from the kept log
    assert (tmp_path / "out/pg-fio-data/randread-8k-qd1_iops.1.log").read_text() == "1000, 5000, 0, 8192\n"
    assert outcomes[0].files == ["randread-8k-qd1.json", "randread-8k-qd1_iops.1.log"]
    assert (tmp_path / "out/pg-run-0001-1/pgbench.out").read_text() == "pg-run-0001-1 done\n"
    assert BEGIN_MARK not in (tmp_path / "out/pg-run-0001-1/pod.log").read_text()
    # the cluster was waited for before any Job started
    posts = [p for m, p in api.requests if m == "POST"]
    cluster_reads = [i for i, (m, p) in enumerate(api.requests) if m == "GET" and p.endswith("/clusters/pg")]
    first_job = api.requests.index(("POST", "/apis/batch/v1/namespaces/bench/jobs"))
    assert len(cluster_reads) == api.ready_after + 1 and cluster_reads[-1] < first_job
    assert posts[0] == "/api/v1/namespaces"
    # nothing left behind, the namespace last
    assert api.objects == {}
    deletes = [p for m, p in api.requests if m == "DELETE"]
    assert deletes[-1] == "/api/v1/namespaces/bench"
    assert "/apis/postgresql.cnpg.io/v1/namespaces/bench/clusters/pg" in deletes


def test_failed_init_stops_and_cleans_up(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = fake
    api.failing_jobs.add("pg-pgbench-init")
    api.logs["pg-pgbench-init"] = results_log({"init.log": "x"}, text="pgbench: error: connection refused\n")
    with pytest.raises(K8sError, match="Job/pg-pgbench-init failed: pgbench: error: connection refused"):
        orchestrator(api_client, tmp_path).run(tmp_path / "out")
    assert api.objects == {}
    assert ("POST", "/apis/batch/v1/namespaces/bench/jobs") in api.requests
    assert not (tmp_path / "out/pg-run-0000-1").exists()  # no run after a failed init


def test_cluster_never_ready_times_out_and_cleans_up(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = fake
    api.never_ready = True
    with pytest.raises(K8sError, match=r"Cluster/pg not ready after 0 s \(phase: Setting up primary, ready "
                                       r"instances: 0 of 2\)"):
        orchestrator(api_client, tmp_path, ready_timeout_s=0.2).run(tmp_path / "out")
    assert api.objects == {}
    assert not any(p.endswith("/jobs") for _, p in api.requests)


def test_refused_create_names_the_object_and_cleans_up(fake: tuple[FakeAPI, client.ApiClient],
                                                       tmp_path: Path) -> None:
    api, api_client = fake
    api.forbidden.add("/apis/postgresql.cnpg.io/v1/namespaces/bench/clusters")
    with pytest.raises(K8sError, match="creating Cluster/pg in bench: 403"):
        orchestrator(api_client, tmp_path).run(tmp_path / "out")
    assert api.objects == {}
    assert ("DELETE", "/apis/rbac.authorization.k8s.io/v1/namespaces/bench/roles/pg-pglab") in api.requests


def test_ctrl_c_while_waiting_cleans_up(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = fake

    def interrupt(message: str) -> None:
        if message.startswith("waiting for Cluster"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        orchestrator(api_client, tmp_path, log=interrupt).run(tmp_path / "out")
    assert api.objects == {}
    assert ("DELETE", "/apis/postgresql.cnpg.io/v1/namespaces/bench/clusters/pg") in api.requests


NAMESPACE = "/api/v1/namespaces/bench"


def namespace(phase: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}, "status": {"phase": phase}}


@pytest.mark.parametrize("create_namespaces", [True, False])
def test_existing_namespace_is_used_and_kept(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                             create_namespaces: bool) -> None:
    """Without 'create namespaces' the API server answers 403 even for one that exists (authorization comes
    first): pglab reads it and uses it, as with the 409 an identity allowed to create gets."""
    api, api_client = fake
    api.objects[NAMESPACE] = namespace("Active")
    if not create_namespaces:
        api.forbidden = {"/api/v1/namespaces"}
    orchestrator(api_client, tmp_path).run(tmp_path / "out")
    assert list(api.objects) == [NAMESPACE]
    assert ("DELETE", NAMESPACE) not in api.requests


def test_a_namespace_that_cannot_be_created_nor_found_is_named(fake: tuple[FakeAPI, client.ApiClient],
                                                              tmp_path: Path) -> None:
    api, api_client = fake
    api.forbidden = {"/api/v1/namespaces"}
    with pytest.raises(K8sError, match=r"^creating Namespace/bench: 403 Forbidden; create it beforehand or grant "
                                       r"pglab's identity 'create namespaces'$"):
        orchestrator(api_client, tmp_path).run(tmp_path / "out")
    assert api.objects == {}


def test_a_namespace_pglab_may_neither_create_nor_read_is_named(fake: tuple[FakeAPI, client.ApiClient],
                                                               tmp_path: Path) -> None:
    api, api_client = fake
    api.objects[NAMESPACE] = namespace("Active")
    api.forbidden, api.forbidden_gets = {"/api/v1/namespaces"}, {NAMESPACE}
    with pytest.raises(K8sError, match=r"^creating Namespace/bench: 403 Forbidden, and reading it: 403 Forbidden; "
                                       r"create it beforehand and grant pglab's identity the Role of "
                                       r"docs/kubernetes.md in it$"):
        orchestrator(api_client, tmp_path).run(tmp_path / "out")
    assert list(api.objects) == [NAMESPACE]  # nothing created, nothing deleted


def test_a_namespace_still_being_deleted_is_waited_out(fake: tuple[FakeAPI, client.ApiClient],
                                                       tmp_path: Path) -> None:
    """The previous sweep's namespace, its pods still stopping: no object can be created in it until it is gone."""
    api, api_client = fake
    api.objects[NAMESPACE] = namespace("Terminating")
    api.terminating_reads = 3  # it is read 4 times before it is gone
    said: list[str] = []
    orchestrator(api_client, tmp_path, log=said.append).run(tmp_path / "out")
    assert "namespace bench is still being deleted (a previous sweep's): waiting for it to go" in said
    posts = [i for i, (m, p) in enumerate(api.requests) if m == "POST" and p == "/api/v1/namespaces"]
    assert len(posts) == 5  # refused (409, it exists) before each of the 4 reads it lasted, then created
    assert api.created[0] == NAMESPACE
    assert ("DELETE", NAMESPACE) in api.requests and api.objects == {}  # pglab's own this time: deleted


def test_results_tarball_cannot_escape(tmp_path: Path) -> None:
    log = results_log({"../escape.txt": "x"})
    with pytest.raises(K8sError, match="cannot be read"):
        extract_results(log, tmp_path / "dest")
    assert not (tmp_path / "escape.txt").exists()
    with pytest.raises(K8sError, match="truncated"):
        extract_results(f"text\n{BEGIN_MARK}\nAAAA", tmp_path / "dest")
    with pytest.raises(K8sError, match="the kubelet rotated it while they were printed"):  # the start went away
        extract_results(f"AAAA\n{END_MARK}\n", tmp_path / "dest")


def test_a_log_read_before_its_results_ended_is_read_again(fake: tuple[FakeAPI, client.ApiClient],
                                                          tmp_path: Path) -> None:
    # the Job reported ended while the end of its output had not reached the log file yet (seen on a loaded lab)
    api, api_client = fake
    api.log_cut["pg-run-0000-1"] = 2
    outcomes = orchestrator(api_client, tmp_path).run(tmp_path / "out")
    assert api.log_cut["pg-run-0000-1"] == 0  # read until whole
    assert all(o.succeeded for o in outcomes)
    assert (tmp_path / "out/pg-run-0000-1/pgbench.out").read_text() == "pg-run-0000-1 done\n"


def test_a_log_whose_results_never_end_fails_the_job_and_is_kept_as_read(fake: tuple[FakeAPI, client.ApiClient],
                                                                        tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from pglab.targets.kubernetes import orchestrate

    api, api_client = fake
    api.log_cut["pg-run-0000-1"] = 10**6
    monkeypatch.setattr(orchestrate, "LOG_SETTLE_S", 0.3)
    with pytest.raises(K8sError, match=r"the pod's log ends inside its results"):
        orchestrator(api_client, tmp_path).run(tmp_path / "out")
    kept = (tmp_path / "out/pg-run-0000-1/pod.log").read_text()
    assert BEGIN_MARK in kept and END_MARK not in kept  # as read, for whoever looks into it
