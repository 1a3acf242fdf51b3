"""Kubernetes target: the plan's kubernetes block, the rendered manifests, and their strict decode by cnpg-check.

No cluster runs here. The manifests are decoded by tools/cnpg-check (CloudNativePG's published Go types, strict:
unknown fields, duplicate fields and wrong types fail) with the operator's admission rules re-checked; the checker
is the real binary setup.sh builds into .tools/bin.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO, pglab
from k8s_support import check
from pglab.plan.expand import expand
from pglab.plan.load import parse_plan
from pglab.targets.kubernetes.render import cluster, fio_manifests, pgbench_run, render
from pglab.workloads.fio import jobs_for

PLAN = """
name: k
target:
  kubernetes:
    cluster_name: bench
    instances: 3
    storage: {class: fast-ssd, size: 100Gi}
    wal_storage: {class: wal-ssd, size: 20Gi}
    resources: {cpu: 2, memory: 8Gi}
    synchronous: {method: first, number: 2, data_durability: preferred}
    database: {node_selector: {pglab.io/role: db}, tolerations: [{key: dedicated, value: db, effect: NoSchedule}]}
    clients: {node_selector: {pglab.io/role: client}, cpu: 1500m, memory: 2Gi}
postgres: {parameters: {shared_buffers: 2GB, max_connections: 200, jit: false}}
storage: {profiles: [randread-8k, wal-fdatasync-8k], runtime: 10s, size: 1GiB}
matrix:
  synchronous_commit: [local, "on"]
  clients: [8]
  workload: [{name: mix, scripts: [{builtin: tpcb-like, weight: 9}, {file: sql/report.sql}]}]
run: {duration: 30s, warmup: 5s, repeats: 2}
"""


def plan_dir(tmp_path: Path, text: str = PLAN) -> Path:
    (tmp_path / "sql").mkdir(exist_ok=True)
    (tmp_path / "sql" / "report.sql").write_text("SELECT count(*) FROM pgbench_accounts;\n")
    (tmp_path / "plan.yaml").write_text(text)
    return tmp_path / "plan.yaml"


def by_kind(manifests: list[Any], kind: str) -> list[dict[str, Any]]:
    return [m.body for m in manifests if m.kind == kind]


# ------------------------------------------------------------------ examples: render, then the strict decode
@pytest.mark.parametrize("example", ["kubernetes-cnpg"])
def test_examples_render_and_pass_the_strict_decode(example: str, tmp_path: Path, checker: Path) -> None:
    out = tmp_path / "out"
    proc = pglab("k8s", "render", str(REPO / "examples" / f"{example}.yaml"), "-o", str(out), check=True)
    files = sorted(out.glob("*/*.yaml"))
    assert f"{out}: {len(files)} manifests ({out}/cluster: 7, {out}/jobs: {len(files) - 7}) and {out}/run-jobs.sh" \
        in proc.stdout
    assert f"check them with .tools/bin/cnpg-check {out}/*/*.yaml" in proc.stdout
    kinds = {f.parent.name: {yaml.safe_load(g.read_text())["kind"] for g in files if g.parent == f.parent}
             for f in files}
    assert kinds == {"cluster": {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Cluster",
                                 "DaemonSet"}, "jobs": {"PersistentVolumeClaim", "Job"}}
    result = check(checker, *files)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"ok: {len(files)} manifests valid against github.com/cloudnative-pg/api v1.29.0" in result.stdout


def test_storage_classes_example_runs_the_published_pgbench_shape(tmp_path: Path, checker: Path) -> None:
    """Its storage axis makes a Cluster per class, which a rendered folder cannot hold (``pglab k8s render``
    refuses it, tests/test_k8s_clusters.py): its manifests, each class's Cluster among them, pass the strict decode."""
    plan = parse_plan((REPO / "examples" / "kubernetes-storage-classes.yaml").read_text())
    manifests = render(plan, REPO / "examples")
    points = expand(plan)
    clusters = [cluster(plan, p) for p in points]
    assert [c["spec"]["storage"]["storageClass"] for c in clusters] == ["standard", "premium"]
    assert [c["spec"]["walStorage"]["storageClass"] for c in clusters] == ["standard", "premium"]
    files = []
    for i, body in enumerate([m.body for m in manifests] + clusters):
        files.append(tmp_path / f"{i:03d}.yaml")
        files[-1].write_text(yaml.safe_dump(body))
    result = check(checker, *files)
    assert result.returncode == 0, result.stdout + result.stderr
    init = next(m for m in manifests if m.filename == "40-pgbench-init-job.yaml")
    assert "pgbench -i -s 1000 -q --init-steps=dtgvp" in yaml.safe_dump(init.body, width=1000)  # rows from the client
    runs = [m for m in manifests if m.filename.startswith("50-run-")]
    assert len(runs) == 6  # one point per class × 3 repeats
    assert "pgbench -n -c 64 -j 4 -M simple -P 1 " in yaml.safe_dump(runs[0].body, width=1000)


def test_cnpg_example_measures_the_volumes_then_keeps_clients_apart(tmp_path: Path) -> None:
    plan = parse_plan((REPO / "examples" / "kubernetes-cnpg.yaml").read_text(), base_dir=REPO / "examples")
    manifests = render(plan, REPO / "examples")
    files = [m.filename for m in manifests]
    assert files.index("10-cluster.yaml") < files.index("21-fio-data-job.yaml") < files.index(
        "40-pgbench-init-job.yaml")
    for job in by_kind(manifests, "Job"):
        pod = job["spec"]["template"]["spec"]
        if job["metadata"]["labels"]["pglab/component"] == "fio":
            assert pod["nodeSelector"] == {"pglab.io/role": "database"}  # measured where the database runs
            assert "affinity" not in pod
            continue
        assert pod["nodeSelector"] == {"pglab.io/role": "client"}
        term = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert term == {"labelSelector": {"matchLabels": {"cnpg.io/cluster": "s3"}},
                        "topologyKey": "kubernetes.io/hostname"}


# ------------------------------------------------------------------ what the manifests say
def test_cluster_manifest_carries_the_plan(tmp_path: Path) -> None:
    path = plan_dir(tmp_path)
    spec = cluster(parse_plan(path.read_text(), base_dir=tmp_path))["spec"]
    assert spec["instances"] == 3
    assert spec["storage"] == {"size": "100Gi", "storageClass": "fast-ssd"}
    assert spec["walStorage"] == {"size": "20Gi", "storageClass": "wal-ssd"}
    assert spec["resources"]["requests"] == spec["resources"]["limits"] == {"cpu": "2", "memory": "8Gi"}
    assert spec["postgresql"]["synchronous"] == {"method": "first", "number": 2, "dataDurability": "preferred"}
    # CloudNativePG takes parameters as text only; booleans as PostgreSQL spells them
    assert spec["postgresql"]["parameters"] == {"shared_buffers": "2GB", "max_connections": "200", "jit": "off"}
    assert spec["affinity"]["podAntiAffinityType"] == "required"
    assert spec["affinity"]["nodeSelector"] == {"pglab.io/role": "db"}
    assert spec["affinity"]["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "db",
                                                "effect": "NoSchedule"}]
    # fresh query results at each 2 s exporter read; pglab's own queries, not the operator's default set
    assert spec["monitoring"] == {"metricsQueriesTTL": "1s", "disableDefaultQueries": True,
                                  "customQueriesConfigMap": [{"name": "bench-monitoring", "key": "queries"}]}


def test_the_exporter_queries_serve_every_metric_pglab_reads(tmp_path: Path) -> None:
    """pglab's monitoring ConfigMap replaces the operator's default set: each metric the exporter reader takes a
    figure from (the instance manager's own cnpg_collector_* aside) must be one its queries serve, under the name
    the default set gives it, and the ConfigMap must be made before the Cluster that names it."""
    from pglab.targets.kubernetes import exporter, monitoring

    plan = parse_plan(plan_dir(tmp_path).read_text(), base_dir=tmp_path)
    read = {*exporter._DATABASE.values(), *(m for ms in exporter._SERVER.values() for m in ms),
            *(m for m, _ in exporter._REPLICATION.values()), exporter._ARCHIVED, exporter._FAILED}
    assert {m for m in read if not m.startswith("cnpg_collector_")} <= monitoring.metric_names()
    manifests = render(plan, tmp_path)
    files = [m.filename for m in manifests]
    (queries,) = [m for m in manifests if m.kind == "ConfigMap" and m.name == "bench-monitoring"]
    assert files.index(queries.filename) < files.index("10-cluster.yaml")
    assert yaml.safe_load(queries.body["data"]["queries"]) == monitoring.QUERIES


def test_pgbench_jobs_read_the_app_secret_and_set_the_durability_level(tmp_path: Path) -> None:
    path = plan_dir(tmp_path)
    plan = parse_plan(path.read_text(), base_dir=tmp_path)
    points = expand(plan, cores=2)
    job = pgbench_run(plan, points[1], repeat=2).body
    assert job["metadata"]["name"] == "bench-run-0001-2"
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["PGHOST"]["value"] == "bench-rw"
    for var, key in (("PGUSER", "username"), ("PGPASSWORD", "password"), ("PGDATABASE", "dbname")):
        assert env[var]["valueFrom"]["secretKeyRef"] == {"name": "bench-app", "key": key}
    assert env["PGOPTIONS"]["value"] == "-c synchronous_commit=on"
    assert container["resources"]["requests"] == container["resources"]["limits"] == {"cpu": "1500m",
                                                                                     "memory": "2Gi"}
    script = container["command"][2]
    assert "-T 35 " in script  # measured 30 s plus the 5 s warm-up
    assert "-b tpcb-like@9 -f /scripts/sql/report.sql@1" in script


def test_custom_scripts_travel_in_a_configmap(tmp_path: Path, checker: Path) -> None:
    path = plan_dir(tmp_path)
    out = tmp_path / "out"
    pglab("k8s", "render", str(path), "-o", str(out), check=True)
    cm = yaml.safe_load((out / "cluster" / "30-pgbench-scripts.yaml").read_text())  # there before any Job
    assert cm["data"] == {"sql_report.sql": "SELECT count(*) FROM pgbench_accounts;\n"}
    run = yaml.safe_load((out / "jobs" / "50-run-0000-1-job.yaml").read_text())["spec"]["template"]["spec"]
    assert {"name": "scripts", "configMap": {"name": "bench-scripts", "items": [
        {"key": "sql_report.sql", "path": "sql/report.sql"}]}} in run["volumes"]
    result = check(checker, *sorted(out.glob("*/*.yaml")))
    assert result.returncode == 0, result.stdout


def test_fio_jobs_run_the_storage_profiles_on_each_volume(tmp_path: Path) -> None:
    path = plan_dir(tmp_path)
    plan = parse_plan(path.read_text(), base_dir=tmp_path)
    manifests = fio_manifests(plan)
    pvcs = by_kind(manifests, "PersistentVolumeClaim")
    assert [p["spec"]["storageClassName"] for p in pvcs] == ["fast-ssd", "wal-ssd"]
    assert pvcs[0]["spec"]["resources"]["requests"]["storage"] == "2Gi"  # 1 GiB file + margin, whole GiB
    script = by_kind(manifests, "Job")[0]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    for profile in ("randread-8k", "wal-fdatasync-8k"):
        for job in jobs_for(profile):
            line = next(x for x in script.splitlines() if f"--name={job.name} " in x)
            for key, value in job.options.items():
                assert f"--{key}={value}" in line
            assert "--runtime=10000ms" in line and "--log_avg_msec=1000" in line
    assert "--name=seqwrite" not in script


def test_rbac_names_every_verb_pglab_uses(tmp_path: Path) -> None:
    path = plan_dir(tmp_path)
    manifests = render(parse_plan(path.read_text(), base_dir=tmp_path), tmp_path)
    (role,) = by_kind(manifests, "Role")
    rules = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert {"create", "delete", "watch", "patch"} <= rules[("postgresql.cnpg.io", "clusters")]
    assert {"create", "delete", "watch"} <= rules[("batch", "jobs")]
    assert rules[("", "pods/log")] == {"get"}
    assert {"create", "delete"} <= rules[("", "pods")]  # the client pods; the failover scenario deletes the primary
    assert rules[("", "pods/exec")] == {"create", "get"}  # each run's script in a client pod
    assert not any(r == "secrets" for _, r in rules)
    (binding,) = by_kind(manifests, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


# ------------------------------------------------------------------ the checker refuses what the operator would
def _cluster_file(tmp_path: Path, change: Any) -> Path:
    path = plan_dir(tmp_path)
    body = cluster(parse_plan(path.read_text(), base_dir=tmp_path))
    change(body)
    out = tmp_path / "cluster.yaml"
    out.write_text(yaml.safe_dump(body, sort_keys=False))
    return out


def _set(path: str, value: Any) -> Any:
    def change(body: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = body
        for p in parents:
            node = node[p]
        node[last] = value

    return change


@pytest.mark.parametrize(("change", "message"), [
    (_set("spec.bogus", 1), 'Cluster/bench: unknown field "spec.bogus"'),
    (_set("spec.Instances", 3), 'unknown field "spec.Instances"'),  # case-sensitive, as the API server
    (_set("spec.postgresql.parameters.max_connections", 200),
     "cannot unmarshal number into Go struct field PostgresConfiguration.spec.postgresql.parameters of type string"),
    (_set("spec.instances", "3"),
     "cannot unmarshal string into Go struct field ClusterSpec.spec.instances of type int"),
    (_set("spec.postgresql.synchronous.number", 3),
     "spec.postgresql.synchronous.number: 3 must be lower than the number of instances"),
    (_set("spec.maxSyncReplicas", 1), "spec.postgresql.synchronous: cannot be mixed with the deprecated"),
    (_set("spec.resources.limits.cpu", "3"), "requests.cpu (2) must equal limits.cpu (3) for Guaranteed QoS"),
    (_set("spec.resources.requests", {"cpu": "2"}),
     "requests and limits of memory are both needed for Guaranteed QoS"),
    (_set("spec.storage.size", "lots"), "spec.storage.size: \"lots\" is not a quantity"),
    (_set("spec.postgresql.synchronous.method", "all"), "synchronous.method: \"all\" is not any or first"),
])
def test_checker_refuses_what_the_operator_would(tmp_path: Path, checker: Path, change: Any, message: str) -> None:
    path = _cluster_file(tmp_path, change)
    result = check(checker, path)
    assert result.returncode == 1
    assert message in result.stdout, result.stdout


def test_checker_passes_the_unchanged_cluster(tmp_path: Path, checker: Path) -> None:
    result = check(checker, _cluster_file(tmp_path, lambda body: None))
    assert result.returncode == 0, result.stdout


def test_checker_refuses_duplicate_keys_and_unknown_kinds(tmp_path: Path, checker: Path) -> None:
    dup = tmp_path / "dup.yaml"
    dup.write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: a, name: b}\n")
    assert "duplicate" in check(checker, dup).stdout
    other = tmp_path / "other.yaml"
    other.write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: apps/v1\n"
                     "kind: Deployment\nmetadata: {name: d}\n")
    result = check(checker, other)
    assert result.returncode == 1
    assert 'other.yaml#2 Deployment/d: apiVersion "apps/v1" kind "Deployment" is not a type' in result.stdout


# ------------------------------------------------------------------ the plan refuses what does not fit
@pytest.mark.parametrize(("replace", "message"), [
    (("number: 2, data", "number: 3, data"),
     "target.kubernetes.synchronous.number: synchronous.number (3) must be lower than instances (3)"),
    (("clients: [8]", "clients: [8]\n  parameters: {ssl: [true, false]}"),
     "matrix.parameters.ssl: 'ssl' is managed by CloudNativePG and cannot be set on a Kubernetes target"),
    (("jit: false", "jit: false, shared_preload_libraries: pg_stat_statements"),
     "postgres.parameters.shared_preload_libraries: 'shared_preload_libraries' is managed by CloudNativePG"),
    (("cpu: 2, memory: 8Gi", "cpu: 0, memory: 8Gi"), "target.kubernetes.resources.cpu: must be a number of cores"),
    (("memory: 8Gi}", "memory: 8 GB}"), "target.kubernetes.resources.memory: must be a Kubernetes quantity"),
    (("resources: {cpu: 2, memory: 8Gi}", "resources: {cpu: 2}"), "target.kubernetes.resources.memory: "),
    (("cluster_name: bench", "cluster_name: Bench_1"), "target.kubernetes.cluster_name: must be a DNS label"),
    (("storage: {class: fast-ssd", "storage: {klass: fast-ssd"), "target.kubernetes.storage.klass: unknown field"),
    (("  kubernetes:\n", "  local: {}\n  kubernetes:\n"), "target: give exactly one target"),
])
def test_plan_refuses_with_the_field(tmp_path: Path, replace: tuple[str, str], message: str) -> None:
    assert replace[0] in PLAN
    path = plan_dir(tmp_path, PLAN.replace(*replace))
    proc = pglab("plan", "validate", str(path))
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_plan_validates_and_instances_one_means_asynchronous(tmp_path: Path) -> None:
    proc = pglab("plan", "validate", str(plan_dir(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    assert "2 points × 2 repeats = 4 runs" in proc.stdout
    lone = parse_plan("name: x\ntarget: {kubernetes: {instances: 1, resources: {cpu: 1, memory: 1Gi}}}\n")
    assert lone.target.kubernetes is not None and lone.target.kubernetes.synchronous is None
    assert "synchronous" not in cluster(lone)["spec"]["postgresql"]


def test_run_on_a_kubernetes_plan_without_a_kubeconfig_exits_2(tmp_path: Path) -> None:
    path = plan_dir(tmp_path)
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "no-such-kubeconfig")}
    proc = pglab("run", str(path), "--results", str(tmp_path / "results"), env=env)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: target.kubernetes.kubeconfig: cannot use $KUBECONFIG or ~/.kube/config")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "results").exists()


def test_render_refuses_a_plan_without_kubernetes(tmp_path: Path) -> None:
    path = tmp_path / "local.yaml"
    path.write_text("name: l\ntarget: {local: {}}\n")
    proc = pglab("k8s", "render", str(path), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "has no 'target: kubernetes'" in proc.stderr
    assert not (tmp_path / "out").exists()
