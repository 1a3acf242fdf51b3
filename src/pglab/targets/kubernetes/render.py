"""Plan → Kubernetes manifests: the CloudNativePG Cluster, fio and pgbench Jobs, and the RBAC pglab needs.

Pure functions of the plan (no cluster, no client library): ``pglab k8s render`` writes them for review or GitOps,
and the orchestration applies the very same objects, so what was reviewed (and strictly decoded by cnpg-check) is
what runs. Results leave the pods through their output (a base64 tarball between markers): a Job's log, or, for
``pglab run``'s runs, the output of the run Job's script exec'd in a long-lived client pod (``clients``). The
scripts the pods run are ``scripts``' (text only), the rendered folder and run-jobs.sh ``folder``'s.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pglab.plan.expand import Point, expand
from pglab.plan.schema import K8sStorage, KubernetesTarget, Placement, Plan, StorageOption
from pglab.targets.kubernetes import monitoring, pgstats, statements

# the scripts, and (X as X) the markers that scenario and disks still import from here
from pglab.targets.kubernetes.scripts import DISKSTATS_MARK as DISKSTATS_MARK
from pglab.targets.kubernetes.scripts import (
    LIST_STORE,
    RESULTS_DIR,
    SCRIPTS_DIR,
    VOLUME_DIR,
    barrier_script,
    disk_sampler_script,
    end_barrier_script,
    fio_script,
    reset_script,
    segments_script,
    settings_script,
    ship_results,
    start_wait_script,
    volume_probe_script,
    wait_for_server,
    window_reads,
    witness_script,
)
from pglab.targets.kubernetes.scripts import LOAD_DIR as LOAD_DIR
from pglab.targets.kubernetes.scripts import START_MARK as START_MARK
from pglab.targets.kubernetes.scripts import STORE_MARK as STORE_MARK
from pglab.targets.kubernetes.scripts import VOLUME_MARK as VOLUME_MARK
from pglab.targets.kubernetes.scripts import WITNESS_MARK as WITNESS_MARK
from pglab.targets.kubernetes.scripts import WITNESS_TABLE as WITNESS_TABLE
from pglab.workloads import fio
from pglab.workloads.pgbench import init_args, run_args

CNPG_API = "postgresql.cnpg.io/v1"
BARMAN_API = "barmancloud.cnpg.io/v1"
BARMAN_PLUGIN = "barman-cloud.cloudnative-pg.io"  # CloudNativePG's Barman Cloud plugin, as it registers itself
COPY_FROM = "pglab/copy-from"  # a Secret pglab fills, when it creates it, from this namespace/name
MANAGED_BY = {"app.kubernetes.io/managed-by": "pglab"}
GIB = 1 << 30
METRICS_QUERIES_TTL = "1s"  # below pglab's exporter read interval (2 s)
DATABASE = "app"  # the database (and owner) the Cluster bootstraps; pgbench gets it from the app secret
# The reset before each run ends with a CHECKPOINT, as on a local lab, so every window starts with no dirty buffers
# of the last run: the app role may run it with pg_checkpoint (PostgreSQL 15+), given once as the Cluster is made.
# Its body is a plain string literal: CloudNativePG 1.28 refuses a dollar-quoted one ('syntax error at or near "$"').
GRANT_CHECKPOINT = ("DO 'BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = ''pg_checkpoint'') THEN "
                    f"GRANT pg_checkpoint TO {DATABASE}; END IF; END'")


@dataclass(frozen=True)
class Manifest:
    """One file of the rendered set: its name in the output folder and the object it holds."""

    filename: str
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body["kind"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])


def target_of(plan: Plan) -> KubernetesTarget:
    k8s = plan.target.kubernetes
    if k8s is None:
        from pglab.errors import UserError

        raise UserError(f"plan '{plan.name}' has no 'target: kubernetes'; only a Kubernetes plan renders manifests.")
    return k8s


def _meta(k8s: KubernetesTarget, name: str, component: str, **extra: Any) -> dict[str, Any]:
    labels = {**MANAGED_BY, "pglab/cluster": k8s.cluster_name, "pglab/component": component}
    return {"name": name, "namespace": k8s.namespace, "labels": labels, **extra}


def param_value(value: str | int | float | bool) -> str:
    """CloudNativePG takes every parameter as text (it quotes them itself): booleans as on/off."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _storage(s: K8sStorage) -> dict[str, Any]:
    out: dict[str, Any] = {"size": s.size}
    if s.storage_class is not None:
        out["storageClass"] = s.storage_class
    return out


def _tolerations(p: Placement) -> list[dict[str, Any]]:
    return [t.model_dump(exclude_none=True) for t in p.tolerations]


def cpu_quantity(cpus: float) -> str:
    """A CPU axis step as a Kubernetes quantity: whole cores as such, fractions in millicores (1.5 → 1500m)."""
    milli = round(cpus * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def millicores(quantity: str) -> int:
    """A CPU quantity as the API server may spell it back (2, 1.5, 1500m) in millicores, to compare steps."""
    return round(float(quantity[:-1])) if quantity.endswith("m") else round(float(quantity) * 1000)


def first_point(plan: Plan) -> Point:
    return expand(plan, cores=client_cores(target_of(plan)))[0]


def instance_resources(plan: Plan, point: Point | None = None) -> dict[str, Any]:
    """``.spec.resources`` for a point: its CPU step (else the target's CPU), the target's memory; requests equal
    limits, so the instances keep Guaranteed QoS at every step."""
    k8s = target_of(plan)
    point = point or first_point(plan)
    cpu = cpu_quantity(point.cpus) if point.cpus is not None else k8s.resources.cpu
    amounts = {"cpu": cpu, "memory": k8s.resources.memory}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def instance_parameters(plan: Plan, point: Point | None = None) -> dict[str, str]:
    """``.spec.postgresql.parameters`` for a point: the plan's parameters with the point's own on top."""
    point = point or first_point(plan)
    return {k: param_value(v) for k, v in {**plan.postgres.parameters, **point.parameters}.items()}


# ------------------------------------------------------------------ the database
def cluster(plan: Plan, point: Point | None = None) -> dict[str, Any]:
    """The CloudNativePG Cluster: instances, image, volumes, Guaranteed QoS, placement, synchronous replication.

    Created as the given point (default: the plan's first) needs it: its CPU step and parameters; the sweep
    patches both between points (``cluster_patch``)."""
    point = point or first_point(plan)
    plan = with_storage(plan, point.storage)  # the storage axis: this value's volumes
    k8s = target_of(plan)
    postgresql: dict[str, Any] = {}
    if parameters := instance_parameters(plan, point):
        postgresql["parameters"] = parameters
    if k8s.synchronous is not None:
        postgresql["synchronous"] = {"method": k8s.synchronous.method, "number": k8s.synchronous.number,
                                     "dataDurability": k8s.synchronous.data_durability}
    db = k8s.database
    affinity: dict[str, Any] = {"enablePodAntiAffinity": db.anti_affinity != "none", "topologyKey": db.topology_key}
    if db.anti_affinity != "none":
        affinity["podAntiAffinityType"] = db.anti_affinity
    if db.node_selector:
        affinity["nodeSelector"] = dict(db.node_selector)
    if db.tolerations:
        affinity["tolerations"] = _tolerations(db)
    spec: dict[str, Any] = {
        "instances": k8s.instances,
        "imageName": k8s.image,
        "postgresql": postgresql,
        "bootstrap": {"initdb": {"database": DATABASE, "owner": DATABASE, "postInitSQL": [GRANT_CHECKPOINT]}},
        "storage": _storage(k8s.storage),
        "resources": instance_resources(plan, point),  # requests = limits: Guaranteed QoS
        "affinity": affinity,
        "monitoring": monitoring_spec(k8s),
    }
    if k8s.wal_storage is not None:
        spec["walStorage"] = _storage(k8s.wal_storage)
    if k8s.startup_probe_period is not None:  # the operator derives the probe's failure threshold from startDelay
        spec["probes"] = {"startup": {"periodSeconds": k8s.startup_probe_period}}
    if k8s.wal_archive is not None:  # the plugin archives WAL continuously (and takes the backups) to the store
        spec["plugins"] = [{"name": BARMAN_PLUGIN, "isWALArchiver": True,
                            "parameters": {"barmanObjectName": object_store_name(k8s)}}]
    meta = _meta(k8s, k8s.cluster_name, "database", annotations={"pglab/plan": plan.name})
    return {"apiVersion": CNPG_API, "kind": "Cluster", "metadata": meta, "spec": spec}


def monitoring_spec(k8s: KubernetesTarget) -> dict[str, Any]:
    """The Cluster's ``monitoring``. CloudNativePG 1.28+ caches its monitoring queries' results (30 s by default):
    pglab reads the exporter every 2 s and takes window deltas between reads, so each read must run the queries
    again. With ``exporter_queries: pglab`` the queries are pglab's own (``monitoring_queries``), not the default
    set."""
    spec: dict[str, Any] = {"metricsQueriesTTL": METRICS_QUERIES_TTL}
    if k8s.exporter_queries == "pglab":
        spec["disableDefaultQueries"] = True
        spec["customQueriesConfigMap"] = [{"name": monitoring_name(k8s), "key": monitoring.KEY}]
    return spec


def monitoring_name(k8s: KubernetesTarget) -> str:
    return f"{k8s.cluster_name}-monitoring"


def monitoring_queries(plan: Plan) -> list[Manifest]:
    """The ConfigMap of pglab's monitoring queries, made before the Cluster that names it; none with the default
    set."""
    k8s = target_of(plan)
    if k8s.exporter_queries != "pglab":
        return []
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(k8s, monitoring_name(k8s), "monitoring"),
            "data": {monitoring.KEY: yaml.safe_dump(monitoring.QUERIES, sort_keys=False, width=1000)}}
    return [Manifest("08-monitoring.yaml", body)]


def object_store_name(k8s: KubernetesTarget) -> str:
    """The ObjectStore the Cluster archives to: the plan's, or the one pglab creates."""
    assert k8s.wal_archive is not None
    return k8s.wal_archive.object_store or f"{k8s.cluster_name}-store"


def object_store(plan: Plan) -> list[Manifest]:
    """The ObjectStore pglab creates for ``wal_archive.s3`` and the copy of its credentials' Secret (filled from
    ``s3.credentials`` when pglab creates it: a rendered copy is empty, fill it before applying); none when the plan
    names an ObjectStore of its own."""
    k8s = target_of(plan)
    if k8s.wal_archive is None or k8s.wal_archive.s3 is None:
        return []
    s3, name = k8s.wal_archive.s3, object_store_name(k8s)
    secret = f"{name}-credentials"
    copy = {"apiVersion": "v1", "kind": "Secret",
            "metadata": _meta(k8s, secret, "objectstore", annotations={COPY_FROM: s3.credentials}),
            "data": {"ACCESS_KEY_ID": "", "ACCESS_SECRET_KEY": ""}}
    config: dict[str, Any] = {
        "destinationPath": s3.destination,
        "s3Credentials": {"accessKeyId": {"name": secret, "key": "ACCESS_KEY_ID"},
                          "secretAccessKey": {"name": secret, "key": "ACCESS_SECRET_KEY"}},
        "wal": {"maxParallel": s3.max_parallel}}
    if s3.endpoint:
        config["endpointURL"] = s3.endpoint
    if s3.compression:
        config["wal"]["compression"] = s3.compression
        config["data"] = {"compression": s3.compression}
    if s3.jobs:
        config.setdefault("data", {})["jobs"] = s3.jobs
    if s3.immediate_checkpoint:
        config.setdefault("data", {})["immediateCheckpoint"] = True
    store = {"apiVersion": BARMAN_API, "kind": "ObjectStore", "metadata": _meta(k8s, name, "objectstore"),
             "spec": {"configuration": config}}
    return [Manifest("05-objectstore-credentials.yaml", copy), Manifest("06-objectstore.yaml", store)]


def backup(plan: Plan, name: str) -> Manifest:
    """A base backup of the Cluster through the Barman Cloud plugin (the backup scenario's)."""
    k8s = target_of(plan)
    body = {"apiVersion": CNPG_API, "kind": "Backup", "metadata": _meta(k8s, name, "backup"),
            "spec": {"cluster": {"name": k8s.cluster_name}, "method": "plugin",
                     "pluginConfiguration": {"name": BARMAN_PLUGIN}}}
    return Manifest(f"backup-{name}.yaml", body)


def store_listing(plan: Plan, name: str, image: str, node: str, config: dict[str, Any], backup_id: str) -> Manifest:
    """A Job that lists the object store as the Barman Cloud plugin wrote it (S3 ListObjectsV2 through boto3, in the
    plugin's own sidecar image, on the node that runs it): the objects and bytes of one base backup and of the WAL
    archive, printed on one line (``STORE_MARK``). ``config``: the ObjectStore's spec.configuration."""
    k8s = target_of(plan)
    creds = config.get("s3Credentials") or {}
    env: list[dict[str, Any]] = [{"name": "DESTINATION", "value": str(config.get("destinationPath", ""))},
           {"name": "ENDPOINT", "value": str(config.get("endpointURL") or "")},
           {"name": "SERVER", "value": k8s.cluster_name}, {"name": "BACKUP_ID", "value": backup_id},
           {"name": "AWS_DEFAULT_REGION", "value": "us-east-1"}]
    for var, key in (("AWS_ACCESS_KEY_ID", "accessKeyId"), ("AWS_SECRET_ACCESS_KEY", "secretAccessKey")):
        if key in creds:
            env.append({"name": var, "valueFrom": {"secretKeyRef": dict(creds[key])}})
    pod = {"restartPolicy": "Never", "automountServiceAccountToken": False, "nodeName": node,
           "containers": [{"name": "main", "image": image, "command": ["python3", "-c", LIST_STORE], "env": env,
                           "securityContext": {**_unprivileged(), "runAsUser": 26, "runAsGroup": 26},
                           "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                                         "limits": {"cpu": "500m", "memory": "256Mi"}}}]}
    return Manifest(f"store-{name}.yaml", _job(k8s, name, "store-listing", pod))


def cluster_patch(plan: Plan, point: Point) -> dict[str, Any]:
    """The merge patch that turns the Cluster into what ``point`` needs (resources and parameters, both whole)."""
    spec: dict[str, Any] = {"resources": instance_resources(plan, point)}
    if parameters := instance_parameters(plan, point):
        spec["postgresql"] = {"parameters": parameters}
    return {"spec": spec}


# ------------------------------------------------------------------ client pods
def _client_pod(k8s: KubernetesTarget, image: str, script: str, *, env: list[dict[str, Any]] | None = None,
                volumes: list[dict[str, Any]] | None = None, mounts: list[dict[str, Any]] | None = None,
                avoid_database: bool = True) -> dict[str, Any]:
    """A pod template on client nodes: selectors, tolerations, and (required) anti-affinity to the instances."""
    c = k8s.clients
    container: dict[str, Any] = {
        "name": "main", "image": image, "command": ["/bin/sh", "-c", script],
        "volumeMounts": [{"name": "results", "mountPath": RESULTS_DIR}, *(mounts or [])],
    }
    if env:
        container["env"] = env
    amounts = {k: v for k, v in (("cpu", c.cpu), ("memory", c.memory)) if v is not None}
    if amounts:
        container["resources"] = {"requests": dict(amounts), "limits": dict(amounts)}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # benchmark pods never talk to the API
        "containers": [container],
        "volumes": [{"name": "results", "emptyDir": {}}, *(volumes or [])],
    }
    if c.node_selector:
        spec["nodeSelector"] = dict(c.node_selector)
    if c.tolerations:
        spec["tolerations"] = _tolerations(c)
    if avoid_database and c.anti_affinity != "none":
        term = {"labelSelector": {"matchLabels": {"cnpg.io/cluster": k8s.cluster_name}},
                "topologyKey": c.topology_key}
        anti = ({"requiredDuringSchedulingIgnoredDuringExecution": [term]} if c.anti_affinity == "required" else
                {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]})
        spec["affinity"] = {"podAntiAffinity": anti}
    return spec


def _job(k8s: KubernetesTarget, name: str, component: str, pod: dict[str, Any],
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {**MANAGED_BY, "pglab/cluster": k8s.cluster_name, "pglab/component": component}
    meta = _meta(k8s, name, component)
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
            "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": labels}, "spec": pod}}}


# ------------------------------------------------------------------ disk figures of the database nodes
DISK_SAMPLER = "disk-sampler"
def _unprivileged() -> dict[str, Any]:
    """The restricted Pod Security Standard, and then some: nobody, read-only root, no capability."""
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "runAsUser": 65534, "runAsGroup": 65534, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}


def _tiny() -> dict[str, Any]:
    return {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "32Mi"}}


def disk_sampler(plan: Plan) -> Manifest:
    """A DaemonSet on the database nodes printing their /proc/diskstats each second: pglab reads the disk figures
    of the instances' volumes from its pods' logs. No hostPath, hostPID, privilege nor capability (the restricted
    Pod Security Standard), no service account token; the fio image, already pulled on those nodes."""
    k8s = target_of(plan)
    name = f"{k8s.cluster_name}-{DISK_SAMPLER}"
    labels = {**MANAGED_BY, "pglab/cluster": k8s.cluster_name, "pglab/component": DISK_SAMPLER}
    container: dict[str, Any] = {
        "name": "main", "image": k8s.clients.fio_image, "command": ["/bin/sh", "-c", disk_sampler_script()],
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "resources": _tiny(), "securityContext": _unprivileged(),
    }
    pod: dict[str, Any] = {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 2,
                           "containers": [container]}
    db = k8s.database
    if db.node_selector:
        pod["nodeSelector"] = dict(db.node_selector)
    if db.tolerations:
        pod["tolerations"] = _tolerations(db)
    selector = {"pglab/cluster": k8s.cluster_name, "pglab/component": DISK_SAMPLER}
    body = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": _meta(k8s, name, DISK_SAMPLER),
            "spec": {"selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": labels}, "spec": pod}}}
    return Manifest("15-disk-sampler-daemonset.yaml", body)


VOLUME_PROBE = "volume-probe"
VOLUME_PROBE_DEADLINE_S = 120  # a probe pod that cannot start (a ReadWriteOncePod claim, a full node) gives up


def volume_probe(plan: Plan, name: str, node: str, claims: list[str]) -> Manifest:
    """A Job on ``node`` mounting the instances' claims there read-only, to print the device number of each: which
    of the node's /proc/diskstats devices carries a volume's I/O. A ReadWriteOnce volume may be mounted by several
    pods of the node it is attached to; unprivileged, as the sampler."""
    k8s = target_of(plan)
    mounts = [{"name": f"v{i}", "mountPath": f"/volumes/{c}", "readOnly": True} for i, c in enumerate(claims)]
    volumes = [{"name": f"v{i}", "persistentVolumeClaim": {"claimName": c, "readOnly": True}}
               for i, c in enumerate(claims)]
    container = {"name": "main", "image": k8s.clients.fio_image, "command": ["/bin/sh", "-c", volume_probe_script()],
                 "volumeMounts": mounts, "resources": _tiny(), "securityContext": _unprivileged()}
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}  # as DaemonSets pin
    pod: dict[str, Any] = {"restartPolicy": "Never", "automountServiceAccountToken": False,
                           "containers": [container], "volumes": volumes,
                           "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                               "nodeSelectorTerms": [term]}}}}
    if k8s.database.tolerations:
        pod["tolerations"] = _tolerations(k8s.database)
    body = _job(k8s, name, VOLUME_PROBE, pod, annotations={"pglab/node": node})
    body["spec"]["activeDeadlineSeconds"] = VOLUME_PROBE_DEADLINE_S
    return Manifest(f"{name}.yaml", body)


# ------------------------------------------------------------------ storage phase (fio)
def fio_volumes(plan: Plan) -> list[tuple[str, K8sStorage]]:
    """The volumes the storage phase measures: data, and WAL when it has its own volume."""
    k8s = target_of(plan)
    if plan.storage is None:
        return []
    out = [("data", k8s.storage)] if "data" in plan.storage.paths else []
    if "wal" in plan.storage.paths and k8s.wal_storage is not None:
        out.append(("wal", k8s.wal_storage))
    return out


def _pvc_size(plan: Plan) -> str:
    """Room for fio's test file and its logs, in whole GiB."""
    assert plan.storage is not None
    need = plan.storage.size.bytes + fio.SPACE_MARGIN
    return f"{max(1, math.ceil(need / GIB))}Gi"


def fio_manifests(plan: Plan) -> list[Manifest]:
    """Per measured volume: a PVC of its storage class and a Job running the profiles on it; with a storage axis,
    per value and volume (``storage_axis_fio``)."""
    if plan.matrix.storage:
        return storage_axis_fio(plan)
    return _fio_manifests(plan)


def _fio_manifests(plan: Plan, option: str | None = None) -> list[Manifest]:
    k8s = target_of(plan)
    out: list[Manifest] = []
    for role, storage in fio_volumes(plan):
        tag = f"{option}-{role}" if option is not None else role
        name = f"{k8s.cluster_name}-fio-{tag}"
        pvc_spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                                    "resources": {"requests": {"storage": _pvc_size(plan)}}}
        if storage.storage_class is not None:
            pvc_spec["storageClassName"] = storage.storage_class
        pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(k8s, name, "fio"),
               "spec": pvc_spec}
        # fio runs where the database will: on database nodes, so the volume is measured from the same place
        pod = _client_pod(k8s, k8s.clients.fio_image, fio_script(plan), avoid_database=False,
                          volumes=[{"name": "volume", "persistentVolumeClaim": {"claimName": name}}],
                          mounts=[{"name": "volume", "mountPath": VOLUME_DIR}])
        db = k8s.database
        pod.pop("nodeSelector", None)
        pod.pop("tolerations", None)
        pod["containers"][0].pop("resources", None)  # the client's budget is pgbench's, not fio's
        if db.node_selector:
            pod["nodeSelector"] = dict(db.node_selector)
        if db.tolerations:
            pod["tolerations"] = _tolerations(db)
        notes = {"pglab/volume": role, **({"pglab/storage": option} if option is not None else {})}
        out += [Manifest(f"20-fio-{tag}-pvc.yaml", pvc),
                Manifest(f"21-fio-{tag}-job.yaml", _job(k8s, name, "fio", pod, notes))]
    return out


def fio_on_node(pvc: Manifest, job: Manifest, node: str, index: int) -> tuple[Manifest, Manifest]:
    """A fio PVC and Job of ``fio_manifests`` for one node of the Cluster's instances (the ``index``-th): the Job
    pinned to the node, so its volume is made there (a WaitForFirstConsumer class) as the instance's was, and the
    figures are that node's disk's. Nodes of one Cluster may have different disks: each instance's is measured."""
    name = f"{pvc.name}-{index}"
    pvc_body = json.loads(json.dumps(pvc.body))
    pvc_body["metadata"]["name"] = name
    body = json.loads(json.dumps(job.body))
    body["metadata"]["name"] = name
    body["metadata"].setdefault("annotations", {})["pglab/node"] = node
    pod = body["spec"]["template"]["spec"]
    for volume in pod["volumes"]:
        if "persistentVolumeClaim" in volume:
            volume["persistentVolumeClaim"]["claimName"] = name
    # the node's name, not its hostname label (they differ on some clouds)
    pod.setdefault("affinity", {})["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}
    return (Manifest(pvc.filename.replace("-pvc.yaml", f"-{index}-pvc.yaml"), pvc_body),
            Manifest(job.filename.replace("-job.yaml", f"-{index}-job.yaml"), body))


def fio_on_host(pvc: Manifest, job: Manifest, directory: str, node: str, index: int) -> Manifest:
    """The ``index``-th node's fio Job of ``fio_on_node`` with a hostPath volume at the node's ``directory`` in
    place of its claim (made when missing): the same image and jobs on the same node, the volume layer left out."""
    _, pinned = fio_on_node(pvc, job, node, index)
    body = pinned.body
    body["metadata"]["name"] = f"{body['metadata']['name']}-host"
    body["metadata"]["annotations"]["pglab/host-path"] = directory
    for volume in body["spec"]["template"]["spec"]["volumes"]:
        if volume.pop("persistentVolumeClaim", None) is not None:
            volume["hostPath"] = {"path": directory, "type": "DirectoryOrCreate"}
    return Manifest(pinned.filename.replace("-job.yaml", "-host-job.yaml"), body)


# ------------------------------------------------------------------ the storage axis: a Cluster per value
def with_storage(plan: Plan, option: StorageOption | None) -> Plan:
    """The plan as one value of the storage axis sees it: the target's data (and WAL) volumes replaced by the
    value's, everything else as written. None: the plan itself."""
    if option is None or (option.storage is None and option.wal_storage is None):
        return plan
    k8s = target_of(plan)
    update: dict[str, Any] = {}
    if option.storage is not None:
        update["storage"] = option.storage
    if option.wal_storage is not None:
        update["wal_storage"] = option.wal_storage
    target = plan.target.model_copy(update={"kubernetes": k8s.model_copy(update=update)})
    return plan.model_copy(update={"target": target})


def storage_axis_fio(plan: Plan) -> list[Manifest]:
    """The storage phase of a storage axis: every value's volumes measured, each on a PVC of the value's class."""
    return [m for option in plan.matrix.storage or [] for m in _fio_manifests(with_storage(plan, option),
                                                                               option.name)]


def storage_volumes(plan: Plan, option: StorageOption | None) -> dict[str, str | None]:
    """role → storage class (None: the cluster's default) of the volumes a value's Cluster claims."""
    k8s = target_of(with_storage(plan, option))
    out = {"data": k8s.storage.storage_class}
    if k8s.wal_storage is not None:
        out["wal"] = k8s.wal_storage.storage_class
    return out


# ------------------------------------------------------------------ database phase (pgbench)
def _pg_env(k8s: KubernetesTarget, synchronous_commit: str | None = None) -> list[dict[str, Any]]:
    """libpq's environment: the primary's service, credentials from the operator's '<cluster>-app' secret."""
    secret = f"{k8s.cluster_name}-app"
    env: list[dict[str, Any]] = [{"name": "PGHOST", "value": f"{k8s.cluster_name}-rw"}, {"name": "PGPORT", "value":
                                                                                         "5432"}]
    for var, key in (("PGUSER", "username"), ("PGPASSWORD", "password"), ("PGDATABASE", "dbname")):
        env.append({"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    if synchronous_commit is not None:
        env.append({"name": "PGOPTIONS", "value": f"-c synchronous_commit={synchronous_commit}"})
    return env


def _script_files(plan: Plan) -> list[str]:
    files: list[str] = []
    for w in plan.matrix.workload:
        if not isinstance(w, str):
            files += [s.file for s in w.scripts if s.file is not None and s.file not in files]
    return files


def _config_key(file: str) -> str:
    return re.sub(r"[^-._a-zA-Z0-9]", "_", file)


def scripts_configmap(plan: Plan, base_dir: Path) -> Manifest | None:
    """Custom pgbench scripts, read from the plan's folder, in a ConfigMap mounted at SCRIPTS_DIR."""
    files = _script_files(plan)
    if not files:
        return None
    k8s = target_of(plan)
    data = {_config_key(f): (base_dir / f).read_text() for f in files}
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(k8s, f"{k8s.cluster_name}-scripts", "pgbench"),
            "data": data}
    return Manifest("30-pgbench-scripts.yaml", body)


def _scripts_volume(plan: Plan) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    files = _script_files(plan)
    if not files:
        return [], []
    k8s = target_of(plan)
    items = [{"key": _config_key(f), "path": f} for f in files]
    return ([{"name": "scripts", "configMap": {"name": f"{k8s.cluster_name}-scripts", "items": items}}],
            [{"name": "scripts", "mountPath": SCRIPTS_DIR, "readOnly": True}])


def client_cores(k8s: KubernetesTarget) -> int:
    """Default pgbench threads come from the client pod's CPU (else the instances'), not from this machine."""
    cpu = k8s.clients.cpu or k8s.resources.cpu
    cores = float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
    return max(1, math.ceil(cores))


def pgbench_init(plan: Plan) -> Manifest:
    k8s = target_of(plan)
    args = ["pgbench", *init_args(Path(), plan.dataset, client_side=True)[1:]]
    script = (f"set -eu\n{wait_for_server()}{shlex.join(args)} > {RESULTS_DIR}/init.log 2>&1 || rc=$?\n"
              f"cat {RESULTS_DIR}/init.log\n"
              f"{ship_results()}\nexit ${{rc:-0}}")
    pod = _client_pod(k8s, k8s.clients.image or k8s.image, script, env=_pg_env(k8s))
    return Manifest("40-pgbench-init-job.yaml", _job(k8s, f"{k8s.cluster_name}-pgbench-init", "pgbench-init", pod))


def window_reads_of(plan: Plan, point: Point, with_pgstats: bool = False) -> tuple[str, str]:
    """The shell before and after a run's pgbench line that reads what the window's reads are for this point:
    pg_stat_statements where loaded (``statements``), and, asked for (each tenant's Job), the WAL, checkpoint and
    backend-write counters (``pgstats``), innermost; a scenario that moves the primary ships why the view is not
    read instead (``statements.NOT_READ_FILE``)."""
    parameters = instance_parameters(plan, point)
    reads = [r for r in (statements.read_part(plan, parameters, point),
                         pgstats.read_part() if with_pgstats and plan.probes.enabled else None) if r is not None]
    warmup = plan.run.warmup if plan.run.measured_seconds is not None else 0.0
    before, after = window_reads(reads, warmup)
    if (why := statements.not_read(plan, parameters, point)) is not None:
        before = f"echo {shlex.quote(why)} > {statements.NOT_READ_FILE}\n{before}"
    return before, after


def pgbench_run(plan: Plan, point: Point, repeat: int = 1, *, start_at: int | None = None,
                with_pgstats: bool = False) -> Manifest:
    """One run of one point: pgbench with the point's clients, jobs, workload and synchronous_commit (PGOPTIONS);
    with ``run.load_pods`` > 1, one Indexed Job of that many pgbench pods (``load_job``). ``start_at`` (epoch s):
    pgbench held until then, after the dataset reset (the tenants' common start); ``with_pgstats``: the primary's
    WAL, checkpoint and backend-write counters read at the window's edges (``pgstats``)."""
    if plan.run.load_pods > 1:
        return load_job(plan, point, repeat)
    k8s = target_of(plan)
    seconds = plan.run.measured_seconds
    if seconds is not None:
        seconds += plan.run.warmup
    args = run_args(Path(), point.workload, point.clients, point.jobs, plan.run, Path(SCRIPTS_DIR),
                    seconds=seconds, transactions=plan.run.transactions, log_prefix=Path(RESULTS_DIR) / "pgbench",
                    rate=point.rate)
    args[0] = "pgbench"
    reset = reset_script(plan)
    if parameters := instance_parameters(plan, point):  # in force before anything is measured, or no run
        reset = f"{settings_script(parameters)}if [ \"$rc\" = 0 ]; then\n{reset}fi\n"
    load = (f"{shlex.join(args)} > pgbench.out 2> pgbench.err || rc=$?" if point.scenario is None else
            segments_script(args, seconds or 1.0))
    before, after = window_reads_of(plan, point, with_pgstats)  # pg_stat_statements if loaded, the counters
    wait = start_wait_script(start_at) if start_at is not None else ""
    script = (f"set -eu\ncd {RESULTS_DIR}\nrc=0\n{reset}{wait}{before}"
              f"if [ \"$rc\" = 0 ]; then {load}; fi\n{after}"
              f"{ship_results()}\nexit $rc")
    volumes, mounts = _scripts_volume(plan)
    pod = _client_pod(k8s, k8s.clients.image or k8s.image, script, env=_pg_env(k8s, point.synchronous_commit),
                      volumes=volumes, mounts=mounts)
    name = f"{k8s.cluster_name}-run-{point.index:04d}-{repeat}"
    notes = {"pglab/point": point.label(), "pglab/point-key": point.key, "pglab/repeat": str(repeat)}
    if point.scenario is not None:
        notes["pglab/scenario"] = point.scenario.label
    return Manifest(f"50-run-{point.index:04d}-{repeat}-job.yaml", _job(k8s, name, "pgbench-run", pod, notes))


# ------------------------------------------------------------------ distributed load (run.load_pods)
LOAD_LABEL = "pglab/load-job"  # the load pods' own label: their anti-affinity to each other
LOAD_INDEX = "JOB_COMPLETION_INDEX"  # the Indexed Job's pod number, set by the Job controller
def split(total: int, parts: int) -> list[int]:
    """``total`` over ``parts`` as evenly as possible, the larger shares first (5 over 2: 3 + 2)."""
    q, r = divmod(total, parts)
    return [q + (i < r) for i in range(parts)]


def load_shares(plan: Plan, point: Point) -> list[tuple[int, int]]:
    """(clients, threads) of each load pod: the point's clients split, its threads likewise (at least one per pod,
    never more than the pod's clients)."""
    n = plan.run.load_pods
    return [(c, max(1, min(c, j))) for c, j in zip(split(point.clients, n), split(point.jobs, n), strict=True)]


def job_timeout_s(plan: Plan) -> float:
    """How long pglab (and run-jobs.sh) give a run's Job: 3 x (warm-up + duration) + 10 min."""
    seconds = (plan.run.measured_seconds or 3600) + plan.run.warmup
    return max(600.0, 3 * seconds + 600)


def load_job(plan: Plan, point: Point, repeat: int = 1) -> Manifest:
    """One run of one point over ``run.load_pods`` pgbench pods: an Indexed Job (one pod per index, started
    together, preferring distinct nodes), each pod running its share of the clients and threads with its own -l
    logs and progress, shipped from its own log. Pod 0 alone waits for the point's parameters and resets the
    dataset; a barrier in the database (``barrier_script``) starts every pgbench after that, together. Where
    pg_stat_statements is loaded, pod 0 reads it before its barrier and once every pod's pgbench ended
    (``end_barrier_script``)."""
    k8s = target_of(plan)
    n = plan.run.load_pods
    seconds = plan.run.measured_seconds
    if seconds is not None:
        seconds += plan.run.warmup
    cases = []
    reads = window_reads_of(plan, point)  # pod 0's: before its barrier, after every pod's end ("" when none)
    reading = statements.wanted(plan, instance_parameters(plan, point), point)
    # pod 0's wait for the others' end: they run the same -T from the same barrier; -t runs end as they do
    end_wait = 60.0 if seconds is not None else job_timeout_s(plan)
    for index, (clients, jobs) in enumerate(load_shares(plan, point)):
        rate = point.rate or plan.run.rate  # the pods share the rate as they share the clients
        args = run_args(Path(), point.workload, clients, jobs, plan.run, Path(SCRIPTS_DIR), seconds=seconds,
                        transactions=plan.run.transactions, log_prefix=Path(RESULTS_DIR) / "pgbench",
                        rate=rate * clients / point.clients if rate else None)
        args[0] = "pgbench"
        prepare = ""
        if index == 0:
            prepare = reset_script(plan)
            if parameters := instance_parameters(plan, point):
                prepare = f"{settings_script(parameters)}if [ \"$rc\" = 0 ]; then\n{prepare}fi\n"
        load = f"{shlex.join(args)} > pgbench.out 2> pgbench.err || rc=$?"
        before = reads[0] if index == 0 else ""
        after = ending = ""
        if reading:  # pod 0 reads pg_stat_statements: before any pod can start, after every pod's pgbench ended
            ending = end_barrier_script(index, n, end_wait)
            if index == 0:
                after = f'if [ "$ended" = 1 ]; then\n{reads[1]}fi\n'
        cases.append(f"{index})\n{prepare}{before}{barrier_script(index, n, job_timeout_s(plan))}"
                     f"if [ \"$rc\" = 0 ]; then {load}; fi\n{ending}{after};;")
    script = (f"set -eu\ncd {RESULTS_DIR}\nrc=0\ncase \"${LOAD_INDEX}\" in\n" + "\n".join(cases) +
              f"\n*) echo \"pglab: no share for load pod ${LOAD_INDEX}\" >&2; rc=2 ;;\nesac\n"
              f"{ship_results()}\nexit $rc")
    volumes, mounts = _scripts_volume(plan)
    env = [*_pg_env(k8s, point.synchronous_commit),
           {"name": "PGLAB_JOB_UID", "valueFrom": {"fieldRef": {
               "fieldPath": "metadata.labels['batch.kubernetes.io/controller-uid']"}}}]
    pod = _client_pod(k8s, k8s.clients.image or k8s.image, script, env=env, volumes=volumes, mounts=mounts)
    name = f"{k8s.cluster_name}-run-{point.index:04d}-{repeat}"
    apart = {"weight": 50, "podAffinityTerm": {"labelSelector": {"matchLabels": {LOAD_LABEL: name}},
                                               "topologyKey": "kubernetes.io/hostname"}}
    anti = pod.setdefault("affinity", {}).setdefault("podAntiAffinity", {})
    anti.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(apart)
    notes = {"pglab/point": point.label(), "pglab/point-key": point.key, "pglab/repeat": str(repeat),
             "pglab/load-pods": str(n),
             "pglab/load-shares": " ".join(f"{c}c/{j}j" for c, j in load_shares(plan, point))}
    body = _job(k8s, name, "pgbench-run", pod, notes)
    body["spec"]["template"]["metadata"]["labels"][LOAD_LABEL] = name
    body["spec"].update({"completionMode": "Indexed", "completions": n, "parallelism": n})
    return Manifest(f"50-run-{point.index:04d}-{repeat}-job.yaml", body)


def witness_job(plan: Plan, point: Point, repeat: int = 1) -> Manifest:
    """The witness writer of a failover run, a Job beside the run's pgbench Job (same image, secret, level)."""
    k8s = target_of(plan)
    seconds = (plan.run.measured_seconds or 0.0) + plan.run.warmup
    pod = _client_pod(k8s, k8s.clients.image or k8s.image, witness_script(plan, seconds),
                      env=_pg_env(k8s, point.synchronous_commit))
    pod["containers"][0].pop("resources", None)  # the client's budget is pgbench's
    name = f"{k8s.cluster_name}-witness-{point.index:04d}-{repeat}"
    notes = {"pglab/point": point.label(), "pglab/point-key": point.key, "pglab/repeat": str(repeat)}
    return Manifest(f"50-witness-{point.index:04d}-{repeat}-job.yaml", _job(k8s, name, "witness", pod, notes))


# ------------------------------------------------------------------ access
def rbac(plan: Plan) -> list[Manifest]:
    """The least pglab needs in the benchmark namespace: a ServiceAccount, a Role and its RoleBinding.

    Clusters (create, watch, patch between CPU steps and parameter points and to fence a standby, delete; their
    status patched to request a switchover, as ``kubectl cnpg promote`` does); Jobs, PVCs and the disk
    sampler's DaemonSet it creates and deletes; pods to follow Jobs, read their logs (results, the nodes'
    /proc/diskstats), see why one cannot start, and delete the primary (failover scenario); the long-lived client
    pods it creates, runs each run's script in (pods/exec: create, and get, which older API servers check for a
    WebSocket exec) and deletes; ConfigMaps for custom scripts. No secrets: pgbench gets credentials from the
    kubelet.
    """
    k8s = target_of(plan)
    name = f"{k8s.cluster_name}-pglab"
    rules = [
        {"apiGroups": ["postgresql.cnpg.io"], "resources": ["clusters"],
         "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
        {"apiGroups": ["postgresql.cnpg.io"], "resources": ["clusters/status"], "verbs": ["patch"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "create", "delete"]},
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get", "create", "delete"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},  # its own: one made beforehand is used
        {"apiGroups": [""], "resources": ["persistentvolumeclaims", "configmaps"],
         "verbs": ["get", "list", "create", "delete"]},
    ]
    if k8s.wal_archive is not None:  # the backup scenario's Backups; the ObjectStore and its Secret's copy
        rules += [{"apiGroups": ["postgresql.cnpg.io"], "resources": ["backups"],
                   "verbs": ["get", "list", "create", "delete"]},
                  {"apiGroups": ["barmancloud.cnpg.io"], "resources": ["objectstores"],
                   "verbs": ["get", "create", "delete"]},
                  {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "delete"]}]
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(k8s, name, "rbac")}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(k8s, name, "rbac"),
            "rules": rules}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": _meta(k8s, name, "rbac"),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": k8s.namespace}]}
    return [Manifest("01-serviceaccount.yaml", sa), Manifest("02-role.yaml", role),
            Manifest("03-rolebinding.yaml", binding)]


def namespace(plan: Plan) -> Manifest:
    k8s = target_of(plan)
    meta = {"name": k8s.namespace, "labels": dict(MANAGED_BY)}
    return Manifest("00-namespace.yaml", {"apiVersion": "v1", "kind": "Namespace", "metadata": meta})


def render(plan: Plan, base_dir: Path) -> list[Manifest]:
    """Every manifest of the plan, in apply order: access, database, disk sampler (unless node-exporter is read, or
    the probes are off), storage phase, then one Job per run."""
    k8s = target_of(plan)
    out = [namespace(plan), *rbac(plan), *object_store(plan), *monitoring_queries(plan),
           Manifest("10-cluster.yaml", cluster(plan))]  # as the first point needs it
    if k8s.node_exporter is None and k8s.prometheus is None and plan.probes.enabled:
        out.append(disk_sampler(plan))  # else the disk counters come from node-exporter, or are not asked for
    out += fio_manifests(plan)
    scripts = scripts_configmap(plan, base_dir)
    if scripts is not None:
        out.append(scripts)
    out.append(pgbench_init(plan))
    for point in expand(plan, cores=client_cores(k8s)):
        for repeat in range(1, plan.run.max_repeats + 1):
            if point.scenario is not None and point.scenario.witness:
                out.append(witness_job(plan, point, repeat))  # started just before the run's Job, beside it
            out.append(pgbench_run(plan, point, repeat))
    return out


class _Dumper(yaml.SafeDumper):
    """Shell scripts as literal blocks (``|``), readable in review, instead of folded quoted strings."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def to_yaml(body: dict[str, Any]) -> str:
    return yaml.dump(body, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)
