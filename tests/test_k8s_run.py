"""`pglab run` on a Kubernetes plan, against the fake API server of tests/k8s_fake/.

The fake pods print what real tools printed (tests/data/k8s: pgbench 15 and fio 3.33 run on this machine with the
options the Jobs use), so the stored figures are checked against those files, recomputed here independently.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import threading
from pathlib import Path

import numpy as np
import pytest
from kubernetes import client

from conftest import pglab
from k8s_fake import FakeAPI, results_log
from k8s_support import (
    DATA,
    FIO,
    PGBENCH,
    TXN_LOGS,
    Recorder,
    assert_all_deleted,
    cli,
    job_posts,
    k8s_plan,
    kubeconfig,
    posted_jobs,
    run,
    sample_latencies,
)
from pglab.errors import RunInterrupted
from pglab.store.sqlite import Store
from pglab.targets.kubernetes import orchestrate
from pglab.targets.kubernetes.orchestrate import K8sError

PLAN = k8s_plan("storage: {profiles: [randread-8k], runtime: 2s, size: 64MiB, paths: [data]}",
                "matrix: {clients: [1, 2], jobs: [1]}", "run: {duration: 4s, repeats: 2, order: sequential}")
RUN_JOBS = ["pg-run-0000-1", "pg-run-0000-2", "pg-run-0001-1", "pg-run-0001-2"]


# ------------------------------------------------------------------ the whole sweep
def test_run_stores_pgbench_fio_and_artifacts_then_deletes_everything(fake: tuple[FakeAPI, client.ApiClient],
                                                                      tmp_path: Path) -> None:
    api, api_client = fake
    result = run(api_client, tmp_path, PLAN)
    assert (result.ok, result.failed, result.interrupted) == (4, 0, False)
    # the storage phase measured each instance's node, the primary's first
    assert posted_jobs(api) == ["pg-fio-data-1", "pg-fio-data-2", "pg-pgbench-init", *RUN_JOBS]

    store = Store.open(tmp_path / "results", create=False)
    sweep = store.sweeps()[-1]
    assert (sweep["status"], sweep["reason"]) == ("done", None)
    env = json.loads(sweep["environment"])
    assert env["kubernetes"]["server_version"] == "v1.33.1-fake"
    assert env["cluster_status"]["currentPrimary"] == "pg-1"

    lat, end = sample_latencies()
    runs = store.runs(sweep["id"])
    assert [(r.axes["clients"], r.repeat, r.status) for r in runs] == [(1, 1, "ok"), (1, 2, "ok"), (2, 1, "ok"),
                                                                      (2, 2, "ok")]
    for r in runs:
        m = r.metrics
        # pgbench's own summary lines, as the pod printed them (tests/data/k8s/pgbench15/pgbench.out)
        assert m["tps"] == 832.861729 and m["latency_avg_ms"] == 2.393 and m["latency_stddev_ms"] == 1.635
        assert (m["transactions"], m["failed"], m["initial_connection_ms"]) == (3326, 0, 7.413)
        # percentiles from the shipped per-transaction logs
        assert m["logged_transactions"] == len(lat) == 3326
        assert m["latency_p99_ms"] == pytest.approx(float(np.percentile(lat, 99)))
        assert m["latency_max_ms"] == pytest.approx(lat.max())
        window = store.conn.execute("SELECT window_start, window_end FROM runs WHERE id = ?", (r.id,)).fetchone()
        assert window == pytest.approx(((end - lat / 1000).min(), end.max()))
        assert m["window_s"] == pytest.approx(window[1] - window[0])
        tps = [(ts, v) for ts, _s, metric, v in store.series(r.id, "pgbench") if metric == "tps"]
        assert tps == [(1795359922.810, 673.9), (1795359923.811, 661.9), (1795359924.811, 932.1)]
        run_dir = store.dir / r.dir
        # the -l logs kept gzip-compressed once summarised, with the window's latency histogram beside them
        shipped = {"pgbench.out", "pgbench.err", *(f"{n}.gz" for n in TXN_LOGS), "reset.log", "pod.log", "job.yaml",
                   "run.json", "latency_histogram.json"}
        assert shipped <= {f.name for f in run_dir.iterdir()}
        assert gzip.decompress((run_dir / f"{TXN_LOGS[1]}.gz").read_bytes()) == (PGBENCH / TXN_LOGS[1]).read_bytes()
        hist = json.loads((run_dir / "latency_histogram.json").read_text())
        assert hist["count"] == len(lat) and hist["max"] == round(lat.max() * 1000)
        assert json.loads((run_dir / "run.json").read_text())["job"] in RUN_JOBS

    # the storage phase: fio's JSON from the pod, parsed into the same rows as a local storage phase
    fio_rows = store.fio_results(sweep["id"])
    qd32 = json.loads((FIO / "randread-8k-qd32.json").read_text())["jobs"][0]["read"]
    assert [(f["label"], f["job"], f["direction"]) for f in fio_rows] == [
        (f"data@{node}", job, "read") for node in ("node-1", "node-2")
        for job in ("randread-8k-qd1", "randread-8k-qd32")]
    assert fio_rows[1]["iops"] == qd32["iops"]
    assert fio_rows[1]["path"] == "pvc/pg-fio-data-1 (default storage class) on node node-1"
    assert fio_rows[3]["path"] == "pvc/pg-fio-data-2 (default storage class) on node node-2"
    assert store.ceilings(sweep["id"])["data@node-2"]["randread_iops_qd32"] == qd32["iops"]
    for node in ("node-1", "node-2"):
        assert (store.dir / "storage" / "data" / node / "randread-8k-qd32_iops.1.log").is_file()
    # each fio Job was pinned to its node by name, its volume a claim of its own
    for index, node in ((1, "node-1"), (2, "node-2")):
        [job] = [b for b in api.posted if b["kind"] == "Job" and b["metadata"]["name"] == f"pg-fio-data-{index}"]
        pod = job["spec"]["template"]["spec"]
        assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}
        assert [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v] == [
            f"pg-fio-data-{index}"]
    series = store.conn.execute("SELECT count(*) FROM fio_series").fetchone()[0]
    assert series == 4  # one IOPS point per job in fio's own 2 s logs, per node
    assert store.storage_done(sweep["id"])

    # reports read it unchanged
    from pglab.report.tables import full_report, storage_table, volume_ceilings

    csv = full_report(store, "csv", sweep["id"])
    assert "832.86" in csv
    # the storage table names each node's volume; the bottleneck reads the primary's node's ceilings
    _, storage_rows = storage_table(store, sweep["id"])
    assert [r["path"] for r in storage_rows] == ["data@node-1"] * 2 + ["data@node-2"] * 2
    by_label = store.ceilings(sweep["id"])
    assert list(by_label) == ["data@node-1", "data@node-2"]
    assert volume_ceilings(by_label, "data") is by_label["data@node-1"]
    store.close()

    # the Cluster was healthy before any Job; each fio volume was gone before the next Job
    cluster_reads = [i for i, (m, p) in enumerate(api.requests) if m == "GET" and p.endswith("/clusters/pg")]
    assert cluster_reads[api.ready_after] < job_posts(api)[0]
    for index in (1, 2):
        assert (api.requests.index(("DELETE", f"/api/v1/namespaces/bench/persistentvolumeclaims/pg-fio-data-{index}"))
                < job_posts(api)[index])
    assert_all_deleted(api)
    assert api.requests[-1] == ("DELETE", "/api/v1/namespaces/bench")
    # the instances are killed once their Cluster is deleted, not left to a smart shutdown within a 30 min grace
    assert api.killed_at_cleanup == [(pod, {"gracePeriodSeconds": ["0"]}) for pod in ("pg-1", "pg-2")]
    cluster_deleted = api.requests.index(("DELETE", "/apis/postgresql.cnpg.io/v1/namespaces/bench/clusters/pg"))
    assert cluster_deleted < api.requests.index(("DELETE", "/api/v1/namespaces/bench/pods/pg-1"))

    # a rerun of a finished sweep creates nothing
    before = len(api.created)
    again = run(api_client, tmp_path, PLAN)
    assert (again.resumed, again.already_done, again.ok) == (True, 4, 0)
    assert len(api.created) == before


def test_warmup_is_cut_from_the_window(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = fake
    text = PLAN.replace("run: {duration: 4s, repeats: 2, order: sequential}",
                        "run: {duration: 3s, warmup: 1s}").replace(
        "storage: {profiles: [randread-8k], runtime: 2s, size: 64MiB, paths: [data]}\n", "")
    result = run(api_client, tmp_path, text)
    assert result.ok == 2
    lat, end = sample_latencies()
    start = (end - lat / 1000).min() + 1.0
    inside = lat[end >= start]
    store = Store.open(tmp_path / "results", create=False)
    for r in store.runs():
        m = r.metrics
        assert m["tps"] == pytest.approx(len(inside) / (end.max() - start))
        assert m["tps"] != pytest.approx(832.861729, rel=1e-3)
        assert m["tps_with_warmup"] == 832.861729  # pgbench's own figure, warm-up included, kept beside
        assert m["transactions"] == len(inside) and m["latency_avg_ms"] == pytest.approx(inside.mean())
        assert m["latency_p95_ms"] == pytest.approx(float(np.percentile(inside, 95)))
        events = dict(store.conn.execute("SELECT kind, ts FROM events WHERE run_id = ?", (r.id,)).fetchall())
        assert events["warmup-start"] == pytest.approx(start - 1.0)
        assert events["warmup-end"] == events["window-start"] == pytest.approx(start)
    store.close()
    assert_all_deleted(api)


# ------------------------------------------------------------------ failures
def test_failed_pgbench_job_is_a_failed_run_and_the_sweep_goes_on(fake: tuple[FakeAPI, client.ApiClient],
                                                                  tmp_path: Path) -> None:
    api, api_client = fake
    api.failing_jobs.add("pg-run-0000-2")
    api.unhealthy_after_jobs.add("pg-run-0000-2")  # the operator reports the Cluster degraded from then on
    api.logs["pg-run-0000-2"] = results_log({"pgbench.out": "", "reset.log": "TRUNCATE TABLE\nVACUUM\n",
                                             "pgbench.err": (PGBENCH / "unreachable.err").read_text()}, text="")
    observer = Recorder()
    result = run(api_client, tmp_path, PLAN, observer=observer)
    assert (result.ok, result.failed) == (3, 1)
    assert posted_jobs(api)[-2:] == ["pg-run-0001-1", "pg-run-0001-2"]  # the runs after it still ran
    reason = ('pgbench failed in Job/pg-run-0000-2: pgbench: error: could not translate host name "pg-rw" to '
              'address: Name or service not known / pgbench: error: could not create connection for setup; '
              'Cluster/pg not healthy (phase: Setting up primary, ready instances: 0 of 2)')
    assert result.failures == [f"tpcb-like sc=on c=1 j=1 #2: {reason}"]
    store = Store.open(tmp_path / "results", create=False)
    failed = [r for r in store.runs() if r.status == "failed"]
    assert [(r.repeat, r.reason, r.metrics) for r in failed] == [(2, reason, {})]
    assert store.sweeps()[-1]["status"] == "done"
    store.close()
    assert ("tpcb-like sc=on c=1 j=1", 2, "failed") in observer.finished
    assert_all_deleted(api)


def test_dataset_reset_failure_is_named(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = fake
    api.failing_jobs.add("pg-run-0001-1")
    api.logs["pg-run-0001-1"] = results_log(
        {"reset.log": 'ERROR:  relation "pgbench_history" does not exist\n'}, text="")
    result = run(api_client, tmp_path, PLAN)
    assert result.failures == ['tpcb-like sc=on c=2 j=1 #1: dataset reset before the run failed in '
                               'Job/pg-run-0001-1: ERROR:  relation "pgbench_history" does not exist']
    assert result.ok == 3


def test_cluster_never_healthy_fails_clearly_and_cleans_up(fake: tuple[FakeAPI, client.ApiClient],
                                                          tmp_path: Path) -> None:
    api, api_client = fake
    api.never_ready = True
    message = "Cluster/pg not ready after 0 s (phase: Setting up primary, ready instances: 0 of 2)"
    with pytest.raises(K8sError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run(api_client, tmp_path, PLAN, ready_timeout_s=0.2)
    assert posted_jobs(api) == []
    assert_all_deleted(api)
    store = Store.open(tmp_path / "results", create=False)
    sweep = store.sweeps()[-1]
    assert (sweep["status"], sweep["reason"]) == ("failed", message)
    assert store.runs() == []
    store.close()


def test_failed_dataset_load_fails_the_sweep_and_cleans_up(fake: tuple[FakeAPI, client.ApiClient],
                                                           tmp_path: Path) -> None:
    api, api_client = fake
    api.failing_jobs.add("pg-pgbench-init")
    api.logs["pg-pgbench-init"] = results_log({}, text=(PGBENCH / "unreachable.err").read_text())
    with pytest.raises(Exception, match=r'pgbench -i failed in pod/pg-clients-0: .*could not create connection'):
        run(api_client, tmp_path, PLAN)
    assert posted_jobs(api) == ["pg-fio-data-1", "pg-fio-data-2", "pg-pgbench-init"]
    assert_all_deleted(api)
    store = Store.open(tmp_path / "results", create=False)
    assert store.sweeps()[-1]["status"] == "failed" and store.storage_done(1)  # fio's results are kept
    store.close()


PULL = [("ErrImagePull", 'failed to pull image "example/none:1"'),
        ("ImagePullBackOff", 'Back-off pulling image "example/none:1"')]
UNSCHEDULABLE = [("Unschedulable", "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector.")]


@pytest.mark.parametrize("waiting", [PULL, UNSCHEDULABLE], ids=["image pull", "unschedulable"])
def test_a_job_whose_pod_cannot_start_fails_with_the_kubelets_reason(fake: tuple[FakeAPI, client.ApiClient],
                                                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     waiting: list[tuple[str, str]]) -> None:
    """An image that cannot be pulled, or no node that fits, would otherwise keep the Job waiting out its timeout
    (10 min at least). The kubelet's reasons take turns (ErrImagePull, ImagePullBackOff): the time counts on."""
    api, api_client = fake
    monkeypatch.setattr(orchestrate, "POD_LOOK_S", 0.0)
    monkeypatch.setattr(orchestrate, "POD_START_GRACE_S", 0.2)
    api.hanging_jobs = {"pg-fio-data-1"}
    api.pod_waiting = {"pg-fio-data-1": list(waiting)}
    with pytest.raises(K8sError) as caught:
        run(api_client, tmp_path, PLAN, job_timeout_s=10)  # not the Job's own timeout: its pod's reason
    assert str(caught.value).startswith("Job/pg-fio-data-1: its pod cannot start after 0 s (")
    assert any(f"({r}: {m})" in str(caught.value) for r, m in waiting), str(caught.value)
    assert_all_deleted(api)



def test_a_cluster_whose_pods_no_node_fits_fails_with_the_schedulers_reason(
        fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Instances asking for more than any node has stay Pending: the Cluster would otherwise be waited for until
    its readiness timeout (30 min), with nothing said."""
    api, api_client = fake
    monkeypatch.setattr(orchestrate, "POD_LOOK_S", 0.0)
    monkeypatch.setattr(orchestrate, "POD_START_GRACE_S", 0.2)
    api.never_ready = True
    message = "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available."
    api.instance_pods_unschedulable = message
    with pytest.raises(K8sError) as caught:
        run(api_client, tmp_path, PLAN, ready_timeout_s=60)  # not the Cluster's own timeout: its pods' reason
    assert re.fullmatch(rf"Cluster/pg: its pod pg-\d cannot start after 0 s \(Unschedulable: {re.escape(message)}\)",
                        str(caught.value)), str(caught.value)
    assert posted_jobs(api) == []
    assert_all_deleted(api)


# ------------------------------------------------------------------ interrupt and resume
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_during_a_run_cleans_up_and_a_rerun_resumes(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                                           sig: signal.Signals) -> None:
    api, api_client = fake
    api.hanging_jobs.add("pg-run-0001-1")  # runs until the signal comes

    def strike(job: str) -> None:
        if job == "pg-run-0001-1":
            threading.Timer(0.3, os.kill, (os.getpid(), sig)).start()

    api.on_job_created = strike
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)  # ignored when run in the background
    result = run(api_client, tmp_path, PLAN)
    assert (result.interrupted, result.ok, result.failed) == (True, 2, 0)
    assert_all_deleted(api)
    # the run was stopped in its client pod before the pod was deleted: nothing of it ran on
    assert [(pod, run) for pod, _, run in api.stops] == [("pg-clients-0", "pg-run-0001-1")]
    assert not api.clients.running
    pod = "/api/v1/namespaces/bench/pods/pg-clients-0"
    last_exec = max(i for i, r in enumerate(api.requests) if r == ("GET", f"{pod}/exec"))
    assert api.requests.index(("DELETE", pod)) > last_exec  # the stop came first
    store = Store.open(tmp_path / "results", create=False)
    sweep = store.sweeps()[-1]
    assert (sweep["status"], sweep["reason"]) == ("interrupted", f"interrupted by {sig.name}")
    assert [(r.axes["clients"], r.repeat, r.status) for r in store.runs()] == [
        (1, 1, "ok"), (1, 2, "ok"), (2, 1, "interrupted")]
    interrupted_dir = store.dir / store.runs()[-1].dir
    store.close()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # handlers put back

    # the rerun into the same folder: the two missing runs only, on a new Cluster; fio is not measured again
    api.hanging_jobs.clear()
    api.on_job_created = lambda job: None
    first_attempt = len(api.requests)
    observer = Recorder()
    again = run(api_client, tmp_path, PLAN, observer=observer)
    assert (again.resumed, again.already_done, again.ok, again.interrupted) == (True, 2, 2, False)
    assert posted_jobs(api, since=first_attempt) == ["pg-pgbench-init", "pg-run-0001-1", "pg-run-0001-2"]
    assert "resuming sweep 1: 2 of 4 runs already complete, 2 to go" in observer.messages
    assert not interrupted_dir.exists() and (tmp_path / "results" / "discarded" / interrupted_dir.name).is_dir()
    store = Store.open(tmp_path / "results", create=False)
    assert [s["status"] for s in store.sweeps()] == ["done"]
    assert sorted((r.axes["clients"], r.repeat, r.status) for r in store.runs()) == [
        (1, 1, "ok"), (1, 2, "ok"), (2, 1, "ok"), (2, 2, "ok")]
    assert len(store.fio_results(1)) == 4  # 2 jobs on each instance's node
    store.close()
    assert_all_deleted(api)


def test_interrupt_while_waiting_for_the_cluster(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = fake

    class Interrupting(Recorder):
        def log(self, message: str) -> None:
            super().log(message)
            if message.startswith("waiting for Cluster"):
                raise RunInterrupted("SIGTERM")

    result = run(api_client, tmp_path, PLAN, observer=Interrupting())
    assert result.interrupted and result.ok == 0
    assert posted_jobs(api) == []
    assert_all_deleted(api)


# ------------------------------------------------------------------ the command line
def test_cli_runs_a_kubernetes_plan(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    config = kubeconfig(tmp_path, api_client)
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("namespace: bench", f"namespace: bench\n    kubeconfig: {config}"))
    assert cli(monkeypatch, "run", str(plan), "--results", str(tmp_path / "r"), "--format", "csv") == 0
    captured = capsys.readouterr()
    assert "832.86" in captured.out
    assert "(4 ok, 0 failed;" in captured.err and "Traceback" not in captured.err
    assert_all_deleted(api)


def test_cli_cluster_never_healthy_is_one_line_exit_1(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    api.never_ready = True
    config = kubeconfig(tmp_path, api_client)
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("namespace: bench", f"namespace: bench\n    kubeconfig: {config}"))
    assert cli(monkeypatch, "run", str(plan), "--results", str(tmp_path / "r"), ready_timeout_s=0.3) == 1
    err = capsys.readouterr().err
    assert "error: Cluster/pg not ready after 0 s (phase: Setting up primary, ready instances: 0 of 2)" in err
    assert "Traceback" not in err
    assert_all_deleted(api)


@pytest.mark.parametrize(("extra", "args", "message"), [
    ("    kubeconfig: /nonexistent/kubeconfig\n", [],
     "error: target.kubernetes.kubeconfig: cannot use /nonexistent/kubeconfig: "),
    ("", ["--keep"], "error: --keep: a Kubernetes sweep always deletes what it created; run without --keep"),
])
def test_cli_refusals_exit_2_in_one_line(tmp_path: Path, extra: str, args: list[str], message: str) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("    instances: 2\n", "    instances: 2\n" + extra))
    proc = pglab("run", str(plan), "--results", str(tmp_path / "r"), *args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "r").exists()  # refused before a results folder was made


def test_the_log_of_a_real_run_job_script_is_stored(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    """The rendered Job's script, run by sh against PostgreSQL 15 (tests/data/k8s/README.md), end to end."""
    api, api_client = fake
    api.logs["pg-run-0000-1"] = (DATA / "run-job-pod.log").read_text()
    text = PLAN.replace("matrix: {clients: [1, 2], jobs: [1]}",
                        "dataset: {scale: 1}\nmatrix: {clients: [2], jobs: [2]}")
    text = text.replace("run: {duration: 4s, repeats: 2, order: sequential}", "run: {duration: 3s, warmup: 1s}")
    text = text.replace("storage: {profiles: [randread-8k], runtime: 2s, size: 64MiB, paths: [data]}\n", "")
    result = run(api_client, tmp_path, text)
    assert (result.ok, result.failed) == (1, 0)
    store = Store.open(tmp_path / "results", create=False)
    (r,) = store.runs()
    run_dir = store.dir / r.dir
    out = (run_dir / "pgbench.out").read_text()
    assert "number of clients: 2\nnumber of threads: 2" in out and "duration: 4 s" in out  # -T = warm-up + window
    assert r.metrics["tps_with_warmup"] == float(out.split("tps = ")[1].split()[0])
    assert r.metrics["window_s"] == pytest.approx(3.0, abs=0.1)  # the window is the plan's 3 s, warm-up cut
    reset = (run_dir / "reset.log").read_text()
    assert reset.startswith("TRUNCATE TABLE\nVACUUM\n") and "pglab: CHECKPOINT failed" in reset
    assert len(list(run_dir.glob("pgbench.[0-9]*"))) == 2  # one -l log per thread
    store.close()
