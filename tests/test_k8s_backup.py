"""WAL archiving and the backup scenario on Kubernetes, against the fake API server: what a plan's wal_archive
renders (the ObjectStore, its credentials' copy, the Cluster's plugin entry, the Role), the plan's refusals, and a
backup run: the Backup (method plugin) asked for at the fault time, followed until the operator reports it completed,
the object store listed by a Job, the archiver's figures from the exporter. The real plugin and object store run in
tests/test_kube_lab_backup.py."""

from __future__ import annotations

import base64
import csv
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from conftest import pglab
from k8s_fake import FakeAPI, cnpg_crd, exporter_text, results_log
from k8s_fake.routing import NS, Answer, Request, Route
from k8s_support import PGBENCH, assert_all_deleted, check, k8s_plan, run
from pglab.plan.load import parse_plan
from pglab.store.sqlite import Store
from pglab.targets.kubernetes import exporter, orchestrate
from pglab.targets.kubernetes.orchestrate import HEALTHY
from pglab.targets.kubernetes.preflight import BARMAN_CRD, check_wal_archive
from pglab.targets.kubernetes.render import (
    BARMAN_PLUGIN,
    COPY_FROM,
    START_MARK,
    STORE_MARK,
    WITNESS_MARK,
    render,
    to_yaml,
)
from pglab.targets.kubernetes.restore import RESTORE_MARK, recovered_cluster
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


# ---------------------------------------------------------------------------------------------- the restore check
RESTORE_PLAN = k8s_plan("matrix: {clients: [2], jobs: [1], scenario: [{kind: backup, at: 1s, restore_check: true}]}",
                        "run: {duration: 4s}", kubernetes=ARCHIVE).replace("instances: 2", "instances: 1")
WITNESS_JOB, READER = "pg-witness-0000-1", "pg-restore-read"
END = 0x5000138  # the fake Backup's endLSN


def witness_attempts() -> list[tuple[str, int, str]]:
    """Ten writes 4 MiB of WAL apart from 0/3400000, the fourth refused before its insert: the eighth's insert is
    the last at or before the backup's end LSN, so the first seven's commits are before it (the seventh's because
    the eighth began after it was acknowledged) and 8-10 after it."""
    out = []
    for i in range(1, 11):
        position = 0x3000000 + i * 0x400000
        out.append(("failed", i, "-") if i == 4 else ("acked", i, f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"))
    return out


def test_witness_acks_split_at_the_backups_end() -> None:
    from pglab.scenarios.witness import ACKED, FAILED, Attempt, acked_before_lsn

    attempts = [Attempt(i, FAILED if what == "failed" else ACKED, 0.0, 0.0, None, None if at == "-" else at)
                for what, i, at in witness_attempts()]
    assert acked_before_lsn(attempts, END) == ([1, 2, 3, 5, 6, 7], [8, 9, 10])
    assert acked_before_lsn(attempts, 0) == ([], [1, 2, 3, 5, 6, 7, 8, 9, 10])  # nothing before: all after


@pytest.fixture
def restore_fake(backup_fake: tuple[FakeAPI, client.ApiClient]) -> tuple[FakeAPI, client.ApiClient]:
    """The backup fake, with the witness writing the ten attempts above (and reading all of its acked ones back),
    and CloudNativePG recovering Cluster/pg-restore: healthy on its third read, its pods gone once deleted, the
    reader finding ids 1-3, 5, 6, 8 and 9 (7 is lost; 10 was after the backup's end and not in the archive)."""
    api, _ = backup_fake
    run_log = api.default_log
    t = 1.8e9

    def log(job: str) -> str:
        if job == WITNESS_JOB:
            lines = [f"{WITNESS_MARK} {what} {i} {t + i:.6f} {t + i + 0.01:.6f} 10.0.0.1:5432 {at}"
                     + (" refused" if what == "failed" else "") for what, i, at in witness_attempts()]
            acked = [i for what, i, _ in witness_attempts() if what == "acked"]
            return "\n".join([*lines, f"{WITNESS_MARK} stopped 10", f"{WITNESS_MARK} present begin",
                              *map(str, acked), f"{WITNESS_MARK} present end"]) + "\n"
        if job == READER:
            return "\n".join([f"{RESTORE_MARK} present begin", "1", "2", "3", "5", "6", "8", "9",
                              f"{RESTORE_MARK} present end"]) + "\n"
        return run_log(job)

    api.default_log = log
    created, read = api.store.on_create["Cluster"], api.store.on_read["Cluster"]

    def on_create(body: dict[str, Any]) -> None:
        if body["metadata"]["name"] != "pg-restore":  # the operator's source Cluster stays as it is
            created(body)

    def on_read(key: str, obj: dict[str, Any]) -> None:
        if key.endswith("/pg-restore"):
            ready = api.reads[key] >= 3
            obj["status"] = {"phase": HEALTHY if ready else "Setting up primary", "readyInstances": 1 if ready else 0}
        else:
            read(key, obj)

    api.store.on_create["Cluster"], api.store.on_read["Cluster"] = on_create, on_read

    def empty(kind: str) -> Callable[[Request], Answer]:
        return lambda req: (200, {"kind": kind, "apiVersion": "v1", "metadata": {}, "items": []})

    api.routes[:0] = [  # the recovered Cluster's pods and claims, once it is deleted
        Route("GET", NS + "/pods", empty("PodList"), when=lambda req: req.selector == "cnpg.io/cluster=pg-restore"),
        Route("GET", NS + "/persistentvolumeclaims", empty("PersistentVolumeClaimList"))]
    return backup_fake


def test_a_restore_check_recovers_a_cluster_from_the_backup_and_counts_what_it_lost(
        restore_fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = restore_fake
    result = run(api_client, tmp_path, RESTORE_PLAN)
    assert (result.ok, result.failed) == (1, 0), result.failures
    posted = [b for b in api.posted if b["metadata"]["name"] == "pg-restore"]
    assert len(posted) == 1
    spec = posted[0]["spec"]
    # recovered from this backup (pinned by its id) in the ObjectStore the Cluster archived to, replaying to the end
    # of the archive (no target), archiving nothing itself, one instance as the source's
    assert spec["bootstrap"] == {"recovery": {"source": "origin", "recoveryTarget": {"backupID": "20261126T130000"}}}
    assert spec["externalClusters"] == [{"name": "origin", "plugin": {"name": BARMAN_PLUGIN, "parameters": {
        "barmanObjectName": "pg-store", "serverName": "pg"}}}]
    assert "plugins" not in spec and spec["instances"] == 1
    source = next(b for b in api.posted if b["kind"] == "Cluster" and b["metadata"]["name"] == "pg")["spec"]
    assert (spec["imageName"], spec["storage"], spec["resources"]) == (source["imageName"], source["storage"],
                                                                        source["resources"])
    # the reader: the recovered Cluster's service and the app secret the operator makes for it
    reader = next(b for b in api.posted if b["metadata"]["name"] == READER)["spec"]["template"]["spec"]
    env = {e["name"]: e for e in reader["containers"][0]["env"]}
    assert env["PGHOST"]["value"] == "pg-restore-rw"
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "pg-restore-app"
    # in order: the backup completed, the witness done, then the recovery, its reader, and its deletion
    order = [(m, p) for m, p in api.requests if m in ("POST", "DELETE")]
    restored = "/apis/postgresql.cnpg.io/v1/namespaces/bench/clusters/pg-restore"
    witness_gone = order.index(("DELETE", f"/apis/batch/v1/namespaces/bench/jobs/{WITNESS_JOB}"))
    clusters = [i for i, req in enumerate(order) if req == ("POST", "/apis/postgresql.cnpg.io/v1/namespaces/bench/"
                                                                   "clusters")]
    assert len(clusters) == 2 and clusters[0] < witness_gone < clusters[1]
    assert (order.index(("POST", "/apis/batch/v1/namespaces/bench/jobs"), witness_gone) < order.index(("DELETE",
            restored)))
    assert ("DELETE", f"/apis/batch/v1/namespaces/bench/jobs/{READER}") in order

    store = Store.open(tmp_path / "results", create=False)
    (r,) = store.runs()
    m = {k: v for k, v in r.metrics.items() if v is not None}  # a figure stored empty: missing
    assert (m["restore_acked"], m["restore_lost"], m["restore_after_acked"], m["restore_after_found"]) == (6, 1, 3, 2)
    events = {kind: (ts, detail) for kind, ts, detail in store.conn.execute(
        "SELECT kind, ts, detail FROM events WHERE run_id = ?", (r.id,))}
    assert m["restore_s"] == pytest.approx(events["restore-ready"][0] - events["restore-start"][0], abs=0.5)
    assert m["restore_s"] > 0 and events["restore-start"][0] >= events["backup-end"][0]
    assert events["restore-check"][1] == ("5 of the 6 writes acknowledged before the backup's end (LSN 0/5000138) "
                                          "found, 1 lost; 2 of the 3 acknowledged after it; lost: 7")
    kept = json.loads((tmp_path / "results" / r.dir / "restore.json").read_text())
    assert (kept["lost"], kept["acked"], kept["backup_id"]) == ([7], [1, 2, 3, 5, 6, 7], "20261126T130000")
    store.close()
    table = pglab("report", str(tmp_path / "results"), "--table", "scenarios", "--format", "csv")
    assert table.returncode == 0, table.stderr
    rows = list(csv.DictReader(io.StringIO(table.stdout)))
    assert (float(rows[0]["restore_acked"]), float(rows[0]["restore_lost"])) == (6, 1), rows
    assert "LOST 1 acknowledged write(s) in the Cluster recovered from the backup" in rows[0]["finding"]
    api.objects.pop(SOURCE)
    assert_all_deleted(api)  # the recovered Cluster too


NO_NODE = "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available."


@pytest.mark.parametrize("unschedulable", [False, True], ids=["never healthy", "no node fits"])
def test_a_recovered_cluster_never_healthy_fails_the_run_and_is_deleted(
        restore_fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        unschedulable: bool) -> None:
    """Waited for as the measured Cluster is: until its readiness timeout, or, its pod fitting no node, until the
    scheduler's reason has lasted POD_START_GRACE_S (the readiness timeout, 30 min, would say nothing)."""
    api, api_client = restore_fake
    read = api.store.on_read["Cluster"]

    def stuck(key: str, obj: dict[str, Any]) -> None:
        read(key, obj)
        if key.endswith("/pg-restore"):
            obj["status"] = {"phase": "Setting up primary", "readyInstances": 0}

    api.store.on_read["Cluster"] = stuck
    expected = "Cluster/pg-restore not ready after 1 s (phase: Setting up primary, ready instances: 0 of 1)"
    if unschedulable:
        monkeypatch.setattr(orchestrate, "POD_LOOK_S", 0.0)
        monkeypatch.setattr(orchestrate, "POD_START_GRACE_S", 0.2)
        pending = {"metadata": {"name": "pg-restore-1"}, "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": NO_NODE}]}}

        def pods(req: Request) -> Answer:  # Pending while the Cluster is there
            there = any(k.endswith("/clusters/pg-restore") for k in api.objects)
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [pending] if there else []}

        api.routes.insert(0, Route("GET", NS + "/pods", pods,
                                   when=lambda req: req.selector == "cnpg.io/cluster=pg-restore"))
        expected = f"Cluster/pg-restore: its pod pg-restore-1 cannot start after 0 s (Unschedulable: {NO_NODE})"
    result = run(api_client, tmp_path, RESTORE_PLAN, ready_timeout_s=60.0 if unschedulable else 1.0)
    assert (result.ok, result.failed) == (0, 1)
    assert f"restore check: {expected}" in str(result.failures), result.failures
    assert not any(b["metadata"]["name"] == READER for b in api.posted)  # nothing read from it
    assert ("DELETE", "/apis/postgresql.cnpg.io/v1/namespaces/bench/clusters/pg-restore") in api.requests
    api.objects.pop(SOURCE)
    assert_all_deleted(api)


def test_the_recovered_cluster_is_valid_for_cloudnativepg(checker: Path, tmp_path: Path) -> None:
    plan = parse_plan(RESTORE_PLAN, base_dir=tmp_path)
    path = tmp_path / "restore.yaml"
    path.write_text(to_yaml(recovered_cluster(plan, "20261126T130000").body))
    proc = check(checker, path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(("scenario", "kubernetes", "message"), [
    ("{kind: failover, at: 1s, restore_check: true}", True,
     "matrix.scenario[0].restore_check: restore_check is the backup scenario's"),
    ("{kind: backup, at: 1s, restore_check: true, witness: false}", True,
     "matrix.scenario[0].restore_check: restore_check compares the recovered Cluster with the witness's acknowledged "
     "writes; set witness: true or remove restore_check"),
    ("{kind: backup, at: 1s, restore_check: true}", False,
     "matrix.scenario[0].restore_check: restore_check runs on a Kubernetes target only"),
])
def test_a_restore_check_that_cannot_run_is_refused_naming_the_field(tmp_path: Path, scenario: str,
                                                                     kubernetes: bool, message: str) -> None:
    path = tmp_path / "plan.yaml"
    if kubernetes:
        path.write_text(RESTORE_PLAN.replace("{kind: backup, at: 1s, restore_check: true}", scenario)
                        .replace("instances: 1", "instances: 2"))
    else:
        path.write_text(f"""name: restore
target: {{local: {{instances: 1}}}}
matrix: {{clients: [2], scenario: [{scenario}]}}
run: {{duration: 4s}}
""")
    proc = pglab("plan", "validate", str(path))
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
