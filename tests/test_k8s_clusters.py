"""Many Clusters from one Kubernetes plan, without a cluster: the storage axis (``matrix.storage``: a Cluster per
value) and tenants (a Cluster per tenant) as plans, points and manifests; and the plans refused, in one sentence.

The real thing runs in tests/test_kube_lab_clusters.py, on the lab."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import pglab
from k8s_support import TENANTS_TARGET
from pglab.engine.schedule import blocks
from pglab.plan.expand import expand
from pglab.plan.load import parse_plan
from pglab.targets.kubernetes.render import cluster, render, storage_volumes

AXIS = """
name: s
target:
  kubernetes:
    namespace: bench
    cluster_name: pg
    instances: 1
    resources: {cpu: 1, memory: 1Gi}
    storage: {class: standard, size: 10Gi}
    wal_storage: {class: standard, size: 5Gi}
storage: {profiles: [randread-8k], runtime: 1s, size: 64MiB}
matrix:
  clients: [1, 4]
  jobs: [1]
  cpus: [1, 2]
  storage:
    - {name: premium-ssd-v2-zone-b, storage: {class: premium-ssd, size: 100Gi}, wal_storage: {class: ultra, size: 20Gi},
       cost: {monthly: 900}}
    - {name: standard}
run: {duration: 4s}
"""


def test_storage_values_vary_slowest_and_each_is_a_block_of_its_own() -> None:
    plan = parse_plan(AXIS)
    points = expand(plan, cores=1)
    assert [(p.axes["storage"], p.cpus, p.clients) for p in points] == [
        (s, c, n) for s in ("premium-ssd-v2-zone-b", "standard") for c in (1.0, 2.0) for n in (1, 4)]
    # interleaving never mixes two Clusters: each value's points form blocks of their own, in the plan's order
    assert [[p.axes["storage"] for p in b] for b in blocks(points)] == [
        ["premium-ssd-v2-zone-b"] * 2, ["premium-ssd-v2-zone-b"] * 2, ["standard"] * 2, ["standard"] * 2]
    assert "storage=premium-ssd-v2-zone-b" in points[0].label()
    assert len({p.key for p in points}) == len(points)


def test_each_value_gets_its_own_volumes_and_the_rest_of_the_cluster_is_the_plans() -> None:
    plan = parse_plan(AXIS)
    first, last = expand(plan, cores=1)[0], expand(plan, cores=1)[-1]
    premium, standard = cluster(plan, first)["spec"], cluster(plan, last)["spec"]
    assert premium["storage"] == {"size": "100Gi", "storageClass": "premium-ssd"}
    assert premium["walStorage"] == {"size": "20Gi", "storageClass": "ultra"}
    # a value without volumes of its own has the target's
    assert standard["storage"] == {"size": "10Gi", "storageClass": "standard"}
    assert standard["walStorage"] == {"size": "5Gi", "storageClass": "standard"}
    assert premium["resources"]["limits"]["cpu"] == "1" and standard["resources"]["limits"]["cpu"] == "2"
    assert storage_volumes(plan, first.storage) == {"data": "premium-ssd", "wal": "ultra"}

    manifests = render(plan, Path())
    # the Cluster made first is the first value's; the storage phase measures every value's volumes
    (made,) = [m for m in manifests if m.kind == "Cluster"]
    assert made.body["spec"]["storage"]["storageClass"] == "premium-ssd"
    pvcs = {m.name: m.body["spec"].get("storageClassName") for m in manifests if m.kind == "PersistentVolumeClaim"}
    assert pvcs == {"pg-fio-premium-ssd-v2-zone-b-data": "premium-ssd", "pg-fio-premium-ssd-v2-zone-b-wal": "ultra",
                    "pg-fio-standard-data": "standard", "pg-fio-standard-wal": "standard"}
    fio_jobs = [m for m in manifests if m.kind == "Job" and m.body["metadata"]["labels"]["pglab/component"] == "fio"]
    assert {(m.body["metadata"]["annotations"]["pglab/storage"], m.body["metadata"]["annotations"]["pglab/volume"])
            for m in fio_jobs} == {(s, r) for s in ("premium-ssd-v2-zone-b", "standard") for r in ("data", "wal")}
    # each fio pod ships the mount its volume had, as the node's kernel gives it
    script = fio_jobs[0].body["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "/proc/self/mountinfo" in script and "volume-mount.txt" in script


def plan_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("replace", "message"), [
    (("  kubernetes:\n    namespace: bench\n    cluster_name: pg\n    instances: 1\n"
      "    resources: {cpu: 1, memory: 1Gi}\n    storage: {class: standard, size: 10Gi}\n"
      "    wal_storage: {class: standard, size: 5Gi}\n", "  local: {}\n"),
     "matrix.storage: the storage axis builds a CloudNativePG Cluster per value and runs on a Kubernetes target "
     "only"),
    (("{name: standard}", "{name: premium-ssd-v2-zone-b}"), "matrix.storage: storage values need distinct names"),
    (("{name: standard}", "{name: Standard_1}"), "matrix.storage[1].name: must be a DNS label"),
    (("{name: standard}", "{name: s, storage: {klass: x}}"), "matrix.storage[1].storage.klass: unknown field"),
    (("cluster_name: pg", "cluster_name: a-rather-long-cluster-name-for-a-bench-1"),
     "matrix.storage[0].name: 'premium-ssd-v2-zone-b' with cluster_name 'a-rather-long-cluster-name-for-a-bench-1' "
     "makes names longer than Kubernetes allows (63); shorten one of them"),
    (("{name: standard}", "{name: standard, cost: {monthly: 0}}"), "matrix.storage[1].cost.monthly: must be greater "
     "than 0"),
])
def test_a_storage_axis_that_cannot_run_is_refused_in_one_sentence(tmp_path: Path, replace: tuple[str, str],
                                                                   message: str) -> None:
    assert replace[0] in AXIS
    proc = pglab("plan", "validate", str(plan_file(tmp_path, AXIS.replace(*replace))))
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_render_refuses_a_storage_axis_and_writes_nothing(tmp_path: Path) -> None:
    proc = pglab("k8s", "render", str(plan_file(tmp_path, AXIS)), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: matrix.storage: a rendered folder holds one Cluster, and this plan "
                                  "needs one per value"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("lines", "message"), [
    ("run: {duration: 5s}\ncapacity: {percentile: 99, target: 200ms}\n",
     "error: capacity: a search picks each rate from the runs before it, which no Job written ahead can; run it "
     "with 'pglab run', or render fixed rates (matrix.rate) instead."),
    ("run: {duration: 5s, repeats: {min: 2, max: 4, target_ci: 5}}\n",
     "error: run.repeats: adaptive repeats decide after each round whether to run another, which no Job written "
     "ahead can; render a fixed number (repeats: N) or run it with 'pglab run'."),
])
def test_render_refuses_what_decides_its_runs_as_it_goes(tmp_path: Path, lines: str, message: str) -> None:
    """A capacity search and adaptive repeats choose their next run from the last ones: a render wrote only the
    first round's Jobs before, without a word."""
    plan = plan_file(tmp_path, "name: kc\ntarget:\n  kubernetes: {namespace: bench, cluster_name: pg, instances: 1, "
                               "storage: {size: 1Gi}, resources: {cpu: 1, memory: 1Gi}}\nmatrix: {clients: [2]}\n"
                     + lines)
    proc = pglab("k8s", "render", str(plan), "-o", str(tmp_path / "out"))
    assert (proc.returncode, proc.stderr.strip()) == (2, message)
    assert not (tmp_path / "out").exists()


WAL_PLAN = ("name: w\ntarget:\n  kubernetes: {namespace: bench, cluster_name: pg, instances: 1, storage: {size: 1Gi}, "
            "wal_storage: {size: 1Gi}, resources: {cpu: 1, memory: 1Gi}}\nmatrix: {clients: [2]}\n"
            "run: {duration: 5s}\n")


@pytest.mark.parametrize(("lines", "refusal"), [
    ("postgres: {parameters: {max_wal_size: 1GB}}\n",
     "postgres.parameters.max_wal_size: max_wal_size 1GB is not below the WAL volume (target.kubernetes.wal_storage"
     ".size: 1Gi), which CloudNativePG refuses; lower it or make the volume larger"),
    ("postgres: {parameters: {max_wal_size: 1024}}\n", "max_wal_size 1024 is not below"),  # PostgreSQL's MB
    ("postgres: {parameters: {min_wal_size: 2GB, max_wal_size: 512MB}}\n", "min_wal_size 2GB is not below"),
    ("postgres: {parameters: {max_wal_size: 512MB}}\n", None),
    ("postgres: {parameters: {max_wal_size: 1000}}\n", None),  # 1000 MB < 1 GiB
    ("", None),  # unset: CloudNativePG checks only what is set (the default 1GB equals this volume)
])
def test_a_wal_size_cloudnativepg_would_refuse_is_refused_first(tmp_path: Path, lines: str,
                                                                 refusal: str | None) -> None:
    """CloudNativePG's webhook refuses (422, when pglab creates the Cluster, after the namespace and more) a set
    min_wal_size or max_wal_size that is not below the WAL volume: found on the lab by a study example."""
    proc = pglab("plan", "validate", str(plan_file(tmp_path, WAL_PLAN + lines)))
    if refusal is None:
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode == 2 and refusal in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_wal_size_axis_is_checked_against_every_wal_volume(tmp_path: Path) -> None:
    axis = WAL_PLAN.replace("matrix: {clients: [2]}",
                            "matrix: {clients: [2], parameters: {max_wal_size: [256MB, 4GB]}}")
    proc = pglab("plan", "validate", str(plan_file(tmp_path, axis.replace("wal_storage: {size: 1Gi}",
                                                                          "wal_storage: {size: 8Gi}"))))
    assert proc.returncode == 0, proc.stderr
    proc = pglab("plan", "validate", str(plan_file(tmp_path, axis)))
    assert proc.returncode == 2 and proc.stderr.startswith("matrix.parameters.max_wal_size: max_wal_size 4GB is not "
                                                           "below the WAL volume"), proc.stderr


def test_validate_counts_the_storage_values_as_points(tmp_path: Path) -> None:
    proc = pglab("plan", "validate", str(plan_file(tmp_path, AXIS)))
    assert proc.returncode == 0, proc.stderr
    assert "8 points" in proc.stdout, proc.stdout


# ------------------------------------------------------------------ tenants: a Cluster per tenant
TENANTS = TENANTS_TARGET + """tenants:
  instances: 2
  arrangements:
    - name: qos
      tiers:
        - {name: gold, tenants: 1, clients: 4, resources: {cpus: 2, memory: 2GiB},
           storage: {class: premium, size: 50Gi}, namespace: bench-gold}
        - {name: bronze, tenants: 2, clients: 1, resources: {cpus: 0.5}}
run: {duration: 10s}
"""


def test_each_tenant_is_a_cluster_with_its_tiers_resources_storage_and_namespace() -> None:
    from pglab.targets.kubernetes.tenants import START_WAIT, tenant_run, tenants_of

    plan = parse_plan(TENANTS)
    assert plan.tenants is not None
    (point,) = expand(plan)
    tenants = tenants_of(plan, plan.tenants.arrangements[0])
    assert [(t.name, t.tier.name, t.cluster, t.namespace) for t in tenants] == [
        ("t01", "gold", "mt-t01", "bench-gold"), ("t02", "bronze", "mt-t02", "bench"),
        ("t03", "bronze", "mt-t03", "bench")]
    gold, bronze = (cluster(t.plan) for t in tenants[:2])
    assert gold["metadata"] == {**gold["metadata"], "name": "mt-t01", "namespace": "bench-gold"}
    assert gold["spec"]["instances"] == 2 and "synchronous" in gold["spec"]["postgresql"]
    assert gold["spec"]["resources"]["limits"] == gold["spec"]["resources"]["requests"] == {"cpu": "2",
                                                                                           "memory": "2048Mi"}
    assert gold["spec"]["storage"] == {"size": "50Gi", "storageClass": "premium"}
    # what a tier leaves out is the target's
    assert bronze["spec"]["resources"]["limits"] == {"cpu": "500m", "memory": "1Gi"}
    assert bronze["spec"]["storage"] == {"size": "10Gi", "storageClass": "standard"}

    # every tenant's run Job reaches its own Cluster, with its tier's load, and waits for the common start after
    # its dataset reset, just before pgbench
    for t in tenants:
        job = tenant_run(t, point, 1, 1_800_000_000).body
        assert job["metadata"]["namespace"] == t.namespace and job["metadata"]["name"] == f"{t.cluster}-run-0000-1"
        pod = job["spec"]["template"]["spec"]
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["PGHOST"]["value"] == f"{t.cluster}-rw"
        assert env["PGUSER"]["valueFrom"]["secretKeyRef"]["name"] == f"{t.cluster}-app"
        script = pod["containers"][0]["command"][-1]
        assert f"pgbench -n -c {t.tier.clients} -j 1 " in script
        assert script.index("TRUNCATE pgbench_history") < script.index(START_WAIT) < script.index("pgbench -n")
        assert "sleep $((1800000000 - now))" in script


@pytest.mark.parametrize(("replace", "message"), [
    (("    resources: {cpu: 1, memory: 1Gi}\n", "    resources: {cpu: 1, memory: 1Gi}\n    instances: 3\n"),
     "target.kubernetes.instances: set tenants.instances instead"),
    (("run: {duration: 10s}", "run: {duration: 10s}\nmatrix: {clients: [1]}"), "matrix: each tier gives"),
    (("  instances: 2\n", "  instances: 2\n  parallel_builds: 4\n"), "tenants.parallel_builds: a Kubernetes cluster "),
    (("name: bronze", "name: Bronze"), "tenants.arrangements[0].tiers[1].name: on Kubernetes a tier's name labels"),
    (("resources: {cpus: 0.5}", "resources: {cpus: 0.5, write_iops: 100}"),
     "tenants.arrangements[0].tiers[1].resources: IO limits are not available on Kubernetes"),
    (("  instances: 2\n", "  instances: 1\n"), None),
])
def test_tenants_on_kubernetes_that_cannot_run_are_refused_in_one_sentence(
        tmp_path: Path, replace: tuple[str, str], message: str | None) -> None:
    assert replace[0] in TENANTS
    proc = pglab("plan", "validate", str(plan_file(tmp_path, TENANTS.replace(*replace))))
    if message is None:  # one instance per tenant: asynchronous, accepted
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_tier_storage_and_namespace_are_refused_on_a_local_lab(tmp_path: Path) -> None:
    text = ("name: l\ntarget: {local: {}}\ntenants:\n  arrangements:\n    - name: a\n      tiers:\n"
            "        - {name: gold, namespace: x}\n")
    proc = pglab("plan", "validate", str(plan_file(tmp_path, text)))
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: tenants.arrangements[0].tiers[0].namespace: is for a Kubernetes target; on "
                                   "a local lab remove it") or "is for a Kubernetes target" in proc.stderr, proc.stderr


def test_cost_per_tps_is_per_storage_value(tmp_path: Path) -> None:
    """A results folder as a storage-axis sweep leaves it: the cost table has one row per value, its price over the
    mean TPS of that value's best point (computed here from the stored runs' TPS); a value without a price of its
    own takes the plan's."""
    from pglab.analysis.cost import cost_table
    from pglab.report.tables import point_table
    from pglab.store import Store

    text = AXIS.replace("run: {duration: 4s}", "run: {duration: 4s}\ncost: {monthly: 500, currency: EUR}")
    store = Store.open(tmp_path / "results")
    sweep = store.begin_sweep("s", text, "h", "0")
    tps = {("premium-ssd-v2-zone-b", 1): [100.0, 110.0], ("premium-ssd-v2-zone-b", 4): [300.0, 320.0],
           ("standard", 1): [50.0, 54.0], ("standard", 4): [90.0, 94.0]}
    keyed: list[tuple[int, str, dict[str, Any]]] = [
        (i, f"k{i}", {"workload": "tpcb-like", "synchronous_commit": "on", "clients": c, "jobs": 1, "storage": s})
        for i, (s, c) in enumerate(tps)]
    ids = store.add_points(sweep, keyed)
    for i, key, axes in keyed:
        for rep, value in enumerate(tps[axes["storage"], axes["clients"]], 1):
            run_id, _ = store.start_run(sweep, ids[key], i, rep)
            store.finish_run(run_id, "ok", window=(1e9 + 100 * i + 10 * rep, 1e9 + 100 * i + 10 * rep + 5),
                             metrics={"tps": value, "write_iops": 1000.0})
    store.end_sweep(sweep, "done")
    columns, rows = cost_table(store, sweep)
    assert columns[0] == "storage"
    by = {r["storage"]: r for r in rows}
    assert by["premium-ssd-v2-zone-b"]["peak_tps"] == pytest.approx(310.0)
    assert by["premium-ssd-v2-zone-b"]["per_tps"] == pytest.approx(900 / 310.0)
    assert by["premium-ssd-v2-zone-b"]["currency"] == "USD"  # its own cost block, USD by default
    assert by["standard"]["per_tps"] == pytest.approx(500 / 92.0) and by["standard"]["currency"] == "EUR"
    assert by["standard"]["at_clients"] == 4
    assert [r["storage"] for r in point_table(store, sweep)[1]] == [s for s, _ in tps]
    store.close()


def test_render_refuses_a_tenants_plan_and_writes_nothing(tmp_path: Path) -> None:
    proc = pglab("k8s", "render", str(plan_file(tmp_path, TENANTS)), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: tenants: a rendered folder holds one Cluster, and this plan needs one per "
                                  "tenant"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_storage_value_without_any_price_shows_its_tps_alone(tmp_path: Path) -> None:
    """A storage axis where one value has a price and the other none (and the plan none): the cost table has the
    priced value's price per TPS, the other's TPS alone, in the terminal, CSV and the HTML report alike."""
    from pglab.store import Store

    results = tmp_path / "results"
    store = Store.open(results)
    sweep = store.begin_sweep("s", AXIS, "h", "0")
    tps = {"premium-ssd-v2-zone-b": 300.0, "standard": 90.0}
    keyed: list[tuple[int, str, dict[str, Any]]] = [
        (i, f"k{i}", {"workload": "tpcb-like", "synchronous_commit": "on", "clients": 4, "jobs": 1, "storage": s})
        for i, s in enumerate(tps)]
    ids = store.add_points(sweep, keyed)
    for i, key, axes in keyed:
        run_id, _ = store.start_run(sweep, ids[key], i, 1)
        store.finish_run(run_id, "ok", window=(1e9 + 100 * i, 1e9 + 100 * i + 5),
                         metrics={"tps": tps[axes["storage"]], "write_iops": 1000.0})
    store.end_sweep(sweep, "done")
    store.close()
    html = tmp_path / "report.html"
    proc = pglab("report", str(results), "--table", "cost", "--format", "json", "--html", str(html))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["storage"]: r for r in json.loads(proc.stdout)}
    assert rows["premium-ssd-v2-zone-b"]["per_tps"] == pytest.approx(900 / 300.0)
    assert rows["standard"]["peak_tps"] == pytest.approx(90.0)
    assert rows["standard"]["per_tps"] is None and rows["standard"]["monthly"] is None
    text = html.read_text()
    assert "per TPS·month" in text and "3.00" in text
    assert "standard: " not in text.split("<table", 1)[0]  # no price line in the summary for the unpriced value
