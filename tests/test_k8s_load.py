"""Kubernetes runs over several pgbench pods (run.load_pods) and figures from the cluster's Prometheus: the Job
pglab renders (decoded strictly by tools/cnpg-check), its shell script run here by sh with stand-ins for psql and
pgbench, the transaction logs merged, and the plan's refusals. The real runs are tests/test_kube_lab_scale.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest
from kubernetes import client

from conftest import pglab
from k8s_fake import FakeAPI, results_log
from k8s_support import assert_all_deleted, check, cli, k8s_plan, kubeconfig, pod_log, posted_jobs, run
from pglab.plan.expand import expand
from pglab.plan.load import parse_plan
from pglab.store.sqlite import Store
from pglab.targets.kubernetes.clients import pools_apart
from pglab.targets.kubernetes.orchestrate import K8sError
from pglab.targets.kubernetes.render import (
    LOAD_LABEL,
    client_cores,
    load_shares,
    pgbench_init,
    pgbench_run,
    render,
    split,
    target_of,
    to_yaml,
)
from pglab.workloads import txlog
from pglab.workloads.pgbench import PgbenchError

PLAN = """
name: lp
target:
  kubernetes:
    namespace: bench
    cluster_name: pg
    instances: 1
    resources: {cpu: 1, memory: 1Gi}
postgres:
  parameters: {work_mem: 8MB}
matrix: {clients: [5], jobs: [2]}
run: {duration: 10s, load_pods: 2}
"""


def job_of(text: str = PLAN) -> dict:
    plan = parse_plan(text)
    [point] = expand(plan, cores=client_cores(target_of(plan)))
    return pgbench_run(plan, point).body


def test_splits_are_as_even_as_possible_larger_first() -> None:
    assert split(5, 2) == [3, 2]
    assert split(4, 3) == [2, 1, 1]
    assert split(6, 3) == [2, 2, 2]
    plan = parse_plan(PLAN)
    [point] = expand(plan)
    assert load_shares(plan, point) == [(3, 1), (2, 1)]
    # fewer threads than pods: each pod still runs one
    plan = parse_plan(PLAN.replace("jobs: [2]", "jobs: [1]").replace("load_pods: 2", "load_pods: 3"))
    [point] = expand(plan)
    assert load_shares(plan, point) == [(2, 1), (2, 1), (1, 1)]


def test_the_run_is_one_indexed_job_of_load_pods_apart() -> None:
    job = job_of()
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == \
        ("Indexed", 2, 2, 0)
    template = spec["template"]
    assert template["metadata"]["labels"][LOAD_LABEL] == job["metadata"]["name"]
    terms = template["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    apart = [t for t in terms if t["podAffinityTerm"]["labelSelector"]["matchLabels"].get(LOAD_LABEL)]
    assert apart and apart[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    required = template["spec"]["affinity"]["podAntiAffinity"].get("requiredDuringSchedulingIgnoredDuringExecution", [])
    assert LOAD_LABEL not in str(required)  # preferred only: two pods fit on one node
    assert job["metadata"]["annotations"]["pglab/load-shares"] == "3c/1j 2c/1j"


def test_the_load_job_decodes_as_the_api_server_would(tmp_path: Path, checker: Path) -> None:
    plan = parse_plan(PLAN)
    path = tmp_path / "all.yaml"
    path.write_text("---\n".join(to_yaml(m.body) for m in render(plan, tmp_path)))
    result = check(checker, path)
    assert result.returncode == 0, result.stdout


STUBS = {
    # psql: logs its SQL; the barrier's count answers how many pods entered (the shared file of rows)
    "psql": r"""#!/bin/sh
for a in "$@"; do last=$a; done
echo "$POD psql $last" >> "$LOG"
case "$last" in
  *"INSERT INTO pglab_load_barrier"*) echo row >> "$ROWS" ;;
  *"SELECT count(*) FROM pglab_load_barrier"*) wc -l < "$ROWS" | tr -d ' ' ;;
  *"FROM (VALUES"*) echo 'work_mem|8192|kB|f|t' ;;
esac
""",
    "pgbench": r"""#!/bin/sh
echo "$POD pgbench $*" >> "$LOG"
echo "tps = 1.0 (without initial connection time)"
""",
}


def run_pod(script: str, index: int, tmp: Path, rows: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    results = tmp / f"results-{index}"
    results.mkdir()
    body = script.replace("/results", str(results))
    return subprocess.Popen(["sh", "-c", body], text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**env, "JOB_COMPLETION_INDEX": str(index), "POD": str(index), "ROWS": str(rows),
                                 "PGLAB_JOB_UID": "uid-1"})


def test_pod_zero_resets_then_every_pod_starts_after_all_entered(tmp_path: Path) -> None:
    """The script itself, by sh: pod 0 waits for the parameters and resets the dataset, each pod enters the barrier,
    and no pgbench starts before both did; each runs its share."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log, rows = tmp_path / "log", tmp_path / "rows"
    rows.touch()
    script = job_of()["spec"]["template"]["spec"]["containers"][0]["command"][2]
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(log)}
    late = run_pod(script, 1, tmp_path, rows, env)  # pod 1 alone must wait for pod 0
    try:
        late.wait(timeout=1.5)
        pytest.fail(f"pod 1 ended before pod 0 entered: {late.communicate()}")
    except subprocess.TimeoutExpired:
        pass
    assert "pgbench" not in log.read_text()
    first = run_pod(script, 0, tmp_path, rows, env)
    for p in (first, late):
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, (out, err)
        assert "----- pglab results begin -----" in out
    lines = log.read_text().splitlines()
    pgbench_at = [i for i, line in enumerate(lines) if " pgbench " in line]
    entered = [i for i, line in enumerate(lines) if "INSERT INTO pglab_load_barrier" in line]
    assert len(entered) == 2 and len(pgbench_at) == 2 and max(entered) < min(pgbench_at), lines
    reset = [line for line in lines if "TRUNCATE pgbench_history" in line or "VACUUM" in line or
             "FROM (VALUES" in line]
    assert reset and all(line.startswith("0 ") for line in reset), lines
    assert any(re.search(r"^0 pgbench .*-c 3 -j 1 ", line) for line in lines), lines
    assert any(re.search(r"^1 pgbench .*-c 2 -j 1 ", line) for line in lines), lines


def test_merged_logs_are_the_logs_read_together(tmp_path: Path) -> None:
    """txlog.concat of two pods' logs: the same transactions, end times and percentiles as one read of both."""
    a, b = tmp_path / "pgbench.1", tmp_path / "pgbench.2"
    a.write_text("".join(f"0 {i} {100 + i * 7} 0 1700000000 {i * 1000} \n" for i in range(50)))
    b.write_text("".join(f"1 {i} {90 + i * 13} 0 1700003000 {i * 999} \n" for i in range(40)) +
                 "1 40 failed 0 1700003001 5 \n")
    merged = txlog.concat([txlog.read([a]), txlog.read([b])])
    both = txlog.read([a, b])
    assert np.array_equal(merged.latency_us, both.latency_us)
    assert np.array_equal(merged.end_ts(), both.end_ts())
    assert np.array_equal(merged.failed_end_ts, both.failed_end_ts)
    assert txlog.percentiles_ms(merged.latency_us, [50, 99]) == [
        float(np.percentile(both.latency_us / 1000.0, 50)), float(np.percentile(both.latency_us / 1000.0, 99))]


# ------------------------------------------------------------------ the runs in long-lived client pods (exec)
SWEEP = PLAN.replace("postgres:\n  parameters: {work_mem: 8MB}\n", "").replace(
    "load_pods: 2}", "load_pods: 2, repeats: 2, order: sequential}")


def test_each_load_pods_share_runs_in_its_own_client_pod_made_once(fake: tuple[FakeAPI, client.ApiClient],
                                                                   tmp_path: Path) -> None:
    api, api_client = fake
    result = run(api_client, tmp_path, SWEEP)
    assert (result.ok, result.failed) == (2, 0)
    pods = [b for b in api.posted if b["kind"] == "Pod"]
    assert [p["metadata"]["name"] for p in pods] == ["pg-clients-0", "pg-clients-1"]  # once for both runs
    plan = parse_plan(SWEEP)
    job_pod = pgbench_run(plan, expand(plan, cores=client_cores(target_of(plan)))[0]).body["spec"]["template"]["spec"]
    for p in pods:  # the Job's pod: image, resources, placement; apart from each other
        spec, container = p["spec"], p["spec"]["containers"][0]
        assert container["image"] == job_pod["containers"][0]["image"]
        assert container.get("resources") == job_pod["containers"][0].get("resources")
        assert {e["name"] for e in container["env"]} == {"PGHOST", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE"}
        anti = spec["affinity"]["podAntiAffinity"]
        assert anti["requiredDuringSchedulingIgnoredDuringExecution"] == job_pod["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]  # never beside an instance
        [apart] = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        assert apart["podAffinityTerm"]["labelSelector"]["matchLabels"] == {LOAD_LABEL: "pg-clients"}
        assert p["metadata"]["labels"][LOAD_LABEL] == "pg-clients"
    (_, init, first), *runs = api.execs  # the dataset's pgbench -i first, in pod 0 alone, as a one-pod Job
    assert (init, first) == ("pg-pgbench-init", "pg-clients-0")
    assert "JOB_COMPLETION_INDEX" not in api.exec_scripts[0] and "PGLAB_JOB_UID" not in api.exec_scripts[0]
    scripts = api.exec_scripts[1:]
    keys = [re.search(r"^export PGLAB_JOB_UID=(\S+)$", s, re.M)[1] for s in scripts]  # type: ignore[index]
    indexes = [re.search(r"^export JOB_COMPLETION_INDEX=(\d+)$", s, re.M)[1] for s in scripts]  # type: ignore[index]
    # one run after the other; a run's two pods started together (the fake notes each as its exec arrives)
    assert sorted((run_, pod, i) for (_, run_, pod), i in zip(runs, indexes, strict=True)) == [
        ("pg-run-0000-1", "pg-clients-0", "0"), ("pg-run-0000-1", "pg-clients-1", "1"),
        ("pg-run-0000-2", "pg-clients-0", "0"), ("pg-run-0000-2", "pg-clients-1", "1")]
    assert [run_ for _, run_, _ in runs] == ["pg-run-0000-1"] * 2 + ["pg-run-0000-2"] * 2
    assert keys[0] == keys[1] != keys[2] == keys[3]  # one barrier per run, its pods meeting at it
    store = Store.open(tmp_path / "results", create=False)
    for r in store.runs():
        assert r.metrics["load_pods"] == 2
        record = json.loads((store.dir / r.dir / "run.json").read_text())
        assert record["placement"]["pgbench"] == {"0": "node-4", "1": "node-3"}
        assert "load-1/pgbench.out" in record["files"]
    store.close()
    assert api.stops == [] and not api.clients.running
    assert_all_deleted(api)


def test_the_client_pods_start_while_the_cluster_comes_up_and_load_the_dataset(
        fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    """Created once every instance has its node, before the Cluster reads healthy: their start is hidden in the
    Cluster's wait. The dataset's pgbench -i is then the init Job's script exec'd in pod 0: no Job, no pod start;
    with no storage phase to come first, it starts as soon as that pod runs, while the standbys join."""
    api, api_client = fake
    result = run(api_client, tmp_path, SWEEP)
    assert (result.ok, result.failed) == (2, 0)
    pods = [i for i, (method, path) in enumerate(api.requests) if method == "POST" and path.endswith("/pods")]
    reads = [i for i, (method, path) in enumerate(api.requests) if method == "GET" and path.endswith("/clusters/pg")]
    healthy = reads[api.ready_after]  # the first read that says so
    assert len(pods) == 2 and pods[1] < healthy, (pods, healthy)
    assert api.execs[0][0] < healthy, (api.execs[0], healthy)
    probes = [i for i, name in api.job_posts if "-volumes-" in name]  # the first run's, beside the load
    assert probes and api.execs[0][0] < probes[0] < healthy, (probes, healthy)
    assert not [n for _, n in api.job_posts if n.endswith("-pgbench-init")]
    assert api.execs[0][1:] == ("pg-pgbench-init", "pg-clients-0")
    init = pgbench_init(parse_plan(SWEEP)).body["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert f"exec /bin/sh -c {shlex.quote(init)}" in api.exec_scripts[0]


APART = SWEEP.replace("    instances: 1\n", "    instances: 1\n    database: {node_selector: {pglab.io/role: db}}\n"
                     "    clients: {node_selector: {pglab.io/role: client}}\n")


def test_client_pods_on_nodes_no_instance_may_use_start_with_the_primary(
        fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    """Node selectors that no node can meet both: the client pods are created at the first read showing the primary
    ready, without waiting for the instances' nodes (they cannot turn one away), and the load starts in them."""
    assert pools_apart(parse_plan(APART)) and not pools_apart(parse_plan(SWEEP))
    assert not pools_apart(parse_plan(APART.replace("role: client", "role: db")))
    assert not pools_apart(parse_plan(APART.replace("{pglab.io/role: client}", "{pool: clients}")))
    api, api_client = fake
    result = run(api_client, tmp_path, APART)
    assert (result.ok, result.failed) == (2, 0)
    reads = [i for i, (method, path) in enumerate(api.requests) if method == "GET" and path.endswith("/clusters/pg")]
    pods = [i for i, (method, path) in enumerate(api.requests) if method == "POST" and path.endswith("/pods")]
    lists = [i for i, (method, path) in enumerate(api.requests) if method == "GET" and path.endswith("/pods")]
    assert reads[1] < pods[0] < reads[2] and not [i for i in lists if i < pods[0]], (reads, pods, lists)
    assert reads[1] < api.execs[0][0] < reads[2]


def test_the_load_waits_for_every_standby_to_have_joined(fake: tuple[FakeAPI, client.ApiClient],
                                                          tmp_path: Path) -> None:
    """A standby's pod exists once its join Job has taken its base backup, which waits for a checkpoint spread over
    the dirty buffers (111 s after a load on the lab): the load starts only once every instance pod exists, the
    client pods (apart) long before."""
    api, api_client = fake
    api.ready_after, api.standbys_listed_after = 6, 4
    result = run(api_client, tmp_path, APART.replace("instances: 1", "instances: 2"))
    assert (result.ok, result.failed) == (2, 0)
    reads = [i for i, (method, path) in enumerate(api.requests) if method == "GET" and path.endswith("/clusters/pg")]
    pods = [i for i, (method, path) in enumerate(api.requests) if method == "POST" and path.endswith("/pods")]
    assert reads[1] < pods[0] < reads[2]
    assert reads[4] < api.execs[0][0] < reads[5], (reads, api.execs[0])


def test_a_load_begun_while_the_cluster_comes_up_is_stopped_when_it_never_does(
        fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    """The primary ready, the Cluster never healthy: the dataset's load under way in pod 0 is stopped before the
    sweep fails with the Cluster's reason, and nothing is left."""
    api, api_client = fake
    api.ready_after = 10**9
    api.hanging_execs.add(("pg-pgbench-init", "pg-clients-0"))
    with pytest.raises(K8sError, match=r"^Cluster/pg not ready after 1 s \(phase: Creating a new replica"):
        run(api_client, tmp_path, SWEEP, ready_timeout_s=1.0)
    assert [(pod, run_) for pod, _, run_ in api.stops] == [("pg-clients-0", "pg-pgbench-init")]
    assert not api.clients.running
    assert_all_deleted(api)


def test_a_load_that_failed_while_the_cluster_came_up_fails_the_sweep_once_it_is_up(
        fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = fake
    api.ready_after = 4
    api.failing_execs.add(("pg-pgbench-init", "pg-clients-0"))
    api.logs["pg-pgbench-init"] = results_log({}, text="pgbench: error: connection to server failed\n")
    with pytest.raises(PgbenchError, match=r"^pgbench -i failed in pod/pg-clients-0: pgbench: error: connection "):
        run(api_client, tmp_path, SWEEP)
    reads = [i for i, (method, path) in enumerate(api.requests) if method == "GET" and path.endswith("/clusters/pg")]
    assert [run_ for _, run_, _ in api.execs] == ["pg-pgbench-init"] and api.execs[0][0] < reads[-1]
    assert not api.stops and not posted_jobs(api, since=api.execs[0][0] + 1)
    assert_all_deleted(api)


def test_a_load_pod_that_fails_stops_the_others(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    """As the load Job's backoffLimit 0 ends the others: pod 0 failed (its reset, say), pod 1 would wait at the
    barrier until its deadline; it is stopped, the run fails naming pod 0, and the next run goes on."""
    api, api_client = fake
    api.failing_execs.add(("pg-run-0000-1", "pg-clients-0"))
    api.hanging_execs.add(("pg-run-0000-1", "pg-clients-1"))
    result = run(api_client, tmp_path, SWEEP)
    assert (result.ok, result.failed) == (1, 1)
    assert [(pod, run_) for pod, _, run_ in api.stops] == [("pg-clients-1", "pg-run-0000-1")]
    store = Store.open(tmp_path / "results", create=False)
    failed = [r for r in store.runs() if r.status == "failed"]
    assert len(failed) == 1 and (failed[0].reason or "").startswith("load pod 0 of Job/pg-run-0000-1 failed")
    store.close()
    assert not api.clients.running
    assert_all_deleted(api)


# ------------------------------------------------------------------ the plan refuses what does not fit
PROM = "    prometheus: {url: 'https://prom.example:9090', interval: 30s}\n"


@pytest.mark.parametrize(("replace", "message"), [
    (("load_pods: 2", "load_pods: 6"),
     "run.load_pods: 6 pods need at least 6 clients, but matrix.clients has 5; lower run.load_pods or raise the "
     "clients"),
    (("load_pods: 2", "load_pods: 0"), "run.load_pods: must be a positive integer"),
    (("  kubernetes:\n", "  local: {}\n  kubernetes_: \n"), None),
    (("    instances: 1\n", "    instances: 1\n" + PROM + "    node_exporter: {}\n"),
     "target.kubernetes.node_exporter: give node_exporter or prometheus, not both"),
    (("    instances: 1\n", "    instances: 1\n    prometheus: {url: 'https://p:9090', cert_file: c.pem}\n"),
     "target.kubernetes.prometheus.key_file: give cert_file and key_file together"),
    (("    instances: 1\n", "    instances: 1\n    prometheus: {url: 'prom:9090'}\n"),
     "target.kubernetes.prometheus.url: must be an http:// or https:// URL"),
])
def test_plan_refuses_with_the_field(tmp_path: Path, replace: tuple[str, str], message: str | None) -> None:
    assert replace[0] in PLAN
    if message is None:  # load_pods on a local target
        text = "name: lp\ntarget: {local: {}}\nmatrix: {clients: [4]}\nrun: {duration: 10s, load_pods: 2}\n"
        message = "run.load_pods: spreading a run over pgbench pods needs target: kubernetes; remove run.load_pods"
    else:
        text = PLAN.replace(*replace)
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    proc = pglab("plan", "validate", str(path))
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_with_prometheus_no_disk_sampler_is_rendered(tmp_path: Path) -> None:
    plan = parse_plan(PLAN.replace("    instances: 1\n", "    instances: 1\n" + PROM))
    kinds = [m.kind for m in render(plan, tmp_path)]
    assert "DaemonSet" not in kinds
    assert "DaemonSet" in [m.kind for m in render(parse_plan(PLAN), tmp_path)]


def test_an_unreachable_prometheus_is_refused_before_anything_is_created(
        fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        text = k8s_plan("matrix: {clients: [1], jobs: [1]}", "run: {duration: 4s}",
                        kubernetes=(f"kubeconfig: {kubeconfig(tmp_path, api_client)}",
                                    f"prometheus: {{url: 'http://127.0.0.1:{port}'}}"))
        plan = tmp_path / "plan.yaml"
        plan.write_text(text)
        assert cli(monkeypatch, "run", str(plan), "--results", str(tmp_path / "r")) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after the preflight's lines on the cluster: one sentence
    assert last.startswith(f"error: target.kubernetes.prometheus: Prometheus at http://127.0.0.1:{port} cannot be "
                           "reached"), err
    assert err.count("error:") == 1 and "Traceback" not in err, err
    assert posted_jobs(api) == [] and not api.created and api.objects == {}  # nothing was created


# ------------------------------------------------------------------ a rate over the load pods
RATED = SWEEP.replace("load_pods: 2, repeats: 2, order: sequential}",
                      "load_pods: 2, repeats: 1, rate: 300, latency_limit: 5ms}")


def rated_pod_files(processed: int, skipped: int, late: int, lag: tuple[float, float], first: int) -> dict[str, str]:
    """One load pod's shipped files as pgbench 15 writes them with -R and --latency-limit: its summary (the rate's
    lines), and a -l log of 40 transactions a second over 10 s from epoch ``first``, each with its schedule lag."""
    out = ("pgbench (15.18 (Debian 15.18-0+deb12u1))\ntransaction type: <builtin: TPC-B (sort of)>\n"
           "scaling factor: 1\nquery mode: simple\nnumber of clients: 3\nnumber of threads: 1\n"
           "maximum number of tries: 1\nduration: 10 s\n"
           f"number of transactions actually processed: {processed}\n"
           "number of failed transactions: 0 (0.000%)\n"
           f"number of transactions skipped: {skipped} ({skipped / (processed + skipped) * 100:.3f}%)\n"
           f"number of transactions above the 5.0 ms latency limit: {late}/{processed} "
           f"({late / processed * 100:.3f}%)\n"
           "latency average = 2.393 ms\nlatency stddev = 1.635 ms\n"
           f"rate limit schedule lag: avg {lag[0]:.3f} (max {lag[1]:.3f}) ms\n"
           "initial connection time = 7.413 ms\ntps = 179.861729 (without initial connection time)\n")
    txn = "".join(f"0 {i} {2000 + 10 * i} 0 {first + i // 40} {(i % 40) * 25000} {300 + i}\n" for i in range(400))
    return {"pgbench.out": out, "pgbench.err": "", "pgbench.41": txn, "reset.log": "TRUNCATE TABLE\nVACUUM\n"}


def test_a_rate_is_shared_by_the_load_pods_and_their_schedule_figures_merged(
        fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    """run.rate 300 over two pods of 3 and 2 clients: each pod's pgbench runs -R 180 and -R 120, and the run's
    schedule lag is the mean of both pods' transactions (each pod's average weighted by what it processed), its
    maximum the larger, its skipped and late shares those of the pods' counts added."""
    api, api_client = fake
    outputs = [results_log(rated_pod_files(1794, 3, 12, (0.321, 4.567), 1795359921), text=""),
               results_log(rated_pod_files(1190, 40, 30, (2.5, 9.25), 1795359921), text="")]
    calls: dict[str, int] = {}

    def log(job: str) -> str:  # the fake tells the run, not the pod: the pods' outputs in the order they end
        if "-run-" not in job:
            return pod_log(job)
        calls[job] = calls.get(job, 0) + 1
        return outputs[calls[job] - 1]

    api.default_log = log
    result = run(api_client, tmp_path, RATED)
    assert (result.ok, result.failed) == (1, 0)
    rates = {}
    for script in api.exec_scripts[1:]:  # the runs' (the dataset's load first)
        index = re.search(r"^export JOB_COMPLETION_INDEX=(\d+)$", script, re.M)[1]  # type: ignore[index]
        branch = re.search(rf"^{index}\)\n(.*?)^;;$", script, re.M | re.S)[1]  # type: ignore[index]
        [command] = [line for line in branch.splitlines() if line.lstrip().startswith("if") and "pgbench " in line]
        args = command.split()
        rates[index] = (args[args.index("-c") + 1], args[args.index("-R") + 1], "--latency-limit=5" in args)
    assert rates == {"0": ("3", "180", True), "1": ("2", "120", True)}
    store = Store.open(tmp_path / "results", create=False)
    [r] = store.runs()
    # the oracle: each pod's own pgbench.out, as shipped into its folder (whichever pod printed which)
    pods = []
    for i in range(2):
        out = (store.dir / r.dir / f"load-{i}" / "pgbench.out").read_text()
        lag = re.search(r"^rate limit schedule lag: avg ([\d.]+) \(max ([\d.]+)\) ms$", out, re.M)
        numbers = [int(re.search(p, out, re.M)[1]) for p in (  # type: ignore[index]
            r"^number of transactions actually processed: (\d+)", r"^number of transactions skipped: (\d+)",
            r"^number of transactions above the 5\.0 ms latency limit: (\d+)/")]
        assert lag is not None
        pods.append((float(lag[1]), float(lag[2]), *numbers))
    assert sorted(p[2] for p in pods) == [1190, 1794]  # both outputs were shipped, one per pod
    processed, skipped, late = (sum(p[k] for p in pods) for k in (2, 3, 4))
    m = r.metrics
    # 1.19 ms: neither pod's own, nor their plain mean (1.41)
    assert m["schedule_lag_ms"] == pytest.approx((0.321 * 1794 + 2.5 * 1190) / 2984)
    assert m["schedule_lag_ms"] == pytest.approx(sum(p[0] * p[2] for p in pods) / processed)
    assert m["schedule_lag_max_ms"] == 9.25
    assert m["skipped_pct"] == pytest.approx(skipped / (processed + skipped) * 100) == pytest.approx(43 / 3027 * 100)
    assert m["late_pct"] == pytest.approx(late / processed * 100) == pytest.approx(42 / 2984 * 100)
    assert m["load_pods"] == 2 and m["transactions"] == 800  # the window's transactions: both pods' logs, all in it
    store.close()
    assert_all_deleted(api)
