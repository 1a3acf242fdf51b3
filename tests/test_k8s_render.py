"""pglab k8s render's folder, safe to apply: cluster/ (what makes the environment), jobs/ (what runs) and
run-jobs.sh, which applies them in order and waits for each; run here by sh against a stub kubectl.

No cluster runs here: the stub answers ``get`` as CloudNativePG and the Job controller would once done (a healthy
Cluster, instance pods at the CPU of the last patch, complete Jobs), so what is checked is the script's sequence of
kubectl commands and how it stops, not Kubernetes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import pglab

# a CPU step, a parameter, a failover with its witness, a storage phase, a pause between runs
PLAN = """
name: k
target:
  kubernetes:
    namespace: bench
    cluster_name: pg
    instances: 2
    resources: {cpu: 1, memory: 1Gi}
    storage: {size: 10Gi}
storage: {profiles: [randread-8k], runtime: 1s, size: 64MiB}
postgres:
  parameters: {jit: false}
matrix:
  clients: [1]
  jobs: [1]
  cpus: [0.5, 2]
  parameters: {work_mem: [4MB, 8MB]}
  scenario: [{kind: failover, at: 1s}]
run: {duration: 4s, pause: 1s}
"""

STUB = r"""#!/bin/sh
# kubectl stand-in: logs its arguments; a healthy Cluster of 2 instances, whose pods have the CPU of the last patch
# (none with STUB_STALE), Jobs complete (STUB_FAIL's failed, STUB_RUNNING's never done)
printf '%s\n' "$*" >> "$STUB_DIR/log"
prev=
for a in "$@"; do
  if [ "$prev" = --patch-file ] && [ -z "${STUB_STALE:-}" ]; then
    sed -n 's/.*"cpu": "\([^"]*\)".*/\1/p' "$a" | head -n 1 > "$STUB_DIR/cpu"
  fi
  prev=$a
done
case " $* " in
  *" get cluster "*) printf 'Cluster in healthy state/2' ;;
  *" get pods "*) cpu=$(cat "$STUB_DIR/cpu" 2>/dev/null || echo 500m); printf '|%s|%s\n' "$cpu" "$cpu" "$cpu" "$cpu" ;;
  *" get job ${STUB_FAIL:-none} "*) printf 'FailureTarget=True Failed=True ' ;;
  *" get job ${STUB_RUNNING:-none} "*) ;;
  *" get job "*) printf 'SuccessCriteriaMet=True Complete=True ' ;;
esac
"""


@pytest.fixture(scope="module")
def rendered_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plan rendered by ``pglab k8s render`` once for the module."""
    folder = tmp_path_factory.mktemp("render")
    (folder / "plan.yaml").write_text(PLAN)
    out = folder / "m"
    pglab("k8s", "render", str(folder / "plan.yaml"), "-o", str(out), check=True)
    return out


@pytest.fixture
def rendered(rendered_once: Path, tmp_path: Path) -> Path:
    """This test's copy of that render, to run or change (it names no path of its own: a copy is the same render)."""
    out = tmp_path / "m"
    shutil.copytree(rendered_once, out, symlinks=True)
    return out


def kinds(folder: Path) -> dict[str, str]:
    return {f.name: yaml.safe_load(f.read_text())["kind"] for f in sorted(folder.glob("*.yaml"))}


def script_lines(out: Path) -> list[str]:
    """The commands of run-jobs.sh after its functions, comments and blank lines aside."""
    text = (out / "run-jobs.sh").read_text()
    return [x for x in text.split("\n}\n")[-1].splitlines() if x and not x.startswith("#")]


def run_script(out: Path, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """run-jobs.sh by sh with the stub as ``kubectl`` on PATH (or as $KUBECTL when given); the stub's log in a short
    form: apply FILE, patch FILE, delete pvc NAME, get cluster|pods|job NAME."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "kubectl"
    stub.write_text(STUB)
    stub.chmod(0o755)
    (tmp_path / "log").unlink(missing_ok=True)
    full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_DIR": str(tmp_path), "POLL_S": "0", **env}
    proc = subprocess.run(["sh", str(out / "run-jobs.sh")], capture_output=True, text=True, timeout=60, env=full,
                          cwd=tmp_path, check=False)
    calls = []
    for line in (tmp_path / "log").read_text().splitlines() if (tmp_path / "log").exists() else []:
        words = line.replace(f"{out}/", "").split()
        if words[0] == "apply":
            calls.append(f"apply {words[2]}")
        elif "patch" in words:
            calls.append(f"patch {words[-1]}")
        elif "delete" in words:
            calls.append(f"delete pvc {words[4]}")
        else:
            get = words.index("get")
            calls.append(" ".join(words[get:get + 3]) if words[get + 1] == "job" else " ".join(words[get:get + 2]))
    return proc, calls


# ------------------------------------------------------------------ the folder
def test_the_environment_and_what_runs_are_apart(rendered: Path) -> None:
    assert kinds(rendered / "cluster") == {
        "00-namespace.yaml": "Namespace", "01-serviceaccount.yaml": "ServiceAccount", "02-role.yaml": "Role",
        "03-rolebinding.yaml": "RoleBinding", "08-monitoring.yaml": "ConfigMap", "10-cluster.yaml": "Cluster",
        "15-disk-sampler-daemonset.yaml": "DaemonSet"}
    jobs = kinds(rendered / "jobs")
    assert set(jobs.values()) == {"Job", "PersistentVolumeClaim"}  # no Cluster, Namespace, Role there
    assert "Job" not in kinds(rendered / "cluster").values()
    assert sorted(jobs) == ["20-fio-data-pvc.yaml", "21-fio-data-job.yaml", "40-pgbench-init-job.yaml",
                            *[f"50-run-000{i}-1-job.yaml" for i in range(4)],
                            *[f"50-witness-000{i}-1-job.yaml" for i in range(4)]]
    # the Cluster patches: merge patches (JSON, not manifests: cnpg-check's */*.yaml leaves them out), each sorted
    # just before its point's first run
    patches = sorted(p.name for p in (rendered / "jobs").glob("*.json"))
    assert patches == ["50-run-0001-0-cluster-patch.json", "50-run-0002-0-cluster-patch.json",
                       "50-run-0003-0-cluster-patch.json"]
    names = sorted(p.name for p in (rendered / "jobs").iterdir())
    assert names.index("50-run-0000-1-job.yaml") < names.index(patches[0]) < names.index("50-run-0001-1-job.yaml")
    step = yaml.safe_load((rendered / "jobs" / patches[1]).read_text())
    assert step["spec"]["resources"]["limits"] == {"cpu": "2", "memory": "1Gi"}
    assert step["spec"]["postgresql"]["parameters"] == {"jit": "off", "work_mem": "4MB"}
    assert os.access(rendered / "run-jobs.sh", os.X_OK)


def test_the_script_is_posix_sh_and_keeps_the_run_order(rendered: Path) -> None:
    script = rendered / "run-jobs.sh"
    for shell in ("sh", "dash"):  # dash is /bin/sh here: POSIX, no bashism
        proc = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
    text = script.read_text()
    assert text.startswith("#!/bin/sh\n")
    assert "KUBECTL=${KUBECTL:-kubectl}" in text
    lines = script_lines(rendered)
    at = lines.index
    assert lines[:3] == ["say 'plan k: namespace bench, Cluster/pg'", "apply cluster",
                         "wait_cluster 'the environment (cluster/)'"]
    assert at("wait_job pg-fio-data") < at("delete_pvc pg-fio-data") < at("apply jobs/40-pgbench-init-job.yaml")
    assert at("wait_job pg-pgbench-init") < at("apply jobs/50-run-0000-1-job.yaml")  # dataset loaded first
    cpu_step = "patch_cluster jobs/50-run-0002-0-cluster-patch.json 'CPU step cpus=2 (with work_mem=4MB)' 2000"
    assert at("wait_job pg-run-0001-1") < at(cpu_step) < at("apply jobs/50-witness-0002-1-job.yaml")
    assert at("patch_cluster jobs/50-run-0001-0-cluster-patch.json 'parameters work_mem=8MB'") < at(
        "apply jobs/50-run-0001-1-job.yaml")
    for i in range(4):  # the witness just before its run, both waited for before the next point
        assert lines[at(f"apply jobs/50-witness-000{i}-1-job.yaml") + 1] == f"apply jobs/50-run-000{i}-1-job.yaml"
        assert lines[at(f"apply jobs/50-run-000{i}-1-job.yaml") + 1:][:3] == [
            f"wait_job pg-run-000{i}-1", f"wait_job pg-witness-000{i}-1", "sleep 1  # run.pause"]
    # faults are pglab run's: said in the header and at each of those runs
    assert "# Faults (matrix.scenario: failover-node) are injected only by pglab run" in text
    assert ("# matrix.scenario failover-node: injected only by pglab run; pg-run-0002-1 runs here without the fault"
            in text)


# ------------------------------------------------------------------ the script, run against a stub kubectl
def test_the_script_applies_and_waits_in_order(rendered: Path, tmp_path: Path) -> None:
    proc, calls = run_script(rendered, tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = [c for i in range(4) for c in (
        f"apply jobs/50-witness-000{i}-1-job.yaml", f"apply jobs/50-run-000{i}-1-job.yaml",
        f"get job pg-run-000{i}-1", f"get job pg-witness-000{i}-1")]
    assert calls == [
        "apply cluster", "get cluster",
        "apply jobs/20-fio-data-pvc.yaml", "apply jobs/21-fio-data-job.yaml", "get job pg-fio-data",
        "delete pvc pg-fio-data",
        "apply jobs/40-pgbench-init-job.yaml", "get job pg-pgbench-init",
        *run[:4],
        "patch jobs/50-run-0001-0-cluster-patch.json", "get cluster",  # parameters: the run's Job waits for them
        *run[4:8],
        "patch jobs/50-run-0002-0-cluster-patch.json", "get cluster", "get pods",  # a CPU step: the pods too
        *run[8:12],
        "patch jobs/50-run-0003-0-cluster-patch.json", "get cluster",
        *run[12:],
    ]
    assert "Job/pg-run-0003-1 complete" in proc.stdout and proc.stdout.rstrip().endswith(
        "done: every Job of jobs/ complete; their results are in their logs")


def test_a_failed_job_stops_the_script_naming_it(rendered: Path, tmp_path: Path) -> None:
    proc, calls = run_script(rendered, tmp_path, KUBECTL=str(tmp_path / "bin" / "kubectl"), PATH="/usr/bin:/bin",
                             STUB_FAIL="pg-run-0001-1")
    assert proc.returncode == 1
    assert proc.stderr.strip().endswith(
        "run-jobs: Job/pg-run-0001-1 failed; see kubectl -n bench logs job/pg-run-0001-1")
    assert calls[-2:] == ["apply jobs/50-run-0001-1-job.yaml", "get job pg-run-0001-1"]  # nothing after it
    assert not any("0002" in c for c in calls)


def test_a_job_past_its_deadline_stops_the_script(rendered: Path, tmp_path: Path) -> None:
    proc, calls = run_script(rendered, tmp_path, STUB_RUNNING="pg-pgbench-init", JOB_TIMEOUT_S="0")
    assert proc.returncode == 1
    assert "run-jobs: Job/pg-pgbench-init not complete after 0 s; see kubectl -n bench describe job pg-pgbench-init" \
        in proc.stderr
    assert calls[-1] == "get job pg-pgbench-init" and not any("50-run" in c for c in calls)


def test_a_cpu_step_not_rolled_out_stops_the_script_saying_what_it_waited_for(rendered: Path, tmp_path: Path) -> None:
    proc, calls = run_script(rendered, tmp_path, STUB_STALE="1", CLUSTER_TIMEOUT_S="0")
    assert proc.returncode == 1
    assert ("run-jobs: CPU step cpus=2 (with work_mem=4MB): Cluster/pg not 'Cluster in healthy state' with 2 ready "
            "instances after 0 s (last seen: Cluster in healthy state/2, instance pods not all at 2000m CPU); see "
            "kubectl -n bench describe cluster pg") in proc.stderr
    assert calls[-3:] == ["patch jobs/50-run-0002-0-cluster-patch.json", "get cluster", "get pods"]


# ------------------------------------------------------------------ one render per folder
def test_a_folder_of_other_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(PLAN)
    out = tmp_path / "m"
    out.mkdir()
    (out / "00-namespace.yaml").write_text("kind: Namespace\n")  # a render of an earlier pglab, say
    proc = pglab("k8s", "render", str(tmp_path / "plan.yaml"), "-o", str(out))
    assert proc.returncode == 2
    assert proc.stderr == (f"error: -o: {out} is not empty and holds no earlier pglab k8s render (no .pglab-render); "
                           "name a new or empty folder, so that no other files are applied with this render's.\n")
    assert sorted(p.name for p in out.iterdir()) == ["00-namespace.yaml"]


def test_a_render_replaces_the_earlier_one(rendered: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("cpus: [0.5, 2]", "cpus: [0.5]"))
    proc = pglab("k8s", "render", str(plan), "-o", str(rendered), check=True)
    assert f"{rendered}/jobs: 7 and 1 Cluster patch)" in proc.stdout
    assert sorted(p.name for p in (rendered / "jobs").glob("50-*")) == [
        "50-run-0000-1-job.yaml", "50-run-0001-0-cluster-patch.json", "50-run-0001-1-job.yaml",
        "50-witness-0000-1-job.yaml", "50-witness-0001-1-job.yaml"]  # no Job of the earlier render left
    assert "0002" not in (rendered / "run-jobs.sh").read_text()
    (rendered / "jobs" / "99-mine.yaml").write_text("kind: Job\n")  # would be applied with them: refused
    proc = pglab("k8s", "render", str(plan), "-o", str(rendered))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: -o: {rendered} holds files no pglab k8s render wrote (jobs/99-mine.yaml)")
    assert len(proc.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ every Kubernetes feature: rendered, or why not
# A plan that sets every field of target.kubernetes (node_exporter, exclusive with prometheus: in a variant below),
# every field of its placements and of the S3 store, a WAL volume measured by fio and a node-loss scenario.
EVERY = """
name: every
target:
  kubernetes:
    kubeconfig: /nonexistent/pglab-every.kubeconfig
    context: every-context
    namespace: bench-all
    cluster_name: all
    instances: 2
    image: registry.example/postgresql:16.4
    startup_probe_period: 2
    storage: {class: fast, size: 20Gi}
    wal_storage: {class: walclass, size: 4Gi}
    resources: {cpu: 1500m, memory: 3Gi}
    synchronous: {method: first, number: 1, data_durability: preferred}
    database: {node_selector: {role: db}, tolerations: [{key: db, operator: Equal, value: "yes", effect: NoSchedule}],
               anti_affinity: preferred, topology_key: topology.kubernetes.io/zone}
    clients: {node_selector: {role: client}, tolerations: [{key: load, operator: Exists}], anti_affinity: required,
              topology_key: kubernetes.io/hostname, image: registry.example/pgbench:16,
              fio_image: registry.example/fio:3, cpu: 2, memory: 1Gi}
    prometheus: {url: "http://prometheus.monitoring:9090"}
    exporter_queries: default
    node_fault: {stop: [every-stop-node, "{node}"], start: [every-start-node, "{node}"]}
    wal_archive: {s3: {endpoint: "http://s3.store:7070", destination: "s3://bench/all", credentials: store/keys,
                       compression: gzip, max_parallel: 4, jobs: 2, immediate_checkpoint: true}}
storage: {profiles: [randwrite-8k], runtime: 1s, size: 64MiB, paths: [data, wal]}
matrix:
  clients: [2]
  scenario: [{kind: node-loss, at: 2s, down: 5s}]
run: {duration: 10s}
"""


def render_every(tmp_path: Path, text: str = EVERY) -> tuple[dict[str, dict[str, Any]], str]:
    """``pglab k8s render`` of ``text``: every manifest by its path under the folder, and run-jobs.sh's text."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "plan.yaml").write_text(text)
    out = tmp_path / "m"
    pglab("k8s", "render", str(tmp_path / "plan.yaml"), "-o", str(out), check=True)
    docs = {str(f.relative_to(out)): yaml.safe_load(f.read_text()) for f in sorted(out.glob("*/*.yaml"))}
    return docs, (out / "run-jobs.sh").read_text()


def pod(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]


def test_every_field_of_target_kubernetes_is_rendered_or_left_to_pglab_run_by_name(tmp_path: Path) -> None:
    """Each field has its check here, so a field added to target.kubernetes fails this test until the render writes
    it (or says why it cannot: the connection's fields and the node fault are pglab run's, not a manifest's)."""
    from pglab.plan.load import parse_plan
    from pglab.plan.schema.kubernetes import K8sClients, KubernetesTarget, Placement, S3Store

    k8s = parse_plan(EVERY).target.kubernetes
    assert k8s is not None and k8s.wal_archive is not None and k8s.wal_archive.s3 is not None
    assert set(KubernetesTarget.model_fields) - k8s.model_fields_set == {"node_exporter"}  # the variant below
    assert k8s.database.model_fields_set == set(Placement.model_fields)
    assert k8s.clients.model_fields_set == set(K8sClients.model_fields)
    assert k8s.wal_archive.s3.model_fields_set == set(S3Store.model_fields)
    docs, script = render_every(tmp_path)
    text = yaml.safe_dump(docs) + script
    db = docs["cluster/10-cluster.yaml"]["spec"]
    run, fio = docs["jobs/50-run-0000-1-job.yaml"], docs["jobs/21-fio-wal-job.yaml"]
    checked = {
        # where pglab connects from: nothing of it in a manifest (a render needs no cluster)
        "kubeconfig": "pglab-every.kubeconfig" not in text,
        "context": "every-context" not in text,
        "namespace": {d["metadata"].get("namespace") for f, d in docs.items() if d["kind"] != "Namespace"}
        == {"bench-all"} and docs["cluster/00-namespace.yaml"]["metadata"]["name"] == "bench-all",
        "cluster_name": docs["cluster/10-cluster.yaml"]["metadata"]["name"] == "all",
        "instances": db["instances"] == 2 and "\nINSTANCES=2\n" in script,
        "image": db["imageName"] == "registry.example/postgresql:16.4",
        "storage": db["storage"] == {"size": "20Gi", "storageClass": "fast"}
        and docs["jobs/20-fio-data-pvc.yaml"]["spec"]["storageClassName"] == "fast",
        "wal_storage": db["walStorage"] == {"size": "4Gi", "storageClass": "walclass"}
        and docs["jobs/20-fio-wal-pvc.yaml"]["spec"]["storageClassName"] == "walclass",
        "resources": db["resources"] == {"requests": {"cpu": "1500m", "memory": "3Gi"},
                                         "limits": {"cpu": "1500m", "memory": "3Gi"}},
        "synchronous": db["postgresql"]["synchronous"] == {"method": "first", "number": 1,
                                                           "dataDurability": "preferred"},
        "database": db["affinity"]["nodeSelector"] == {"role": "db"}
        and db["affinity"]["tolerations"] == [{"key": "db", "operator": "Equal", "value": "yes",
                                               "effect": "NoSchedule"}]
        and db["affinity"]["topologyKey"] == "topology.kubernetes.io/zone"
        and db["affinity"]["podAntiAffinityType"] == "preferred"
        and pod(fio)["nodeSelector"] == {"role": "db"},  # fio measures the volume where the database runs
        "clients": pod(run)["nodeSelector"] == {"role": "client"}
        and pod(run)["tolerations"] == [{"key": "load", "operator": "Exists"}]
        and pod(run)["containers"][0]["image"] == "registry.example/pgbench:16"
        and pod(run)["containers"][0]["resources"]["limits"] == {"cpu": "2", "memory": "1Gi"}
        and [t["topologyKey"] for t in pod(run)["affinity"]["podAntiAffinity"]
             ["requiredDuringSchedulingIgnoredDuringExecution"]] == ["kubernetes.io/hostname"]
        and pod(fio)["containers"][0]["image"] == "registry.example/fio:3",
        # disk counters from Prometheus: no disk sampler of pglab's (a plan without it has one, below)
        "prometheus": not any(d["kind"] == "DaemonSet" for d in docs.values()),
        # a node fault is a command pglab run calls: the script runs that run without it, and says so
        "node_fault": "every-stop-node" not in text and "all-run-0000-1 runs here without the fault" in script,
        "wal_archive": db["plugins"] == [{"name": "barman-cloud.cloudnative-pg.io", "isWALArchiver": True,
                                          "parameters": {"barmanObjectName": "all-store"}}]
        and docs["cluster/06-objectstore.yaml"]["spec"]["configuration"] == {
            "destinationPath": "s3://bench/all", "endpointURL": "http://s3.store:7070",
            "s3Credentials": {"accessKeyId": {"name": "all-store-credentials", "key": "ACCESS_KEY_ID"},
                              "secretAccessKey": {"name": "all-store-credentials", "key": "ACCESS_SECRET_KEY"}},
            "wal": {"maxParallel": 4, "compression": "gzip"},
            "data": {"compression": "gzip", "jobs": 2, "immediateCheckpoint": True}}
        and docs["cluster/05-objectstore-credentials.yaml"]["metadata"]["annotations"]["pglab/copy-from"]
        == "store/keys",
    }
    variant, _ = render_every(tmp_path / "exporter", EVERY.replace(
        'prometheus: {url: "http://prometheus.monitoring:9090"}', "node_exporter: {namespace: monitoring}"))
    plain, _ = render_every(tmp_path / "plain", EVERY.replace(
        'prometheus: {url: "http://prometheus.monitoring:9090"}', ""))
    checked["node_exporter"] = not any(d["kind"] == "DaemonSet" for d in variant.values()) and [
        f for f, d in plain.items() if d["kind"] == "DaemonSet"] == ["cluster/15-disk-sampler-daemonset.yaml"]
    # the operator's default queries: the Cluster names no ConfigMap of pglab's (pglab's own set: below)
    pglab_set, _ = render_every(tmp_path / "queries", EVERY.replace("    exporter_queries: default\n", ""))
    checked["exporter_queries"] = db["monitoring"] == {"metricsQueriesTTL": "1s"} and not any(
        d["kind"] == "ConfigMap" and "monitoring" in f for f, d in docs.items()) and pglab_set[
        "cluster/10-cluster.yaml"]["spec"]["monitoring"]["customQueriesConfigMap"] == [
        {"name": "all-monitoring", "key": "queries"}] and "cluster/08-monitoring.yaml" in pglab_set
    # the startup probe's period where the plan sets it; where it does not, the operator's own probes, untouched
    default_probes, _ = render_every(tmp_path / "probes", EVERY.replace("    startup_probe_period: 2\n", ""))
    checked["startup_probe_period"] = db["probes"] == {"startup": {"periodSeconds": 2}} and "probes" not in \
        default_probes["cluster/10-cluster.yaml"]["spec"]
    assert set(checked) == set(KubernetesTarget.model_fields)
    assert [field for field, ok in checked.items() if not ok] == []


def test_an_empty_copy_of_the_object_stores_secret_stops_the_script_before_anything_is_applied(tmp_path: Path) -> None:
    """The render cannot read the Secret wal_archive.s3.credentials names (pglab run copies it): the copy it writes
    is empty, and an archiver with empty keys fails every segment. The script refuses it, naming the Secret."""
    render_every(tmp_path / "r")
    out = tmp_path / "r" / "m"
    proc, calls = run_script(out, tmp_path)
    assert proc.returncode == 1 and calls == []  # nothing applied
    assert proc.stderr.strip().endswith(
        "run-jobs: cluster/05-objectstore-credentials.yaml is an empty copy of Secret store/keys: fill its data with "
        "that Secret's (kubectl -n store get secret keys -o jsonpath='{.data}'), then run this again")
    secret = out / "cluster" / "05-objectstore-credentials.yaml"
    secret.write_text(secret.read_text().replace("ACCESS_KEY_ID: ''", "ACCESS_KEY_ID: a2V5")
                      .replace("ACCESS_SECRET_KEY: ''", "ACCESS_SECRET_KEY: c2VjcmV0"))
    proc, calls = run_script(out, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert calls[:2] == ["apply cluster", "get cluster"]


def test_the_dataset_job_waits_for_the_server_with_a_deadline_and_says_so() -> None:
    """The wait the dataset Job runs before pgbench -i, in a real shell with this machine's pg_isready: against a
    port nothing listens on it says why once and gives up at its deadline (pgbench -i then fails with its own
    message); where the image has no pg_isready it does not wait."""
    from pglab.targets.kubernetes.scripts import wait_for_server
    from pglab.targets.local.ports import free_port

    env = {"PATH": "/usr/bin:/bin", "PGHOST": "127.0.0.1", "PGPORT": str(free_port()), "PGCONNECT_TIMEOUT": "2"}
    script = "set -eu\n" + wait_for_server(2) + "echo after $w\n"
    proc = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"pglab: waiting up to 2 s for 127.0.0.1:{env['PGPORT']} to accept "
                                        "connections", "after 2"], proc.stdout
    no_tool = subprocess.run(["/bin/sh", "-c", script], env={**env, "PATH": "/nonexistent"}, capture_output=True,
                             text=True, timeout=60, check=False)
    assert no_tool.stdout.splitlines() == ["after 0"], no_tool
