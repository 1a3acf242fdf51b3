"""The Kubernetes sweep's axes that change the Cluster between points (matrix.cpus, matrix.parameters), and the
instances' exporter read through the pod proxy, against the fake API server of tests/k8s_fake/.

The fake plays CloudNativePG's rolling update: after a merge PATCH of the Cluster's resources or parameters, one
more read still reports it healthy with the old pods (the operator has not reconciled yet), then it reads
"Upgrading cluster" while the instance pods are recreated with the new spec, replicas first, the primary last.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from kubernetes import client

from k8s_fake import FakeAPI, exporter_text, results_log
from k8s_support import (
    CLUSTER,
    JOB_S,
    PGBENCH,
    TXN_LOGS,
    Recorder,
    assert_all_deleted,
    job_posts,
    k8s_plan,
    pod_log,
    posted_jobs,
    rows,
    run,
    started,
    timed_log,
)
from pglab.drivers import kubernetes as k8s_sweep
from pglab.plan.load import parse_plan
from pglab.plan.schema import Plan
from pglab.store.sqlite import Store
from pglab.targets.kubernetes import exporter, scripts
from pglab.targets.kubernetes.orchestrate import K8sError
from pglab.targets.kubernetes.render import WITNESS_MARK, cluster, cpu_quantity, millicores, render
from pglab.targets.kubernetes.scenario import parse_witness_log

CPU_PLAN = k8s_plan("matrix: {clients: [1, 2], jobs: [1], cpus: [0.5, 2]}",
                    "run: {duration: 4s, order: sequential}")


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

    def note(job: str) -> None:  # the pods' resources when each Job is created
        seen_at_job.setdefault(job, api.pod_resources())

    api.on_job_created = note
    result = run(api_client, tmp_path, CPU_PLAN)
    assert (result.ok, result.failed) == (4, 0)
    assert posted_jobs(api) == ["pg-pgbench-init", "pg-run-0000-1", "pg-run-0001-1", "pg-run-0002-1",
                                "pg-run-0003-1"]
    # the volume probes: at the first run, then again after the step recreated the pods (new pods, new attachments)
    probes = [(i, name) for i, name in api.job_posts if "-volumes-" in name]
    runs = {name: i for i, name in started(api)}
    assert [i < runs["pg-run-0001-1"] for i, _ in probes] == [True, True, False, False]
    assert all(runs["pg-run-0002-1"] < i < runs["pg-run-0003-1"] for i, _ in probes[2:])

    # created at the first step; one patch, whole resources (requests = limits, memory kept), between the steps
    (created,) = [b for b in api.posted if b["kind"] == "Cluster"]
    assert created["spec"]["resources"] == amounts("500m")
    assert api.patches == [{"spec": {"resources": amounts("2")}}]
    patch_at = api.requests.index(("PATCH", CLUSTER))
    posts = job_posts(api)
    assert posts[2] < patch_at < posts[3]  # after both clients of step 0.5, before the first of step 2
    # the Job of the new step started only once every instance pod had the new limits and the rollout was over
    assert seen_at_job["pg-run-0001-1"] == {"pg-1": amounts("500m"), "pg-2": amounts("500m")}
    assert seen_at_job["pg-run-0002-1"] == {"pg-1": amounts("2"), "pg-2": amounts("2")}
    reads_after = [api.requests[i] for i in range(patch_at, posts[3]) if api.requests[i] == ("GET", CLUSTER)]
    # the stale healthy read, the rollout, healthy again; then the run reads which pod is primary (the standbys'
    # replay, then the exporter)
    assert len(reads_after) == 1 + api.rollout_reads + 1 + 2
    assert "Upgrading cluster" in api.phases and api.phases[-1] == "Cluster in healthy state"

    store = Store.open(tmp_path / "results", create=False)
    stored = store.runs()
    assert [(r.axes["cpus"], r.axes["clients"], r.metrics["limit_cpus"]) for r in stored] == [
        (0.5, 1, 0.5), (0.5, 2, 0.5), (2, 1, 2), (2, 2, 2)]
    events = rows(store, "SELECT kind, detail, run_id FROM events WHERE kind LIKE 'cpu-step%'")
    assert len(events) == 1 and events[0]["run_id"] is None
    assert events[0]["kind"] == "cpu-step" and events[0]["detail"].startswith("cpus=2: rolling update took ")
    assert store.sweeps()[-1]["status"] == "done"
    store.close()
    assert_all_deleted(api)


def test_interleaved_rounds_stay_inside_a_cpu_step_so_the_cluster_rolls_out_once(
        fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = fake
    text = CPU_PLAN.replace("run: {duration: 4s, order: sequential}", "run: {duration: 4s, repeats: 2, seed: 3}")
    result = run(api_client, tmp_path, text)
    assert (result.ok, result.failed) == (8, 0)
    assert api.patches == [{"spec": {"resources": amounts("2")}}]  # one rolling update for eight runs
    jobs = [j for j in posted_jobs(api) if j.startswith("pg-run-")]
    patch_at = api.requests.index(("PATCH", CLUSTER))
    posts = job_posts(api)[1:]  # the runs' Jobs (the first post is pgbench -i)
    assert all(p < patch_at for p in posts[:4]) and all(p > patch_at for p in posts[4:])
    assert sorted(jobs[:4]) == ["pg-run-0000-1", "pg-run-0000-2", "pg-run-0001-1", "pg-run-0001-2"]
    rounds = [sorted(jobs[i:i + 2]) for i in range(0, 8, 2)]  # each round: both client counts, its repeat
    assert rounds == [["pg-run-0000-1", "pg-run-0001-1"], ["pg-run-0000-2", "pg-run-0001-2"],
                      ["pg-run-0002-1", "pg-run-0003-1"], ["pg-run-0002-2", "pg-run-0003-2"]]
    assert_all_deleted(api)


def test_a_rollout_that_never_ends_fails_the_step_and_cleans_up(fake: tuple[FakeAPI, client.ApiClient],
                                                                tmp_path: Path) -> None:
    api, api_client = fake
    api.stuck_rollout = True
    with pytest.raises(K8sError) as exc:  # 3 s: the Cluster's creation waits as long, and took over 0.3 s once
        run(api_client, tmp_path, CPU_PLAN, ready_timeout_s=3)
    message = str(exc.value)
    assert message.startswith("CPU step cpus=2: Cluster/pg still rolling out after 3 s (phase: Upgrading cluster, "
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


# ------------------------------------------------------------------ matrix.parameters
PARAM_PLAN = k8s_plan("postgres:\n  parameters: {jit: false}",
                      "matrix: {clients: [1], jobs: [1], parameters: {work_mem: [4MB, 8MB]}}", "run: {duration: 4s}")
# what pg_settings shows for the values these tests use (PostgreSQL 15: work_mem in kB)
PG_SETTINGS = {"work_mem": {"4MB": ("4096", "kB"), "8MB": ("8192", "kB")}, "jit": {"off": ("off", "")}}


def with_settings(api: FakeAPI, pending_restart: bool = False) -> Callable[[str], str]:
    """Pod logs of the plan's Jobs; a run Job's also carries settings.txt as its wait loop left it: the primary's
    parameters in pg_settings' form, ``ok`` when they are the ones the Cluster asks for."""

    def log(job: str) -> str:
        if "-run-" not in job:
            return pod_log(job)
        wanted = api.objects[CLUSTER]["spec"]["postgresql"]["parameters"]
        running = api.primary_parameters()
        lines = []
        for name in sorted(wanted):
            setting, unit = PG_SETTINGS[name][running[name]]
            ok = running[name] == wanted[name] and not pending_restart
            lines.append(f"{name}|{setting}|{unit}|{'t' if pending_restart else 'f'}|{'t' if ok else 'f'}")
        files = {name: (PGBENCH / name).read_text() for name in ("pgbench.out", "pgbench.err", *TXN_LOGS)}
        if any(not line.endswith("|f|t") for line in lines):
            api.failing_jobs.add(job)  # the script's exit 3: no reset, no pgbench
            files = {}
        return results_log({**files, "settings.txt": "\n".join(lines) + "\n"}, text="")

    return log


def run_scripts(plan: Plan, tmp_path: Path) -> list[str]:
    return [m.body["spec"]["template"]["spec"]["containers"][0]["command"][2] for m in render(plan, tmp_path)
            if m.body["metadata"]["labels"].get("pglab/component") == "pgbench-run"]


def settings_query(script: str) -> str:
    """The SQL of a run Job's settings wait, as sh would pass it to psql."""
    line = next(x for x in script.splitlines() if x.startswith("until psql "))
    words = shlex.split(line.removeprefix("until ").split(" > settings.txt")[0])
    return words[words.index("-c") + 1]


def test_render_waits_for_the_parameters_in_the_run_job(tmp_path: Path) -> None:
    plan = parse_plan(PARAM_PLAN, base_dir=tmp_path)
    assert cluster(plan)["spec"]["postgresql"]["parameters"] == {"jit": "off", "work_mem": "4MB"}
    first, second = run_scripts(plan, tmp_path)
    assert "FROM (VALUES ('jit', 'off'), ('work_mem', '4MB'))" in settings_query(first)
    assert "FROM (VALUES ('jit', 'off'), ('work_mem', '8MB'))" in settings_query(second)
    assert first.index("settings.txt") < first.index("TRUNCATE") < first.index("pgbench -n")
    lone = parse_plan(PARAM_PLAN.replace("postgres:\n  parameters: {jit: false}\n", "").replace(
        ", parameters: {work_mem: [4MB, 8MB]}", ""), base_dir=tmp_path)
    (script,) = run_scripts(lone, tmp_path)
    assert "settings.txt" not in script


def test_parameters_are_patched_between_points_and_checked_by_the_run(fake: tuple[FakeAPI, client.ApiClient],
                                                                      tmp_path: Path) -> None:
    api, api_client = fake
    api.default_log = with_settings(api)
    result = run(api_client, tmp_path, PARAM_PLAN)
    assert (result.ok, result.failed) == (2, 0), result.failures
    (created,) = [b for b in api.posted if b["kind"] == "Cluster"]
    assert created["spec"]["postgresql"]["parameters"] == {"jit": "off", "work_mem": "4MB"}
    assert api.patches == [{"spec": {"resources": amounts("1"),
                                     "postgresql": {"parameters": {"jit": "off", "work_mem": "8MB"}}}}]
    patch_at = api.requests.index(("PATCH", CLUSTER))
    posts = job_posts(api)
    assert posts[1] < patch_at < posts[2]

    store = Store.open(tmp_path / "results", create=False)
    runs = store.runs()
    assert [r.axes["parameters.work_mem"] for r in runs] == ["4MB", "8MB"]
    for r, kb in zip(runs, ("4096", "8192"), strict=True):
        (row,) = rows(store, "SELECT settings FROM runs WHERE id = ?", r.id)
        assert json.loads(row["settings"]) == {"jit": {"setting": "off", "unit": None},
                                               "work_mem": {"setting": kb, "unit": "kB"}}
    (event,) = rows(store, "SELECT kind, detail FROM events WHERE kind LIKE 'parameters%'")
    assert event["kind"] == "parameters-applied" and event["detail"].startswith("work_mem=8MB: applied in ")
    assert store.sweeps()[-1]["status"] == "done"
    store.close()
    assert_all_deleted(api)


def test_a_parameter_never_in_force_fails_its_run_naming_it(fake: tuple[FakeAPI, client.ApiClient],
                                                            tmp_path: Path) -> None:
    api, api_client = fake
    api.default_log = with_settings(api, pending_restart=True)
    result = run(api_client, tmp_path, PARAM_PLAN)
    assert (result.ok, result.failed) == (0, 2)
    assert result.failures[1].startswith("tpcb-like sc=on c=1 j=1 work_mem=8MB #1: parameter jit: off still waited "
                                         "for a restart of the primary after 300 s (CloudNativePG had not restarted "
                                         "it)")
    store = Store.open(tmp_path / "results", create=False)
    assert [r.status for r in store.runs()] == ["failed", "failed"]
    assert store.sweeps()[-1]["status"] == "done"
    store.close()
    assert_all_deleted(api)


# ------------------------------------------------------------------ the settings wait, against a real PostgreSQL
@pytest.fixture(scope="module")
def postgres() -> Iterator[dict[str, str]]:
    """A throwaway PostgreSQL (this machine's, 15) with work_mem 8MB and jit off, as libpq environment."""
    from pglab.targets.local.postgres_bin import find_bindir

    bindir = find_bindir()
    as_server: dict[str, Any] = {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}
    base = Path(tempfile.mkdtemp(prefix="pglab-k8s-settings-", dir="/var/tmp"))
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = base / "data"
    started = False
    try:
        subprocess.run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync"],
                       check=True, capture_output=True, **as_server)
        opts = f"-p {port} -k {base} -c listen_addresses='' -c work_mem=8MB -c jit=off"
        subprocess.run([str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(base / "log"), "-w",
                        "start"], check=True, capture_output=True, **as_server)
        started = True
        yield {"PGHOST": str(base), "PGPORT": str(port), "PGUSER": "postgres", "PGDATABASE": "postgres"}
    finally:
        if started:
            subprocess.run([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                           capture_output=True, **as_server)
        shutil.rmtree(base, ignore_errors=True)


def settings_wait(env: dict[str, str], parameters: dict[str, str], tmp_path: Path) -> tuple[str, list[str]]:
    """The run Job's settings wait, run by sh as the pod runs it: its rc and settings.txt."""
    script = f"set -eu\ncd {tmp_path}\nrc=0\n{scripts.settings_script(parameters)}echo \"rc=$rc\"\n"
    proc = subprocess.run(["sh", "-c", script], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=60, check=True)
    return proc.stdout.strip(), (tmp_path / "settings.txt").read_text().splitlines()


def test_the_settings_wait_lets_postgresql_compare_the_values(postgres: dict[str, str], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    rc, lines = settings_wait(postgres, {"work_mem": "8MB", "jit": "off", "shared_buffers": "16384",
                                         "checkpoint_timeout": "5min", "max_wal_size": "1GB",
                                         "random_page_cost": "4.0", "track_io_timing": "false",
                                         "default_transaction_isolation": "Read Committed"}, tmp_path)
    assert rc == "rc=0"
    assert lines == ["checkpoint_timeout|300|s|f|t", "default_transaction_isolation|read committed||f|t",
                     "jit|off||f|t", "max_wal_size|1024|MB|f|t", "random_page_cost|4||f|t",
                     "shared_buffers|16384|8kB|f|t", "track_io_timing|off||f|t", "work_mem|8192|kB|f|t"]
    # one parameter alone: its VALUES row is folded into constants, the size branch must not be tried on 'off'
    assert settings_wait(postgres, {"jit": "off"}, tmp_path) == ("rc=0", ["jit|off||f|t"])

    monkeypatch.setattr(scripts, "SETTINGS_WAIT_S", 2)  # one retry, then give up
    assert settings_wait(postgres, {"work_mem": "4MB", "nosuch_parameter": "1"}, tmp_path) == (
        "rc=3", ["nosuch_parameter||||f", "work_mem|8192|kB|f|f"])
    subprocess.run(["psql", "-XAtqc", "ALTER SYSTEM SET shared_buffers = '256MB'"], env={**os.environ, **postgres},
                   check=True)
    subprocess.run(["psql", "-XAtqc", "SELECT pg_reload_conf()"], env={**os.environ, **postgres}, check=True)
    try:
        rc, lines = settings_wait(postgres, {"shared_buffers": "256MB"}, tmp_path)
        assert (rc, lines) == ("rc=3", ["shared_buffers|16384|8kB|t|f"])  # needs a restart: waited for, not had
    finally:
        subprocess.run(["psql", "-XAtqc", "ALTER SYSTEM RESET shared_buffers"], env={**os.environ, **postgres},
                       check=True)


def test_the_witness_ends_an_attempt_whose_commit_waits_for_ever(postgres: dict[str, str], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A COMMIT waiting for a synchronous standby that never comes (a live server: no connection deadline fires)
    held the witness pod until its Job's timeout; each attempt now has a deadline and such an attempt, its INSERT
    answered, is in doubt. Run by sh as the pod runs it; once it has one write acknowledged, the server is given a
    synchronous standby that does not exist."""
    monkeypatch.setattr(scripts, "RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(scripts, "WITNESS_ATTEMPT_S", 2)
    monkeypatch.setattr(scripts, "WITNESS_MARGIN_S", 0)
    monkeypatch.setattr(scripts, "WITNESS_OVERTIME_S", 4)  # its writes still failing when its time is up
    plan = parse_plan(k8s_plan("matrix: {clients: [1]}", "run: {duration: 6s}"))
    env = {**os.environ, **postgres}

    def psql(sql: str) -> None:
        subprocess.run(["psql", "-XAtqc", sql], env=env, check=True, capture_output=True, timeout=30)

    witness = subprocess.Popen(["sh", "-c", scripts.witness_script(plan, 6.0)], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[str] = []
    try:
        assert witness.stdout is not None
        for line in witness.stdout:
            lines.append(line)
            if line.startswith(f"{WITNESS_MARK} acked "):
                break
        psql("ALTER SYSTEM SET synchronous_standby_names = 'nosuch'")
        psql("SELECT pg_reload_conf()")
        out, err = witness.communicate(timeout=120)
    finally:
        witness.kill()
        psql("ALTER SYSTEM RESET synchronous_standby_names")
        psql("SELECT pg_reload_conf()")
    text = "".join(lines) + out
    assert witness.returncode == 0, text + err
    log = parse_witness_log(text)
    acked = [a for a in log.attempts if a.outcome == "acked"]
    waited = [a for a in log.attempts if a.outcome == "in_doubt"]
    assert acked and waited and len(acked) + len(waited) == len(log.attempts), text
    assert max(a.id for a in acked) < min(a.id for a in waited), text  # acked until the standby was required
    assert all(a.lsn is not None and "no answer in 2 s" in (a.error or "") for a in waited), text
    assert all(a.t_done - a.t_sent >= 2 for a in waited), text  # ended by the deadline, not by an error
    assert log.present == [a.id for a in acked]  # the waiting ones committed locally but are not visible yet
    # its time was up with its writes in doubt: it went on, said so, and stopped at the overtime's end all the same
    over = float(text.split(f"{WITNESS_MARK} overtime ")[1].split()[0])
    assert any(a.t_sent >= over for a in waited), text
    assert max(a.t_sent for a in log.attempts) < over + 4 + 1, text


# ------------------------------------------------------------------ the exporter, through the pod proxy
EXPORTER_PLAN = k8s_plan("matrix: {clients: [1], jobs: [1]}", "run: {duration: 4s}")
MIB = 1024 * 1024


def load(api: FakeAPI, t: float) -> float:
    """Seconds of load the primary has seen at ``t``: the counters move while a run's Job runs, not before."""
    starts = [c for j, c in api.job_created_at.items() if "-run-" in j]
    return 0.0 if not starts else min(max(t - max(starts), 0.0), JOB_S)


def primary_values(x: float) -> dict[str, float | None]:
    return {"xact_commit": 1000 + 2000 * x, "xact_rollback": 5 + 10 * x, "blks_read": 300 + 100 * x,
            "blks_hit": 1e6 + 9e4 * x, "wal_bytes": 1.3e7 + 4 * MIB * x, "checkpoints_timed": 4 + (x > 0.6),
            "checkpoints_req": 2.0, "buffers_checkpoint": 1145 + (300 if x > 0.6 else 0),
            "wal_records": 32123 + 9000 * x, "wal_fpi": 1830 + 700 * x, "buffers_backend": 2204 + 50 * x,
            "buffers_backend_fsync": 0.0, "buffers_clean": 12 + 8 * x}


def standby_lags(x: float) -> dict[str, dict[str, float]]:
    return {"pg-2": {"replay_lag_seconds": 0.001 + 0.01 * x, "write_lag_seconds": 0.0005 + 0.002 * x,
                     "flush_lag_seconds": 0.0007 + 0.003 * x, "replay_diff_bytes": 8192 * x}}


def exporter_run(api: FakeAPI, api_client: client.ApiClient, tmp_path: Path,
                 values: Callable[[float], dict[str, float | None]] = primary_values) -> tuple[Store, Any]:
    api.job_seconds = JOB_S
    api.default_log = timed_log(api)
    api.exporter = lambda pod, t: (exporter_text(pod, values(load(api, t)), standbys=standby_lags(load(api, t)))
                                   if pod == "pg-1" else exporter_text(pod, primary=False))
    result = run(api_client, tmp_path, EXPORTER_PLAN, scrape_s=0.05)
    assert (result.ok, result.failed) == (1, 0), result.failures
    store = Store.open(tmp_path / "results", create=False)
    (r,) = store.runs()
    return store, r


def artifact(path: Path) -> list[tuple[float, str]]:
    """(pglab's timestamp, text) of every scrape kept in an exporter/<pod>.prom file."""
    blocks = path.read_text().split("# pglab scrape ts=")[1:]
    return [(float(b.split("\n", 1)[0]), b.split("\n", 1)[1]) for b in blocks]


def test_exporter_deltas_over_the_window_are_what_the_primary_served(fake: tuple[FakeAPI, client.ApiClient],
                                                                    tmp_path: Path) -> None:
    api, api_client = fake
    store, r = exporter_run(api, api_client, tmp_path)
    run_dir = store.dir / r.dir
    window = store.conn.execute("SELECT window_start, window_end FROM runs WHERE id = ?", (r.id,)).fetchone()
    t0 = api.job_created_at["pg-run-0000-1"]
    assert window == pytest.approx((t0 + 0.3 - 0.001, t0 + 0.9), abs=1e-5)

    # every text served by each pod's exporter for the run is kept, in order, with pglab's timestamp (the first
    # read, whether the standbys had caught up, is not the run's)
    kept = artifact(run_dir / "exporter" / "pg-1.prom")
    replay, *served = [(t, text) for pod, t, text in api.scrapes if pod == "pg-1"]
    assert replay[0] < kept[0][0]
    assert [text for _, text in kept] == [text for _, text in served] and len(kept) >= 10
    assert [text for _, text in artifact(run_dir / "exporter" / "pg-2.prom")] == [
        text for pod, _, text in api.scrapes if pod == "pg-2"]
    # pglab's timestamp is its read's middle: after the read before it was served, before the next one was (the
    # reads of a pod follow one another), wherever the served moment fell in a read a loaded machine made slow
    times = [replay[0], *(t for t, _ in served)]
    assert all(times[i] < ts < (times[i + 2] if i + 2 < len(times) else float("inf"))
               for i, (ts, _) in enumerate(kept)), (times, [ts for ts, _ in kept])

    # the figures: the primary's first and last read inside the window, end − start, over pglab's own Δt
    inside = [i for i, (ts, _) in enumerate(kept) if window[0] <= ts <= window[1]]
    first, last = inside[0], inside[-1]
    info = json.loads((run_dir / "run.json").read_text())["exporter"]
    assert info["primary"] == "pg-1" and info["in_window"] == len(inside)
    assert (info["start"], info["end"]) == pytest.approx((kept[first][0], kept[last][0]), abs=1e-6)
    a, b = primary_values(load(api, served[first][0])), primary_values(load(api, served[last][0]))
    dt = info["end"] - info["start"]
    m = r.metrics

    def delta(k: str) -> float:
        after, before = b[k], a[k]
        assert after is not None and before is not None
        return after - before

    # (a rate per second of the served moments: dt is between the kept reads, each placed between its neighbours'
    # served moments above; the fake's 2000 a second against the clock is not asserted, a loaded machine's read
    # can take longer than a tenth of the interval)
    assert m["commits_s"] == pytest.approx(delta("xact_commit") / dt, rel=1e-9)
    assert m["rollbacks_s"] == pytest.approx(delta("xact_rollback") / dt, rel=1e-9)
    assert m["blks_read_s"] == pytest.approx(delta("blks_read") / dt, rel=1e-9)
    assert m["blks_hit_s"] == pytest.approx(delta("blks_hit") / dt, rel=1e-9)
    assert m["wal_mb_s"] == pytest.approx(delta("wal_bytes") / MIB / dt, rel=1e-9)
    assert m["cache_hit_pct"] == pytest.approx(delta("blks_hit") / (delta("blks_hit") + delta("blks_read")) * 100)
    assert (m["checkpoints_timed"], m["checkpoints_req"], m["buffers_checkpoint"]) == (
        delta("checkpoints_timed"), 0, delta("buffers_checkpoint"))
    # why the run went as it did (pg_stat_wal, the backends' own writes): counts over the window, and per commit
    for k in ("wal_records", "wal_fpi", "buffers_backend", "buffers_backend_fsync", "buffers_clean"):
        assert m[k] == pytest.approx(delta(k), rel=1e-9), k
    assert m["wal_fpi_per_commit"] == pytest.approx(delta("wal_fpi") / delta("xact_commit"), rel=1e-9)
    assert m["wal_bytes_per_commit"] == pytest.approx(delta("wal_bytes") / delta("xact_commit"), rel=1e-9)
    lags = [standby_lags(load(api, served[i][0]))["pg-2"] for i in inside]
    assert m["replay_lag_max_ms"] == pytest.approx(max(x["replay_lag_seconds"] for x in lags) * 1000)
    assert m["repl.pg-2.write_lag_max_ms"] == pytest.approx(max(x["write_lag_seconds"] for x in lags) * 1000)
    assert m["replay_lsn_distance_max_bytes"] == pytest.approx(max(x["replay_diff_bytes"] for x in lags))
    # the series: between consecutive reads, the served counters' increase over pglab's own Δt (exactly; against the
    # fake's 2000 a second, 0.05 s apart, a loaded machine's reads were 2,843 once: a read's middle is not when its
    # answer was served)
    pg_series = [(ts, v) for ts, _s, metric, v in store.series(r.id, "pg") if metric == "commits_s"]
    commits = [float(re.findall(r'^cnpg_pg_stat_database_xact_commit\{datname="app"\} (\S+)$', text, re.M)[0])
               for _, text in kept]
    assert [ts for ts, _ in pg_series] == pytest.approx([ts for ts, _ in kept[1:]], abs=1e-6)
    assert len(pg_series) == len(kept) - 1
    for (t0, _), (t1, _), c0, c1, (_, v) in zip(kept, kept[1:], commits, commits[1:], pg_series, strict=False):
        rate = (c1 - c0) / (t1 - t0)  # the file's stamps are to the microsecond: each edge 0.5 µs off at most
        assert v == pytest.approx(rate, abs=rate * 1.01e-6 / (t1 - t0) + 1e-9), (t0, t1, c0, c1)
    assert max(v or 0.0 for _, v in pg_series) > 0
    store.close()
    assert_all_deleted(api)
    assert ("GET", "/api/v1/namespaces/bench/pods/pg-1:9187/proxy/metrics") in [
        (m_, unquote(p)) for m_, p in api.requests]


def test_a_metric_the_exporter_lacks_is_not_stored(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = fake
    store, r = exporter_run(api, api_client, tmp_path, lambda x: {**primary_values(x), "wal_bytes": None,
                                                                  "checkpoints_timed": None})
    assert r.metrics["commits_s"] == pytest.approx(2000, rel=0.1)
    assert "wal_mb_s" not in r.metrics and "checkpoints_timed" not in r.metrics  # absent, not 0
    assert "checkpoints_req" in r.metrics
    store.close()


def test_a_scrape_without_the_database_counters_leaves_them_to_the_scrapes_that_have_them() -> None:
    # a busy exporter answers without a query's metrics when that query failed: the commits come from the first and
    # last scrapes inside the window that have them, the WAL figures from theirs
    def scrape(ts: float, database: bool) -> exporter.Scrape:
        x = ts / 10
        values = primary_values(x) if database else {**primary_values(x), "xact_commit": None, "xact_rollback": None,
                                                     "blks_read": None, "blks_hit": None}
        text = exporter_text("pg-1", values)
        return exporter.Scrape("pg-1", ts, text, values=exporter.parse(text))

    scrapes = [scrape(0.0, True), scrape(1.0, False), scrape(2.0, True), scrape(3.0, True), scrape(4.0, False)]
    fig = exporter.summarize(scrapes, "pg-1", (0.5, 4.5), "app")
    assert (fig.info["start"], fig.info["end"], fig.info["without_database_counters"]) == (2.0, 3.0, 2)
    assert fig.metrics["commits_s"] == pytest.approx(200.0)  # 2000 per unit of x, x = ts / 10: over 2.0 → 3.0
    assert fig.metrics["wal_mb_s"] == pytest.approx(0.4 * 3 / 3)  # the server counters: 1.0 → 4.0
    only_one = exporter.summarize(scrapes[:3], "pg-1", (0.5, 4.5), "app")
    assert "commits_s" not in only_one.metrics and "note" in only_one.info
    assert only_one.metrics["wal_mb_s"] == pytest.approx(0.4)


def test_an_unreadable_exporter_gives_no_figures_and_the_run_goes_on(fake: tuple[FakeAPI, client.ApiClient],
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    api, api_client = fake
    api.exporter = lambda pod, t: None  # 503, as the API server answers for a pod whose port does not answer
    monkeypatch.setattr(k8s_sweep, "REPLAY_TIMEOUT_S", 0.3)  # asked again until then: it may be a pod restarting
    observer = Recorder()
    result = run(api_client, tmp_path, EXPORTER_PLAN, scrape_s=0.05, observer=observer)
    assert (result.ok, result.failed) == (1, 0)
    store = Store.open(tmp_path / "results", create=False)
    (r,) = store.runs()
    assert not any(k in r.metrics for k in ("commits_s", "wal_mb_s", "replay_lag_max_ms"))
    assert [m for m in observer.messages if m.startswith("exporter not read: pod/pg-1: ")]
    assert len([m for m in observer.messages if m.startswith("standbys' replay not checked before this run: ")]) == 1
    store.close()


def test_the_prometheus_text_parser() -> None:
    text = exporter_text("pg-1", {"wal_bytes": 13429908.0}) + (
        'cnpg_pg_settings_setting{name="a\\"b\\\\c"} NaN\n'
        "cnpg_collector_pg_wal{value=\"volume_size\"} +Inf 1733281603000\n"
        "not a metric line\n")
    values = exporter.parse(text)
    assert values[("cnpg_collector_wal_bytes", frozenset({("stats_reset", "2026-11-20T08:12:31.203411Z")}))] == \
        13429908.0
    assert values[("cnpg_pg_stat_database_xact_commit", frozenset({("datname", "app")}))] == 7887
    assert values[("cnpg_pg_stat_database_blks_read", frozenset({("datname", "")}))] == 94
    assert values[("cnpg_collector_pg_wal", frozenset({("value", "volume_size")}))] == float("inf")
    nan = values[("cnpg_pg_settings_setting", frozenset({("name", 'a"b\\c')}))]
    assert nan != nan
    assert not any(k[0].startswith("not") for k in values)


# ------------------------------------------------------------------ the standbys' replay before each run
def behind_until(api: FakeAPI, caught_up_after: int | None) -> Callable[[str, float], str | None]:
    """The primary's exporter: pg-2 8 KiB behind for its first ``caught_up_after`` scrapes (None: always)."""
    seen = {"n": 0}

    def text(pod: str, t: float) -> str | None:
        if pod != "pg-1":
            return exporter_text(pod, primary=False)
        seen["n"] += 1
        late = caught_up_after is None or seen["n"] <= caught_up_after
        lags = {"replay_diff_bytes": 8192.0 if late else 0.0, "replay_lag_seconds": 0.02 if late else 0.0}
        return exporter_text(pod, standbys={"pg-2": lags})

    return text


def test_each_run_starts_once_the_standbys_have_replayed(fake: tuple[FakeAPI, client.ApiClient],
                                                         tmp_path: Path) -> None:
    api, api_client = fake
    api.exporter = behind_until(api, 3)
    result = run(api_client, tmp_path, EXPORTER_PLAN)
    assert (result.ok, result.failed) == (1, 0), result.failures
    primary_reads = [(t, "8192" in text) for pod, t, text in api.scrapes if pod == "pg-1"]
    assert [behind for _, behind in primary_reads[:4]] == [True, True, True, False]
    assert primary_reads[3][0] < api.job_created_at["pg-run-0000-1"]  # the Job came after the caught-up read


def test_standbys_that_never_catch_up_fail_the_run_and_say_why(fake: tuple[FakeAPI, client.ApiClient],
                                                               tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    api, api_client = fake
    api.exporter = behind_until(api, None)
    monkeypatch.setattr(k8s_sweep, "REPLAY_TIMEOUT_S", 0.2)
    result = run(api_client, tmp_path, EXPORTER_PLAN)
    assert (result.ok, result.failed) == (0, 1)
    store = Store.open(tmp_path / "results", create=False)
    (r,) = store.runs()
    assert r.status == "failed" and "the standbys did not catch up within 0 s" in (r.reason or "")
    assert "pg-2 8192 bytes behind" in (r.reason or "")
    store.close()
    assert "pg-run-0000-1" not in api.job_created_at  # no Job measured a backlog
    assert_all_deleted(api)


def test_a_primary_exporter_unreadable_for_a_moment_is_asked_again(fake: tuple[FakeAPI, client.ApiClient],
                                                                   tmp_path: Path) -> None:
    api, api_client = fake
    caught_up = behind_until(api, 0)
    seen = {"n": 0}

    def flaky(pod: str, t: float) -> str | None:
        if pod == "pg-1":
            seen["n"] += 1
            if seen["n"] <= 2:
                return None  # 503: the pod restarting
        return caught_up(pod, t)

    api.exporter = flaky
    observer = Recorder()
    result = run(api_client, tmp_path, EXPORTER_PLAN, observer=observer)
    assert (result.ok, result.failed) == (1, 0)
    assert not [m for m in observer.messages if m.startswith("standbys' replay not checked")]
    first_ok = next(t for pod, t, _ in api.scrapes if pod == "pg-1")  # api.scrapes holds the answered reads
    assert first_ok < api.job_created_at["pg-run-0000-1"]


def test_without_pods_proxy_permission_the_replay_is_not_waited_for(fake: tuple[FakeAPI, client.ApiClient],
                                                                   tmp_path: Path) -> None:
    api, api_client = fake
    api.proxy_forbidden = True
    observer = Recorder()
    result = run(api_client, tmp_path, EXPORTER_PLAN.replace("{duration: 4s}", "{duration: 4s, repeats: 2}"),
                 observer=observer)
    assert (result.ok, result.failed) == (2, 0)
    told = [m for m in observer.messages if m.startswith("standbys' replay not checked before the runs: ")]
    assert len(told) == 1 and "403" in told[0]  # once for the sweep, and at once: asking again until the
    assert not [m for m in observer.messages if "before this run" in m]  # deadline would say "before this run"
