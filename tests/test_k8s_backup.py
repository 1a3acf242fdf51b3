"""WAL archiving and the backup scenario on Kubernetes, against the fake API server: what a plan's wal_archive
renders (the ObjectStore, its credentials' copy, the Cluster's plugin entry, the Role), the plan's refusals, and a
backup run: the Backup (method plugin) asked for at the fault time, followed until the operator reports it completed,
the object store listed by a Job, the archiver's figures from the exporter. The real plugin and object store run in
tests/test_kube_lab_backup.py."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from conftest import pglab
from k8s_fake import FakeAPI, cnpg_crd, exporter_text, results_log
from k8s_support import PGBENCH, assert_all_deleted, k8s_plan, run
from pglab.plan.load import parse_plan
from pglab.store.sqlite import Store
from pglab.targets.kubernetes import exporter
from pglab.targets.kubernetes.preflight import BARMAN_CRD, check_wal_archive
from pglab.targets.kubernetes.render import BARMAN_PLUGIN, COPY_FROM, START_MARK, STORE_MARK, render
from pglab.targets.kubernetes.scenario import lsn

ARCHIVE = ("wal_archive: {s3: {endpoint: 'http://s3.objectstore.svc:7070', destination: 's3://pglab/k',"
           " credentials: objectstore/s3-credentials, compression: gzip, jobs: 2}}",)
PLAN = k8s_plan("matrix: {clients: [2], jobs: [1], scenario: [{kind: backup, at: 1s, witness: false}]}",
                "run: {duration: 4s}", kubernetes=ARCHIVE)
RUN, STORE_JOB, BACKUP = "pg-run-0000-1", "pg-run-0000-1-store", "pg-run-0000-1-backup"
SOURCE = "/api/v1/namespaces/objectstore/secrets/s3-credentials"
BACKUPS = "/apis/postgresql.cnpg.io/v1/namespaces/bench/backups"
MIB = 2**20


def test_wal_archive_renders_the_object_store_its_credentials_and_the_plugin(tmp_path: Path) -> None:
    plan = parse_plan(PLAN, base_dir=tmp_path)
    by_kind = {m.kind: m.body for m in render(plan, tmp_path)}
    store = by_kind["ObjectStore"]
    assert store["metadata"]["name"] == "pg-store"
    config = store["spec"]["configuration"]
    assert config["destinationPath"] == "s3://pglab/k" and config["endpointURL"] == "http://s3.objectstore.svc:7070"
    assert config["s3Credentials"]["accessKeyId"] == {"name": "pg-store-credentials", "key": "ACCESS_KEY_ID"}
    assert config["wal"] == {"maxParallel": 1, "compression": "gzip"}
    assert config["data"] == {"compression": "gzip", "jobs": 2, "immediateCheckpoint": True}
    secret = by_kind["Secret"]
    assert secret["metadata"]["name"] == "pg-store-credentials"
    assert secret["metadata"]["annotations"][COPY_FROM] == "objectstore/s3-credentials"
    assert by_kind["Cluster"]["spec"]["plugins"] == [
        {"name": BARMAN_PLUGIN, "isWALArchiver": True, "parameters": {"barmanObjectName": "pg-store"}}]
    resources = {r for rule in by_kind["Role"]["rules"] for r in rule["resources"]}
    assert {"backups", "objectstores", "secrets"} <= resources
    # a plan that names its own ObjectStore gets the plugin entry and nothing created for the store
    own = parse_plan(k8s_plan("run: {duration: 4s}", kubernetes=("wal_archive: {object_store: mine}",)),
                     base_dir=tmp_path)
    kinds = {m.kind: m.body for m in render(own, tmp_path)}
    assert "ObjectStore" not in kinds and "Secret" not in kinds
    assert kinds["Cluster"]["spec"]["plugins"][0]["parameters"] == {"barmanObjectName": "mine"}
    # and a plan without archiving has neither
    plain = parse_plan(k8s_plan("run: {duration: 4s}"), base_dir=tmp_path)
    assert "plugins" not in next(m for m in render(plain, tmp_path) if m.kind == "Cluster").body["spec"]


@pytest.mark.parametrize(("lines", "message"), [
    (("wal_archive: {}",), "target.kubernetes.wal_archive.object_store: give object_store (an ObjectStore in the "
     "namespace) or s3 (pglab creates one), exactly one"),
    (("wal_archive: {s3: {destination: 'pglab/k', credentials: objectstore/s3-credentials}}",),
     "target.kubernetes.wal_archive.s3.destination"),
    (("wal_archive: {s3: {destination: 's3://pglab/k', credentials: s3-credentials}}",),
     "target.kubernetes.wal_archive.s3.credentials"),
])
def test_a_wrong_wal_archive_is_refused_naming_the_field(tmp_path: Path, lines: tuple[str, ...],
                                                         message: str) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(k8s_plan("run: {duration: 4s}", kubernetes=lines))
    proc = pglab("plan", "validate", str(path))
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_backup_with_max_rate_is_refused_on_kubernetes(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN.replace("{kind: backup, at: 1s,", "{kind: backup, at: 1s, max_rate: 32M,"))
    proc = pglab("run", str(path), "--results", str(tmp_path / "r"))
    assert proc.returncode == 2 and not (tmp_path / "r").exists(), proc.stdout
    assert "matrix.scenario[0].max_rate: max_rate is pg_basebackup's" in proc.stderr, proc.stderr


def archiver_text(pod: str, t: float, t0: float) -> str:
    """The fake's exporter with the archiver's figures of a run: one segment archived every 0.5 s from t0, 8 MB of
    WAL written per second, one segment ready when the load runs, pg_wal growing."""
    n = max(0.0, t - t0)
    extra = (f"cnpg_pg_stat_archiver_archived_count {10 + int(n / 0.5)}\n"
             "cnpg_pg_stat_archiver_failed_count 3\n"
             f'cnpg_collector_pg_wal{{value="size"}} {(32 + 16 * int(n)) * MIB}\n'
             f'cnpg_collector_pg_wal_archive_status{{value="ready"}} {1 if n < 3 else 0}\n')
    return exporter_text(pod, {"wal_bytes": 1e9 + 8 * MIB * n}) + extra


@pytest.fixture
def backup_fake(k8s_api: tuple[FakeAPI, client.ApiClient]) -> tuple[FakeAPI, client.ApiClient]:
    """The run Job prints its start and a second of transactions 0.2-4 s after it; the Backup completes on its
    fourth read; the object store's listing Job prints 3 objects, 21 MiB of backup and 5 WAL objects."""
    api, _ = k8s_api
    api.objects[SOURCE] = {"apiVersion": "v1", "kind": "Secret", "metadata": {
        "name": "s3-credentials", "namespace": "objectstore"}, "data": {
        "ACCESS_KEY_ID": base64.b64encode(b"pglab").decode(), "ACCESS_SECRET_KEY": base64.b64encode(b"s").decode()}}
    reads: dict[str, int] = {}

    def backup_read(key: str, obj: dict[str, object]) -> None:
        reads[key] = reads.get(key, 0) + 1
        if reads[key] >= 4:
            obj["status"] = {"phase": "completed", "backupId": "20261126T130000", "beginLSN": "0/3000028",
                             "endLSN": "0/5000138", "beginWal": "000000010000000000000003",
                             "endWal": "000000010000000000000005", "startedAt": "2026-11-26T13:00:00Z",
                             "stoppedAt": "2026-11-26T13:00:01Z"}
        else:
            obj["status"] = {"phase": "running"}

    api.store.on_read["Backup"] = backup_read

    def log(job: str) -> str:
        if job == STORE_JOB:
            return f"{STORE_MARK} 3 {21 * MIB} 5 {5 * 1024 * 1024}\n"
        if job != RUN:
            return results_log({"init.log": "done\n"}, text="done\n")
        t0 = api.job_created_at[RUN] + 0.1
        ends = [t0 + 0.2 + i * 0.01 for i in range(380)]
        txn = "".join(f"0 {i} 2000 0 {int(e)} {round((e - int(e)) * 1e6)}\n" for i, e in enumerate(ends))
        files = {"pgbench.out": (PGBENCH / "pgbench.out").read_text(), "pgbench.err": "", "pgbench.101": txn,
                 "reset.log": "TRUNCATE TABLE\n"}
        return results_log(files, text=f"{START_MARK} {t0:.6f}\n")

    api.default_log = log
    api.job_seconds = 4.5  # the run Job runs past the backup
    started: dict[str, float] = {}

    def exporter_of(pod: str, t: float) -> str:
        started.setdefault("t", t)
        return archiver_text(pod, t, started["t"])

    api.exporter = exporter_of

    def on_job(job: str) -> None:  # the listing Job needs the primary pod's sidecar image
        if job == STORE_JOB:
            return
        api.objects["/api/v1/namespaces/bench/pods/pg-1"] = {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pg-1", "namespace": "bench"},
            "spec": {"nodeName": "node-1", "initContainers": [
                {"name": "plugin-barman-cloud", "image": "example/plugin-barman-cloud-sidecar:0.15.0"}],
                "containers": [{"name": "postgres", "image": "pg"}]}}

    api.on_job_created = on_job
    return k8s_api


def test_a_backup_run_asks_the_plugin_follows_it_and_stores_its_figures(
        backup_fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = backup_fake
    result = run(api_client, tmp_path, PLAN.replace("instances: 2", "instances: 1"))
    assert (result.ok, result.failed) == (1, 0), result.failures
    # the credentials copied from the Secret the plan named, before the ObjectStore and the Cluster
    posted = {b["kind"]: b for b in api.posted}
    source = api.objects.pop(SOURCE)  # not pglab's: left as it was
    assert posted["Secret"]["data"] == source["data"] and posted["Secret"]["metadata"]["namespace"] == "bench"
    kinds = [b["kind"] for b in api.posted]
    assert kinds.index("Secret") < kinds.index("ObjectStore") < kinds.index("Cluster") < kinds.index("Backup")
    backup = posted["Backup"]
    assert backup["metadata"]["name"] == BACKUP
    assert backup["spec"] == {"cluster": {"name": "pg"}, "method": "plugin",
                              "pluginConfiguration": {"name": BARMAN_PLUGIN}}
    listing = next(b for b in api.posted if b["metadata"]["name"] == STORE_JOB)
    pod = listing["spec"]["template"]["spec"]
    assert pod["nodeName"] == "node-1"
    assert pod["containers"][0]["image"] == "example/plugin-barman-cloud-sidecar:0.15.0"
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["BACKUP_ID"]["value"] == "20261126T130000" and env["SERVER"]["value"] == "pg"
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {"name": "pg-store-credentials",
                                                                      "key": "ACCESS_KEY_ID"}

    store = Store.open(tmp_path / "results", create=False)
    (r,) = store.runs()
    m = {k: v for k, v in r.metrics.items() if v is not None}  # a figure stored empty: missing
    events = {kind: (ts, detail) for kind, ts, detail in store.conn.execute(
        "SELECT kind, ts, detail FROM events WHERE run_id = ?", (r.id,))}
    start, end = events["backup-start"][0], events["backup-end"][0]
    assert m["backup_s"] == pytest.approx(end - start) and m["recovered_s"] == pytest.approx(end - start)
    assert m["backup_operator_s"] == 1.0
    assert m["backup_wal_mb"] == pytest.approx((0x5000138 - 0x3000028) / MIB)
    assert (m["backup_objects"], m["backup_mb"], m["archive_wal_objects"], m["archive_wal_mb"]) == (3, 21, 5, 5)
    assert m["backup_mb_s"] == pytest.approx(21 / m["backup_s"])
    assert "leader_changed" not in m
    assert m["tps_before"] > 0 and m["tps_during"] > 0 and m["tps_after"] > 0
    # the archiver over the run, from the first to the last scrape of the primary
    assert m["archive_failed"] == 0  # the count did not move
    assert m["archived_wal_segments"] == pytest.approx(2 * m["archiver_span_s"], abs=1.01)
    assert m["wal_segments_written"] == pytest.approx(m["archiver_span_s"] / 2, rel=0.01)
    assert m["archive_ready_max"] == 1
    assert m["pg_wal_growth_mb"] == pytest.approx(16 * int(m["archiver_span_s"]), abs=16)
    store.close()
    assert_all_deleted(api)


def test_a_failed_backup_fails_the_run_with_the_operators_reason(
        backup_fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = backup_fake
    api.store.on_read["Backup"] = lambda key, obj: obj.update(status={"phase": "failed",
                                                                      "error": "can't upload: connection refused"})
    result = run(api_client, tmp_path, PLAN.replace("instances: 2", "instances: 1"))
    assert (result.ok, result.failed) == (0, 1)
    assert "backup: Backup/pg-run-0000-1-backup failed: can't upload: connection refused" in str(result.failures)
    api.objects.pop(SOURCE)
    assert_all_deleted(api)


def test_archiver_figures_need_the_archiver_metrics() -> None:
    a = exporter.Scrape("pg-1", 1.0, "x", values=exporter.parse(exporter_text("pg-1")))
    b = exporter.Scrape("pg-1", 3.0, "x", values=exporter.parse(exporter_text("pg-1")))
    assert exporter.archiver([a, b], "pg-1") == ({}, [])  # archiving off: no figure, not a zero
    assert lsn("16/B374D848") == (0x16 << 32) + 0xB374D848 and lsn("x") is None


def test_the_preflight_checks_the_plugin_and_what_the_plan_names(fake: tuple[FakeAPI, client.ApiClient],
                                                                 tmp_path: Path) -> None:
    """Without the plugin's CRD or its Service the operator never reconciles the Cluster (it refuses a plugin it does
    not know): `pglab k8s check` and `pglab run` say so before anything is created, naming the field."""
    api, api_client = fake
    plan = parse_plan(PLAN, base_dir=tmp_path)
    [finding] = check_wal_archive(plan, api_client)
    assert (finding.level, finding.text) == ("FAIL", (
        "target.kubernetes.wal_archive: CRD objectstores.barmancloud.cnpg.io not found, CloudNativePG's Barman Cloud "
        "plugin is not installed; install it in the operator's namespace (docs/kubernetes.md, 'Backup and WAL "
        "archiving')"))
    crd = cnpg_crd()
    crd["metadata"]["name"], crd["spec"]["group"] = BARMAN_CRD, "barmancloud.cnpg.io"
    api.crds[BARMAN_CRD] = crd
    [finding] = check_wal_archive(plan, api_client)
    assert (finding.level, finding.text) == ("FAIL", (
        "target.kubernetes.wal_archive: no Service labelled cnpg.io/pluginName=barman-cloud.cloudnative-pg.io in the "
        "operator's namespace (cnpg-system): the Barman Cloud plugin is not deployed there (docs/kubernetes.md, "
        "'Backup and WAL archiving')"))
    def service(namespace: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Service", "metadata": {
            "name": "barman-cloud", "namespace": namespace, "labels": {"cnpg.io/pluginName": BARMAN_PLUGIN}}}

    api.services = [service("elsewhere")]
    assert check_wal_archive(plan, api_client)[0].level == "FAIL"  # the operator looks in its own namespace only
    api.services = [service("cnpg-system")]
    [finding] = check_wal_archive(plan, api_client)
    assert (finding.level, finding.text) == ("FAIL", "target.kubernetes.wal_archive.s3.credentials: Secret "
                                             "objectstore/s3-credentials not found; create it or name one that exists")
    api.objects[SOURCE] = {"apiVersion": "v1", "kind": "Secret", "metadata": {
        "name": "s3-credentials", "namespace": "objectstore"}, "data": {}}
    [finding] = check_wal_archive(plan, api_client)
    assert (finding.level, finding.text) == ("ok", "Barman Cloud plugin: Service cnpg-system/barman-cloud; Secret "
                                                   "objectstore/s3-credentials present")
    # a plan naming its own ObjectStore: that one must be in the namespace
    own = parse_plan(k8s_plan("run: {duration: 4s}", kubernetes=("wal_archive: {object_store: mine}",)),
                     base_dir=tmp_path)
    [finding] = check_wal_archive(own, api_client)
    assert (finding.level, finding.text) == ("FAIL", "target.kubernetes.wal_archive.object_store: ObjectStore "
                                             "bench/mine not found; create it or name one that exists")
    api.objects["/apis/barmancloud.cnpg.io/v1/namespaces/bench/objectstores/mine"] = {
        "apiVersion": "barmancloud.cnpg.io/v1", "kind": "ObjectStore", "metadata": {"name": "mine",
                                                                                   "namespace": "bench"}}
    assert check_wal_archive(own, api_client)[0].level == "ok"
    # and a plan without archiving asks nothing of it
    before = len(api.requests)
    assert check_wal_archive(parse_plan(k8s_plan("run: {duration: 4s}"), base_dir=tmp_path), api_client) == []
    assert len(api.requests) == before
