"""Plan → Kubernetes manifests: the CloudNativePG Cluster, fio and pgbench Jobs, and the RBAC pglab needs.

Pure functions of the plan (no cluster, no client library): ``pglab k8s render`` writes them for review or GitOps,
and the orchestration applies the very same objects, so what was reviewed (and strictly decoded by cnpg-check) is
what runs. Results leave the pods through their logs (a base64 tarball between markers), so pglab needs no exec
permission to bring back fio's per-second logs or pgbench's output.
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
from pglab.scenarios import witness
from pglab.workloads import fio
from pglab.workloads.pgbench import init_args, run_args

CNPG_API = "postgresql.cnpg.io/v1"
BARMAN_API = "barmancloud.cnpg.io/v1"
BARMAN_PLUGIN = "barman-cloud.cloudnative-pg.io"  # CloudNativePG's Barman Cloud plugin, as it registers itself
COPY_FROM = "pglab/copy-from"  # a Secret pglab fills, when it creates it, from this namespace/name
MANAGED_BY = {"app.kubernetes.io/managed-by": "pglab"}
RESULTS_DIR = "/results"
SCRIPTS_DIR = "/scripts"
VOLUME_DIR = "/volume"
BEGIN_MARK = "----- pglab results begin -----"
END_MARK = "----- pglab results end -----"
GIB = 1 << 30
METRICS_QUERIES_TTL = "1s"  # below pglab's exporter read interval (2 s)
DATABASE = "app"  # the database (and owner) the Cluster bootstraps; pgbench gets it from the app secret


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


def _first_point(plan: Plan) -> Point:
    return expand(plan, cores=client_cores(target_of(plan)))[0]


def instance_resources(plan: Plan, point: Point | None = None) -> dict[str, Any]:
    """``.spec.resources`` for a point: its CPU step (else the target's CPU), the target's memory; requests equal
    limits, so the instances keep Guaranteed QoS at every step."""
    k8s = target_of(plan)
    point = point or _first_point(plan)
    cpu = cpu_quantity(point.cpus) if point.cpus is not None else k8s.resources.cpu
    amounts = {"cpu": cpu, "memory": k8s.resources.memory}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def instance_parameters(plan: Plan, point: Point | None = None) -> dict[str, str]:
    """``.spec.postgresql.parameters`` for a point: the plan's parameters with the point's own on top."""
    point = point or _first_point(plan)
    return {k: param_value(v) for k, v in {**plan.postgres.parameters, **point.parameters}.items()}


# ------------------------------------------------------------------ the database
def cluster(plan: Plan, point: Point | None = None) -> dict[str, Any]:
    """The CloudNativePG Cluster: instances, image, volumes, Guaranteed QoS, placement, synchronous replication.

    Created as the given point (default: the plan's first) needs it: its CPU step and parameters; the sweep
    patches both between points (``cluster_patch``)."""
    point = point or _first_point(plan)
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
        "bootstrap": {"initdb": {"database": DATABASE, "owner": DATABASE}},
        "storage": _storage(k8s.storage),
        "resources": instance_resources(plan, point),  # requests = limits: Guaranteed QoS
        "affinity": affinity,
        # CloudNativePG 1.28+ caches its monitoring queries' results (30 s by default): pglab reads the exporter
        # every 2 s and takes window deltas between reads, so each read must run the queries again
        "monitoring": {"metricsQueriesTTL": METRICS_QUERIES_TTL},
    }
    if k8s.wal_storage is not None:
        spec["walStorage"] = _storage(k8s.wal_storage)
    if k8s.wal_archive is not None:  # the plugin archives WAL continuously (and takes the backups) to the store
        spec["plugins"] = [{"name": BARMAN_PLUGIN, "isWALArchiver": True,
                            "parameters": {"barmanObjectName": object_store_name(k8s)}}]
    meta = _meta(k8s, k8s.cluster_name, "database", annotations={"pglab/plan": plan.name})
    return {"apiVersion": CNPG_API, "kind": "Cluster", "metadata": meta, "spec": spec}


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


STORE_MARK = "pglab-store"  # the listing Job's line: "<mark> <backup objects> <bytes> <WAL objects> <bytes>"
_LIST_STORE = f"""
import os, boto3
from urllib.parse import urlparse
u = urlparse(os.environ["DESTINATION"])
base = "/".join(p for p in (u.path.strip("/"), os.environ["SERVER"]) if p)
s3 = boto3.client("s3", endpoint_url=os.environ.get("ENDPOINT") or None)
def total(prefix):
    n = b = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=u.netloc, Prefix=prefix):
        for o in page.get("Contents", []):
            n, b = n + 1, b + o["Size"]
    return n, b
print("{STORE_MARK}", *total(base + "/base/" + os.environ["BACKUP_ID"] + "/"), *total(base + "/wals/"))
"""


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
           "containers": [{"name": "main", "image": image, "command": ["python3", "-c", _LIST_STORE], "env": env,
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


def _ship_results() -> str:
    """Shell that prints RESULTS_DIR as a base64 tarball between markers: pglab reads it from the pod's log."""
    return (f"echo '{BEGIN_MARK}'; tar -C {RESULTS_DIR} -czf - . | base64; echo '{END_MARK}'")


# ------------------------------------------------------------------ disk figures of the database nodes
DISK_SAMPLER = "disk-sampler"
DISKSTATS_MARK = "pglab-diskstats"  # a block of the sampler's log: "<mark> <epoch> <node> <boot id>", the file, end


def _unprivileged() -> dict[str, Any]:
    """The restricted Pod Security Standard, and then some: nobody, read-only root, no capability."""
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "runAsUser": 65534, "runAsGroup": 65534, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}


def _tiny() -> dict[str, Any]:
    return {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "32Mi"}}


DISK_SAMPLE_S = 0.2  # a window's edges fall inside an interval, pro-rated as if its I/O were even: with 1 s
# intervals a 10 s window of the multi-node lab was 3.4 % off the writes the kernel counted on the node's disk


def disk_sampler_script() -> str:
    """Every DISK_SAMPLE_S: the node's epoch, its name, its kernel's boot id, /proc/diskstats, an end line, printed
    at once (a block cut by the log's end is recognised). /proc/diskstats is not namespaced: an unprivileged
    container reads the host's; the boot id tells nodes that are containers on one kernel (kind, k3d) apart from
    real ones."""
    return "\n".join([
        "trap 'exit 0' TERM",
        "k=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo -)",
        "while :; do",
        "  t=$(date +%s.%N); s=$(cat /proc/diskstats)",
        f'  printf \'%s\\n\' "{DISKSTATS_MARK} $t $NODE_NAME $k" "$s" "{DISKSTATS_MARK} end"',
        f"  sleep {DISK_SAMPLE_S:g}",
        "done",
    ])


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
VOLUME_MARK = "pglab-volume"  # the probe's line: "<mark> <claim> <major:minor> <fstype> <source> <boot id>"
VOLUME_PROBE_DEADLINE_S = 120  # a probe pod that cannot start (a ReadWriteOncePod claim, a full node) gives up


def volume_probe_script(root: str = "/volumes") -> str:
    """For each claim mounted under ``root``: the device number of its mount, its filesystem type and source,
    from the pod's own mountinfo (fields 3 and 5, then what follows " - "). A second mount of a volume shares its
    superblock with the instance's mount, so this is the device number PostgreSQL's files have. The kernel's boot
    id tells nodes that are containers of one host (kind, k3d) apart from real ones."""
    return "\n".join([
        "k=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo -)",
        f"for d in {root}/*; do",
        "  while read -r _id _parent mm _root mp rest; do",
        '    [ "$mp" = "$d" ] || continue',
        '    set -- ${rest#* - }',
        f'    echo "{VOLUME_MARK} ${{d##*/}} $mm $1 $2 $k"',
        "  done < /proc/self/mountinfo",
        "done",
    ])


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


VOLUME_MOUNT_FILE = "volume-mount.txt"  # the fio Job's /proc/self/mountinfo line of its volume


def fio_script(plan: Plan) -> str:
    """fio's jobs (the storage issue's profiles, same options as on a local lab), one after the other."""
    assert plan.storage is not None
    size = plan.storage.size.bytes
    k8s = target_of(plan)
    missing = (f"pglab: the image {k8s.clients.fio_image} has no fio; name an image with fio in "
               "target.kubernetes.clients.fio_image (tools/images/Containerfile builds one)")
    lines = ["set -eu", f"command -v fio >/dev/null || {{ echo {shlex.quote(missing)} >&2; exit 3; }}",
             "fio --version > " + RESULTS_DIR + "/fio-version.txt",
             # the volume's mount as the node's kernel gives it (device major:minor, filesystem, source)
             f"grep -F ' {VOLUME_DIR} ' /proc/self/mountinfo > {RESULTS_DIR}/{VOLUME_MOUNT_FILE} || true"]
    for profile in plan.storage.profiles:
        for job in fio.jobs_for(profile):
            cmd = fio._command("fio", job, Path(VOLUME_DIR), Path(RESULTS_DIR), plan.storage.runtime, size, 0.0,
                               builtin=True)
            lines.append(shlex.join(cmd))
    lines.append(f"rm -f {VOLUME_DIR}/{fio.DATA_FILE}")
    lines.append(_ship_results())
    return "\n".join(lines)


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
    args = ["pgbench", *init_args(Path(), plan.dataset)[1:]]
    script = (f"set -eu\n{shlex.join(args)} > {RESULTS_DIR}/init.log 2>&1 || rc=$?\ncat {RESULTS_DIR}/init.log\n"
              f"{_ship_results()}\nexit ${{rc:-0}}")
    pod = _client_pod(k8s, k8s.clients.image or k8s.image, script, env=_pg_env(k8s))
    return Manifest("40-pgbench-init-job.yaml", _job(k8s, f"{k8s.cluster_name}-pgbench-init", "pgbench-init", pod))


RESET_SQL = ("TRUNCATE pgbench_history",
             "VACUUM (ANALYZE) pgbench_branches, pgbench_tellers, pgbench_accounts, pgbench_history")
CHECKPOINT_REFUSED = "pglab: CHECKPOINT failed (CloudNativePG's app role lacks pg_checkpoint): dirty buffers stay"


def _reset_script(plan: Plan) -> str:
    """The dataset reset before each run, as on a local lab: 'vacuum' (history truncated, VACUUM ANALYZE, then a
    CHECKPOINT when the role may) or 'reinit' (pgbench -i again). Its output goes to reset.log; a failure fails
    the run (rc set, pgbench not started)."""
    ds = plan.dataset
    if ds.reset == "reinit":
        return f"{shlex.join(['pgbench', *init_args(Path(), ds)[1:]])} > reset.log 2>&1 || rc=$?\n"
    psql = ["psql", "-X", "-v", "ON_ERROR_STOP=1"]
    for stmt in RESET_SQL:
        psql += ["-c", stmt]
    return (f"{shlex.join(psql)} > reset.log 2>&1 || rc=$?\n"
            f"psql -X -c CHECKPOINT >> reset.log 2>&1 || echo {shlex.quote(CHECKPOINT_REFUSED)} >> reset.log\n")


SETTINGS_FILE = "settings.txt"
SETTINGS_WAIT_S = 300  # how long a run's Job waits for its parameters to be in force on the primary
_MEMORY_UNITS = ("B", "kB", "MB", "GB", "TB")
_TIME_UNITS = ("us", "ms", "s", "min", "h", "d")


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def settings_sql(parameters: dict[str, str]) -> str:
    """One row per parameter, ``name|setting|unit|pending_restart|ok``, where PostgreSQL itself says whether the
    value in force is the one asked for: booleans by meaning, sizes through pg_size_bytes, durations as intervals,
    bare numbers in the setting's own unit, anything else as text (case aside)."""
    wanted = ", ".join(f"({_sql_text(k)}, {_sql_text(v)})" for k, v in sorted(parameters.items()))
    # pg_size_bytes spells a byte "bytes" (PostgreSQL 15 refuses "B", which GUCs accept)
    one_unit = "(CASE WHEN s.unit = 'B' THEN '1 bytes' WHEN s.unit ~ '^[0-9]' THEN s.unit ELSE '1' || s.unit END)"
    want_size = "regexp_replace(w.want, '([0-9 ])B$', '\\1 bytes')"
    memory = ", ".join(_sql_text(u) for u in _MEMORY_UNITS)
    times = ", ".join(_sql_text(u) for u in _TIME_UNITS)
    ok = (
        "CASE WHEN s.name IS NULL THEN false "
        "WHEN s.vartype = 'bool' THEN s.setting = CASE WHEN lower(w.want) IN ('on', 'true', 'yes', '1') THEN 'on' "
        "WHEN lower(w.want) IN ('off', 'false', 'no', '0') THEN 'off' END "
        "WHEN s.vartype IN ('integer', 'real') AND w.want ~ '^\\s*-?[0-9.]+([eE][-+]?[0-9]+)?\\s*$' "
        "THEN abs(s.setting::numeric - w.want::numeric) < (CASE s.vartype WHEN 'integer' THEN 0.5 ELSE 1e-9 END) "
        # each conversion's WHEN also tests the wanted text alone: folded to false for a single parameter (its
        # VALUES row becomes constants), the branch is dropped before PostgreSQL would try pg_size_bytes('off')
        f"WHEN w.want ~ '^\\s*[0-9.]+\\s*({'|'.join(_MEMORY_UNITS)})\\s*$' "
        f"AND regexp_replace(s.unit, '^[0-9]+', '') IN ({memory}) THEN abs(s.setting::numeric * "
        f"pg_size_bytes({one_unit}) - pg_size_bytes({want_size})) < pg_size_bytes({one_unit}) "
        f"WHEN w.want ~ '^\\s*[0-9.]+\\s*({'|'.join(_TIME_UNITS)})\\s*$' AND s.unit IN ({times}) "
        "THEN abs(extract(epoch FROM (s.setting || ' ' || s.unit)::interval) - "
        f"extract(epoch FROM w.want::interval)) < extract(epoch FROM ('1 ' || s.unit)::interval) "
        "ELSE lower(s.setting) = lower(w.want) END")
    return (f"SELECT w.name, s.setting, coalesce(s.unit, ''), s.pending_restart, {ok} "
            f"FROM (VALUES {wanted}) AS w(name, want) LEFT JOIN pg_settings s USING (name) ORDER BY w.name")


def _settings_script(parameters: dict[str, str]) -> str:
    """Wait (at most SETTINGS_WAIT_S) until the primary runs with the point's parameters and none waits for a
    restart, retrying through a rolling restart; then ship what was found. Not applied in time: no pgbench, exit 3
    (the sweep names the parameter from settings.txt)."""
    if not parameters:
        return ""
    query = shlex.join(["psql", "-XAtq", "-F", "|", "-c", settings_sql(parameters)])
    tries = SETTINGS_WAIT_S // 2
    return (f"n=0\nuntil {query} > {SETTINGS_FILE} 2> settings.err && ! grep -qv '|f|t$' {SETTINGS_FILE}; do\n"
            f"  n=$((n+1)); [ \"$n\" -ge {tries} ] && break; sleep 2\ndone\n"
            f"if ! grep -q . {SETTINGS_FILE} || grep -qv '|f|t$' {SETTINGS_FILE}; then rc=3; fi\n")


def pgbench_run(plan: Plan, point: Point, repeat: int = 1) -> Manifest:
    """One run of one point: pgbench with the point's clients, jobs, workload and synchronous_commit (PGOPTIONS);
    with ``run.load_pods`` > 1, one Indexed Job of that many pgbench pods (``load_job``)."""
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
    reset = _reset_script(plan)
    if parameters := instance_parameters(plan, point):  # in force before anything is measured, or no run
        reset = f"{_settings_script(parameters)}if [ \"$rc\" = 0 ]; then\n{reset}fi\n"
    load = (f"{shlex.join(args)} > pgbench.out 2> pgbench.err || rc=$?" if point.scenario is None else
            _segments_script(args, seconds or 1.0))
    script = (f"set -eu\ncd {RESULTS_DIR}\nrc=0\n{reset}"
              f"if [ \"$rc\" = 0 ]; then {load}; fi\n"
              f"{_ship_results()}\nexit $rc")
    volumes, mounts = _scripts_volume(plan)
    pod = _client_pod(k8s, k8s.clients.image or k8s.image, script, env=_pg_env(k8s, point.synchronous_commit),
                      volumes=volumes, mounts=mounts)
    name = f"{k8s.cluster_name}-run-{point.index:04d}-{repeat}"
    notes = {"pglab/point": point.label(), "pglab/point-key": point.key, "pglab/repeat": str(repeat)}
    if point.scenario is not None:
        notes["pglab/scenario"] = point.scenario.label
    return Manifest(f"50-run-{point.index:04d}-{repeat}-job.yaml", _job(k8s, name, "pgbench-run", pod, notes))


# ------------------------------------------------------------------ distributed load (run.load_pods)
LOAD_DIR = "load-{index}"  # each load pod's shipped files, under the run's folder
LOAD_LABEL = "pglab/load-job"  # the load pods' own label: their anti-affinity to each other
LOAD_INDEX = "JOB_COMPLETION_INDEX"  # the Indexed Job's pod number, set by the Job controller
LOAD_BARRIER_TABLE = "pglab_load_barrier"  # where the load pods meet before pgbench starts
LOAD_BARRIER_POLL_S = 0.1  # how often a load pod looks whether all have arrived: the start skew's bound
LOAD_FAILED_BARRIER = 4  # a load pod's exit code when the others never arrived


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


def _barrier_script(index: int, pods: int, deadline_s: float) -> str:
    """The load pods start pgbench together: pod 0 (after the settings wait and the dataset reset) and every
    other pod enter a row into a table of the benchmark database, then each waits until all ``pods`` rows of this
    Job (its uid) are there, looking every LOAD_BARRIER_POLL_S. A pod not joined by all within ``deadline_s`` (pod
    0 failed, a pod cannot be scheduled) gives up with LOAD_FAILED_BARRIER; the Job's backoffLimit 0 ends the
    others."""
    table, fail = LOAD_BARRIER_TABLE, LOAD_FAILED_BARRIER
    lines = [f"deadline=$(( $(date +%s) + {round(deadline_s)} ))"]
    if index == 0:  # the table is created by pod 0 only: concurrent CREATE TABLE IF NOT EXISTS can collide
        create = shlex.quote(f"CREATE TABLE IF NOT EXISTS {table} (job text, pod int)")
        lines.append(f'if [ "$rc" = 0 ]; then psql -XAtq -v ON_ERROR_STOP=1 -c {create} >> barrier.log 2>&1 '
                     "|| rc=$?; fi")
    lines += [
        f'if [ "$rc" = 0 ]; then until psql -XAtq -v ON_ERROR_STOP=1 -c "INSERT INTO {table} VALUES '
        f"('$PGLAB_JOB_UID', {index})\" >> barrier.log 2>&1; do",  # pod 0 has not created the table yet
        f'  [ "$(date +%s)" -lt "$deadline" ] || {{ rc={fail}; break; }}; sleep 0.5',
        "done; fi",
        f'if [ "$rc" = 0 ]; then until [ "$(psql -XAtq -c "SELECT count(*) FROM {table} WHERE job = '
        f"'$PGLAB_JOB_UID'\" 2>> barrier.log)\" = {pods} ]; do",
        f'  [ "$(date +%s)" -lt "$deadline" ] || {{ rc={fail}; break; }}; sleep {LOAD_BARRIER_POLL_S:g}',
        "done; fi",
        f'[ "$rc" != {fail} ] || echo "pglab: load pod {index}: the {pods} load pods did not all start within '
        f'{round(deadline_s)} s (see the other pods of this Job)" >&2',
    ]
    return "\n".join(lines) + "\n"


def load_job(plan: Plan, point: Point, repeat: int = 1) -> Manifest:
    """One run of one point over ``run.load_pods`` pgbench pods: an Indexed Job (one pod per index, started
    together, preferring distinct nodes), each pod running its share of the clients and threads with its own -l
    logs and progress, shipped from its own log. Pod 0 alone waits for the point's parameters and resets the
    dataset; a barrier in the database (``_barrier_script``) starts every pgbench after that, together."""
    k8s = target_of(plan)
    n = plan.run.load_pods
    seconds = plan.run.measured_seconds
    if seconds is not None:
        seconds += plan.run.warmup
    cases = []
    for index, (clients, jobs) in enumerate(load_shares(plan, point)):
        rate = point.rate or plan.run.rate  # the pods share the rate as they share the clients
        args = run_args(Path(), point.workload, clients, jobs, plan.run, Path(SCRIPTS_DIR), seconds=seconds,
                        transactions=plan.run.transactions, log_prefix=Path(RESULTS_DIR) / "pgbench",
                        rate=rate * clients / point.clients if rate else None)
        args[0] = "pgbench"
        prepare = ""
        if index == 0:
            prepare = _reset_script(plan)
            if parameters := instance_parameters(plan, point):
                prepare = f"{_settings_script(parameters)}if [ \"$rc\" = 0 ]; then\n{prepare}fi\n"
        load = f"{shlex.join(args)} > pgbench.out 2> pgbench.err || rc=$?"
        cases.append(f"{index})\n{prepare}{_barrier_script(index, n, job_timeout_s(plan))}"
                     f"if [ \"$rc\" = 0 ]; then {load}; fi\n;;")
    script = (f"set -eu\ncd {RESULTS_DIR}\nrc=0\ncase \"${LOAD_INDEX}\" in\n" + "\n".join(cases) +
              f"\n*) echo \"pglab: no share for load pod ${LOAD_INDEX}\" >&2; rc=2 ;;\nesac\n"
              f"{_ship_results()}\nexit $rc")
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


START_MARK = "pglab: pgbench start"  # the run Job's stdout, with the pod's epoch: the scenario's clock starts there
WITNESS_MARK = "pglab-witness"  # every line of the witness Job's stdout that pglab reads
WITNESS_TABLE = witness.TABLE  # the local witness's table, same columns
# pgbench's dbname argument through a fault, a libpq connection string (PGDATABASE and the rest still apply)
PGBENCH_THROUGH_FAULTS = ("connect_timeout=5 keepalives_idle=2 keepalives_interval=1 keepalives_count=3 "
                          "tcp_user_timeout=5000")
WITNESS_MARGIN_S = 10  # the witness writes this much longer than pgbench (its pod may start a little later)
WITNESS_READ_TRIES = 90  # read-back tries, 2 s apart: the new primary may still be on its way
WITNESS_ATTEMPT_S = 10  # one attempt's deadline: a COMMIT can wait for a synchronous standby for ever (below)


def _segments_script(args: list[str], seconds: float) -> str:
    """pgbench through a fault: started again (new pid, so new -l files) whenever the failover ends it, until the
    run's time is up, as the local runner does. Segment n > 1 writes pgbench-n.out/.err. The Job succeeds when one
    segment at least reported its transactions."""
    at = args.index("-T")
    # the server may vanish without a word (its node lost: no RST, no FIN), a client's query sent and acknowledged:
    # with keepalives after 2 s of silence and a deadline on what goes unanswered, each pgbench client errs out
    # within seconds and the next segment connects to the new primary, instead of waiting for ever (libpq's
    # keepalives otherwise start after the kernel's 2 h); a server that is only slow still answers keepalives
    cmd = shlex.join(args[:at + 1]) + ' "$left" ' + shlex.join([*args[at + 2:], PGBENCH_THROUGH_FAULTS])
    return (f'echo "{START_MARK} $(date +%s.%N)"\n'
            f"end=$(( $(date +%s) + {max(1, round(seconds))} )); n=1; last=0\n"
            "while :; do\n"
            '  left=$(( end - $(date +%s) )); [ "$n" -gt 1 ] && [ "$left" -lt 1 ] && break; [ "$left" -lt 1 ] && '
            "left=1\n"
            '  out=pgbench; [ "$n" -gt 1 ] && out=pgbench-$n\n'
            f'  {cmd} > "$out.out" 2> "$out.err" && last=0 || last=$?\n'
            '  n=$((n+1)); [ "$last" = 0 ] && break; sleep 1\n'
            "done\n"
            "grep -qs 'number of transactions actually processed' pgbench*.out || rc=$last")


def witness_script(plan: Plan, seconds: float) -> str:
    """The witness writer in a pod: the table emptied, then one id per short transaction through ``<cluster>-rw``
    for ``seconds``, each attempt one stdout line ``pglab-witness <acked|failed|in_doubt> id t_sent t_done server
    lsn error``; then the ids read back (retried until the new primary answers) between ``present`` lines.

    psql makes one session per attempt (BEGIN, INSERT … RETURNING the WAL position, COMMIT): its LSN line printed
    means the INSERT returned (the COMMIT was sent next); exit 2 is a lost connection, so a lost COMMIT is in doubt,
    anything else not acked failed — the local witness's rule (``witness.classify``). An attempt still going after
    WITNESS_ATTEMPT_S is ended (``timeout``): the connection's deadlines cannot see a server that is alive but waits,
    as a COMMIT does for a synchronous standby that is gone, which would hold the witness for ever; ended after its
    INSERT returned, it is in doubt (the COMMIT may have been done locally), else failed. The table's preparation
    and the read-back have the same deadline per try."""
    # every attempt has deadlines: a connect to the old primary's address, or a session whose server was killed,
    # would otherwise wait out TCP's retries (minutes) and hide when writes came back; keepalives as pgbench's
    # (PGBENCH_THROUGH_FAULTS) for a request its lost server had received; and a deadline for the whole attempt
    psql = (f"timeout -k 2 {WITNESS_ATTEMPT_S} psql -XAtq -v ON_ERROR_STOP=1 -d 'connect_timeout=3 "
            "tcp_user_timeout=3000 keepalives_idle=2 keepalives_interval=1 keepalives_count=3'")
    create = (f"CREATE TABLE IF NOT EXISTS {WITNESS_TABLE} (id bigint PRIMARY KEY, t_client double precision NOT "
              "NULL, t_server timestamptz NOT NULL DEFAULT clock_timestamp())")
    insert = (f"INSERT INTO {WITNESS_TABLE} (id, t_client) VALUES ($i, $t0) RETURNING "
              "pg_current_wal_insert_lsn()::text || ' ' || coalesce(host(inet_server_addr()) || ':' || "
              "inet_server_port(), '-')")
    w = WITNESS_MARK
    return "\n".join([
        "set -u", "cd " + RESULTS_DIR, "nl='", "'", "n=0",
        f"until {psql} -c {shlex.quote(create)} -c 'TRUNCATE {WITNESS_TABLE}' > prepare.log 2>&1; do",
        f'  n=$((n+1)); [ "$n" -ge 60 ] && {{ echo "{w} prepare-failed $(tail -n 1 prepare.log)"; exit 1; }}; sleep 1',
        "done",
        f"end=$(( $(date +%s) + {max(1, round(seconds)) + WITNESS_MARGIN_S} )); i=0",
        'while [ "$(date +%s)" -lt "$end" ]; do',
        "  i=$((i+1)); t0=$(date +%s.%N)",
        f'  out=$({psql} -c BEGIN -c "{insert}" -c COMMIT 2>&1); rc=$?',
        "  t1=$(date +%s.%N)",
        f'  [ "$rc" = 124 ] || [ "$rc" = 137 ] && out="$out${{nl}}no answer in {WITNESS_ATTEMPT_S} s"',
        '  first=${out%%"$nl"*}; lsn=-; srv=-; stage=insert',
        '  case "$first" in [0-9A-F]*/[0-9A-F]*" "*) lsn=${first%% *}; srv=${first#* }; stage=commit;; esac',
        '  err=; if [ "$rc" = 0 ] && [ "$stage" = commit ]; then what=acked',
        '  elif [ "$stage" = commit ] && { [ "$rc" = 2 ] || [ "$rc" = 124 ] || [ "$rc" = 137 ]; }; then what=in_doubt',
        "  else what=failed; fi",
        '  [ "$what" = acked ] || err=$(printf %s "$out" | tr -s "\\n\\t " "   ")  # psql\'s words, one line',
        f'  echo "{w} $what $i $t0 $t1 $srv $lsn $err"',
        '  if [ "$what" = acked ]; then sleep 0.01; else sleep 0.2; fi',
        "done",
        f'echo "{w} stopped $i"', "n=0",
        f"until {psql} -c 'SELECT id FROM {WITNESS_TABLE} ORDER BY id' > present.txt 2> read.err; do",
        f'  n=$((n+1)); [ "$n" -ge {WITNESS_READ_TRIES} ] && {{ echo "{w} read-failed $(tail -n 1 read.err)"; '
        "exit 1; }; sleep 2",
        "done",
        f"echo \"{w} walfile $({psql} -c 'SELECT pg_walfile_name(pg_current_wal_lsn())' 2>/dev/null || true)\"",
        f'echo "{w} present begin"; cat present.txt; echo "{w} present end"',
    ])


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
    /proc/diskstats), see why one cannot start, and delete the primary (failover scenario); ConfigMaps for custom
    scripts. No secrets: pgbench gets credentials from the kubelet.
    """
    k8s = target_of(plan)
    name = f"{k8s.cluster_name}-pglab"
    rules = [
        {"apiGroups": ["postgresql.cnpg.io"], "resources": ["clusters"],
         "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
        {"apiGroups": ["postgresql.cnpg.io"], "resources": ["clusters/status"], "verbs": ["patch"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "create", "delete"]},
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get", "create", "delete"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
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
    """Every manifest of the plan, in apply order: access, database, disk sampler (unless node-exporter is read),
    storage phase, then one Job per run."""
    k8s = target_of(plan)
    out = [namespace(plan), *rbac(plan), *object_store(plan),
           Manifest("10-cluster.yaml", cluster(plan))]  # as the first point needs it
    if k8s.node_exporter is None and k8s.prometheus is None:  # else the disk counters come from node-exporter
        out.append(disk_sampler(plan))
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


# ------------------------------------------------------------------ the rendered folder: cluster/, jobs/, run-jobs.sh
CLUSTER_DIR = "cluster"  # what makes the environment: applied at once, then waited for
JOBS_DIR = "jobs"  # what runs: never applied at once (every run would start together); run-jobs.sh, in order
RUN_JOBS = "run-jobs.sh"
RENDER_MARKER = ".pglab-render"  # the files of the render in a folder: a later render replaces exactly these
HEALTHY_PHASE = "Cluster in healthy state"  # CloudNativePG's status.phase (as the orchestration waits for it)
INSTANCE_PODS = "cnpg.io/podRole=instance"  # the Cluster's PostgreSQL pods, by the operator's own labels
_RUNNING_KINDS = ("Job", "PersistentVolumeClaim")


@dataclass(frozen=True)
class ClusterPatch:
    """The merge patch between two points whose Cluster differs, applied before the later point's first run."""

    filename: str
    body: dict[str, Any]
    what: str  # "CPU step cpus=2", "parameters work_mem=8MB", as the sweep says it
    cpus: float | None  # the CPU step every instance pod must carry once rolled out, None for parameters alone
    point_key: str  # the point it is applied for


@dataclass(frozen=True)
class Written:
    """What ``write`` put where: the environment, the Jobs (and their PVCs), the Cluster patches, the script."""

    cluster: list[Path]
    jobs: list[Path]
    patches: list[Path]
    script: Path


def cluster_change(plan: Plan, before: Point, point: Point) -> str | None:
    """What ``point`` changes in a Cluster made for ``before`` (a CPU step, parameters), None when nothing: the
    sweep's rule for patching between points (sweep._step_to)."""
    cpus = point.cpus if point.cpus != before.cpus else None
    was = instance_parameters(plan, before)
    changed = {k: v for k, v in instance_parameters(plan, point).items() if was.get(k) != v}
    if cpus is None and not changed:
        return None
    params = ", ".join(f"{k}={v}" for k, v in changed.items())
    if cpus is None:
        return f"parameters {params}"
    return f"CPU step cpus={cpus:g}" + (f" (with {params})" if params else "")


def job_sequence(plan: Plan, manifests: list[Manifest]) -> list[Manifest | ClusterPatch]:
    """What runs, in run order: the fio PVCs and Jobs, the dataset Job, each run's Jobs, with the Cluster's merge
    patch before the first run of a point whose Cluster differs from the last one's (as ``pglab run`` steps)."""
    points = {p.key: p for p in expand(plan, cores=client_cores(target_of(plan)))}
    current = _first_point(plan)  # the Cluster of cluster/ is made as the first point needs it
    out: list[Manifest | ClusterPatch] = []
    for m in manifests:
        if m.kind not in _RUNNING_KINDS:
            continue
        key = (m.body["metadata"].get("annotations") or {}).get("pglab/point-key")
        point = points.get(key) if key is not None else None
        if point is not None and (what := cluster_change(plan, current, point)) is not None:
            out.append(ClusterPatch(f"50-run-{point.index:04d}-0-cluster-patch.json", cluster_patch(plan, point),
                                    what, point.cpus if point.cpus != current.cpus else None, point.key))
            current = point
        out.append(m)
    return out


def _claims(job: Manifest) -> list[str]:
    return [v["persistentVolumeClaim"]["claimName"] for v in job.body["spec"]["template"]["spec"].get("volumes", [])
            if "persistentVolumeClaim" in v]


# run-jobs.sh's functions: plain POSIX sh, kubectl only (jsonpath for what is read back)
_RUN_JOBS_FUNCTIONS = r"""
say() { printf '%s run-jobs: %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '%s run-jobs: %s\n' "$(date +%H:%M:%S)" "$*" >&2; exit 1; }
k() { $KUBECTL -n "$NS" "$@"; }

apply() {  # $1: a file or folder of this render
  $KUBECTL apply -f "$HERE/$1" || die "kubectl apply -f $1 failed"
}

healthy() {  # the Cluster healthy with every instance ready; $1: millicores every instance pod must have (or empty)
  state=$(k get cluster "$CLUSTER" -o 'jsonpath={.status.phase}/{.status.readyInstances}' 2>/dev/null) || state=
  [ "$state" = "$HEALTHY/$INSTANCES" ] || return 1
  [ -z "$1" ] && return 0
  state="$state, instance pods not all at ${1}m CPU"
  pods='{range .items[*]}{.metadata.deletionTimestamp}|{.spec.containers[?(@.name=="postgres")].resources.requests.cpu}'
  pods="$pods"'|{.spec.containers[?(@.name=="postgres")].resources.limits.cpu}{"\n"}{end}'
  k get pods -l "cnpg.io/cluster=$CLUSTER,$INSTANCE_PODS" -o "jsonpath=$pods" 2>/dev/null |
    awk -F'|' -v want="$1" -v n="$INSTANCES" '
      function mc(q) { return q ~ /m$/ ? int(q + 0.5) : int(q * 1000 + 0.5) }
      $1 != "" { next }
      { live++ }
      $2 != "" && $3 != "" && mc($2) == want && mc($3) == want { ok++ }
      END { exit !(ok == n && live == n) }'
}

wait_cluster() {  # $1: what is waited for; $2: millicores every instance pod must have once rolled out (or empty)
  end=$(( $(date +%s) + CLUSTER_TIMEOUT_S ))
  until healthy "${2:-}"; do
    [ "$(date +%s)" -lt "$end" ] || die "$1: Cluster/$CLUSTER not '$HEALTHY' with $INSTANCES ready instances" \
      "after $CLUSTER_TIMEOUT_S s (last seen: ${state:-not readable}); see kubectl -n $NS describe cluster $CLUSTER"
    sleep "$POLL_S"
  done
  say "$1: Cluster/$CLUSTER is healthy"
}

patch_cluster() {  # $1: the merge patch file; $2: what it changes; $3: millicores after a CPU step (or empty)
  say "$2: patching Cluster/$CLUSTER with $1"
  k patch cluster "$CLUSTER" --type merge --patch-file "$HERE/$1" || die "$2: kubectl patch cluster $CLUSTER failed"
  wait_cluster "$2" "${3:-}"
}

wait_job() {  # $1: a Job's name: until its Complete condition; its Failed one, or the deadline, stops the script
  end=$(( $(date +%s) + JOB_TIMEOUT_S ))
  while :; do
    conds=$(k get job "$1" -o 'jsonpath={range .status.conditions[*]}{.type}={.status} {end}' 2>/dev/null) || conds=
    case " $conds " in
      *" Complete=True "*) say "Job/$1 complete"; return 0 ;;
      *" Failed=True "*) die "Job/$1 failed; see kubectl -n $NS logs job/$1" ;;
    esac
    [ "$(date +%s)" -lt "$end" ] || die "Job/$1 not complete after $JOB_TIMEOUT_S s; see kubectl -n $NS describe job $1"
    sleep "$POLL_S"
  done
}

delete_pvc() {  # a measured fio volume: its space back before the database phase, as pglab run does
  k delete pvc "$1" --wait=false || say "could not delete PersistentVolumeClaim/$1 (kubectl -n $NS delete pvc $1)"
}
"""


def run_jobs_script(plan: Plan, sequence: list[Manifest | ClusterPatch]) -> str:
    """``run-jobs.sh``: cluster/ applied and waited for (healthy), then jobs/ one Job at a time in run order, each
    waited for (Complete; Failed or past its deadline stops it, naming the Job), the Cluster patched and waited for
    between points whose Cluster differs. Faults are pglab run's: a scenario run is its Jobs without the fault."""
    k8s = target_of(plan)
    q = shlex.quote
    seconds = (plan.run.measured_seconds or 3600) + plan.run.warmup
    job_timeout = round(max(600.0, 3 * seconds + 600))  # the orchestration's deadline for a Job
    scenarios = sorted({p.scenario.label for p in expand(plan, cores=client_cores(k8s)) if p.scenario is not None})
    ns, name = k8s.namespace, k8s.cluster_name
    head = [
        "#!/bin/sh",
        f"# {RUN_JOBS}: written by pglab k8s render from plan '{plan.name}'. Run it instead of kubectl apply -f",
        f"# {JOBS_DIR}/, which would start every Job at once, before the Cluster is healthy and the dataset loaded:",
        f"#   sh DIR/{RUN_JOBS}    (from any folder; KUBECTL='kubectl --context NAME' for another kubectl or context)",
        f"# 1. kubectl apply -f {CLUSTER_DIR}/ (namespace, RBAC, the Cluster, ...), then wait until CloudNativePG",
        f"#    reports Cluster/{name} '{HEALTHY_PHASE}' with {k8s.instances} ready instances (CLUSTER_TIMEOUT_S).",
        f"# 2. {JOBS_DIR}/ in run order, one Job at a time, each waited for until Complete (JOB_TIMEOUT_S); a Job that",
        "#    fails or outlives that stops the script, exit 1, naming it. A witness Job is applied just before its",
        "#    run's Job and both are waited for. A fio volume is deleted once measured, as pglab run does.",
        "# 3. Between points whose Cluster differs (a CPU step, parameters): its merge patch",
        f"#    ({JOBS_DIR}/50-run-NNNN-0-cluster-patch.json), then the wait again (after a CPU step, until every",
        "#    instance pod has the new CPU; new parameters are waited for by the run's Job itself).",
    ]
    if scenarios:
        head.append(f"# Faults (matrix.scenario: {', '.join(scenarios)}) are injected only by pglab run: here those "
                    "runs get no fault.")
    head += [
        f"# Results stay in the Jobs' logs (kubectl -n {ns} logs job/NAME: a base64 tarball between the pglab results",
        "# markers). Run again after a failure: Jobs already complete are passed over; delete the failed one first.",
        *([f"# Each run's Job has {plan.run.load_pods} pods (run.load_pods, one per index): kubectl -n {ns} logs "
           "-l job-name=NAME --prefix shows each one's."] if plan.run.load_pods > 1 else []),
        f"# At the end: kubectl delete namespace {ns}.",
        "set -eu",
        'KUBECTL=${KUBECTL:-kubectl}',
        "CLUSTER_TIMEOUT_S=${CLUSTER_TIMEOUT_S:-1800}  # the Cluster healthy, at first and after each patch",
        f"JOB_TIMEOUT_S=${{JOB_TIMEOUT_S:-{job_timeout}}}  # each Job: 3 x (warm-up + duration) + 10 min, as pglab run",
        "POLL_S=${POLL_S:-5}",
        f"NS={q(ns)}",
        f"CLUSTER={q(name)}",
        f"INSTANCES={k8s.instances}",
        f"HEALTHY={q(HEALTHY_PHASE)}",
        f"INSTANCE_PODS={q(INSTANCE_PODS)}",
        'HERE=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)',
    ]
    body = ["", f"say {q(f'plan {plan.name}: namespace {ns}, Cluster/{name}')}",
            f"apply {CLUSTER_DIR}", f"wait_cluster {q(f'the environment ({CLUSTER_DIR}/)')}"]
    pending_witness: Manifest | None = None
    pvcs = {m.name for m in sequence if isinstance(m, Manifest) and m.kind == "PersistentVolumeClaim"}
    points = {p.key: p for p in expand(plan, cores=client_cores(k8s))}
    seen_points: set[str] = set()
    for item in sequence:
        notes = {} if isinstance(item, ClusterPatch) else item.body["metadata"].get("annotations") or {}
        key = item.point_key if isinstance(item, ClusterPatch) else notes.get("pglab/point-key")
        if key in points and key not in seen_points:
            seen_points.add(key)
            body += ["", f"# point {points[key].index:04d}: {points[key].label()}"]
        if isinstance(item, ClusterPatch):
            cpu = str(millicores(cpu_quantity(item.cpus))) if item.cpus is not None else ""
            body.append(f"patch_cluster {JOBS_DIR}/{item.filename} {q(item.what)} {cpu}".rstrip())
            continue
        if item.kind == "PersistentVolumeClaim":
            body += ["", f"# storage phase: fio on PersistentVolumeClaim/{item.name}",
                     f"apply {JOBS_DIR}/{item.filename}"]
            continue
        component = item.body["metadata"]["labels"]["pglab/component"]
        if component == "witness":
            pending_witness = item
            continue
        if component == "pgbench-init":
            body += ["", "# the dataset"]
        if "pglab/scenario" in notes:
            text = f"matrix.scenario {notes['pglab/scenario']}: injected only by pglab run; {item.name} runs here " \
                   "without the fault"
            body += [f"# {text}", f"say {q(text)}"]
        waits = [item.name]
        if pending_witness is not None:
            body.append(f"apply {JOBS_DIR}/{pending_witness.filename}")
            waits.append(pending_witness.name)
            pending_witness = None
        body.append(f"apply {JOBS_DIR}/{item.filename}")
        body += [f"wait_job {q(w)}" for w in waits]
        if component == "pgbench-run" and plan.run.pause:
            body.append(f"sleep {plan.run.pause:g}  # run.pause")
        body += [f"delete_pvc {q(c)}" for c in _claims(item) if c in pvcs]
    body += ["", f"say \"done: every Job of {JOBS_DIR}/ complete; their results are in their logs\""]
    return "\n".join(head) + "\n" + _RUN_JOBS_FUNCTIONS + "\n".join(body) + "\n"


def _refuse_foreign(out_dir: Path) -> list[str]:
    """The files an earlier render wrote into ``out_dir`` (to replace), or a refusal: a folder that is neither empty
    nor pglab's, or one whose cluster/ or jobs/ holds files no render wrote (they would be applied with them)."""
    from pglab.errors import UserError

    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return []
    marker = out_dir / RENDER_MARKER
    if not marker.is_file():
        raise UserError(f"-o: {out_dir} is not empty and holds no earlier pglab k8s render (no {RENDER_MARKER}); "
                        "name a new or empty folder, so that no other files are applied with this render's.")
    listed = [line for line in marker.read_text().splitlines()
              if line and not line.startswith("#") and not Path(line).is_absolute() and ".." not in Path(line).parts]
    stray = sorted(str(p.relative_to(out_dir)) for d in (CLUSTER_DIR, JOBS_DIR) if (out_dir / d).is_dir()
                   for p in (out_dir / d).rglob("*") if not p.is_dir() and str(p.relative_to(out_dir)) not in listed)
    if stray:
        raise UserError(f"-o: {out_dir} holds files no pglab k8s render wrote ({', '.join(stray[:3])}"
                        f"{', ...' if len(stray) > 3 else ''}); move them away or name a new folder, so that they are "
                        "not applied with this render's.")
    return listed


def write(plan: Plan, manifests: list[Manifest], out_dir: Path) -> Written:
    """The render, safe to apply: the environment (namespace, RBAC, Cluster, disk sampler, scripts' ConfigMap) in
    ``cluster/``, what runs (fio PVCs and Jobs, the dataset Job, the runs' Jobs, the Cluster patches between
    points) in ``jobs/``, and ``run-jobs.sh`` applying them in order, each waited for. An earlier render in the
    folder is replaced (the files its marker lists); any other non-empty folder is refused."""
    if plan.matrix.storage or plan.tenants:  # run-jobs.sh drives one Cluster
        from pglab.errors import UserError

        field = "matrix.storage" if plan.matrix.storage else "tenants"
        raise UserError(f"{field}: a rendered folder holds one Cluster, and this plan needs one per "
                        f"{'value' if plan.matrix.storage else 'tenant'}; run it with 'pglab run'.")
    old = _refuse_foreign(out_dir)
    for rel in old:
        (out_dir / rel).unlink(missing_ok=True)
    sequence = job_sequence(plan, manifests)
    environment = [m for m in manifests if m.kind not in _RUNNING_KINDS]
    cluster_files = [out_dir / CLUSTER_DIR / m.filename for m in environment]
    job_files = [out_dir / JOBS_DIR / m.filename for m in sequence if isinstance(m, Manifest)]
    patch_files = [out_dir / JOBS_DIR / m.filename for m in sequence if isinstance(m, ClusterPatch)]
    script = out_dir / RUN_JOBS
    for d in (CLUSTER_DIR, JOBS_DIR):
        (out_dir / d).mkdir(parents=True, exist_ok=True)
    listing = [str(p.relative_to(out_dir)) for p in (*cluster_files, *job_files, *patch_files, script)]
    (out_dir / RENDER_MARKER).write_text(  # first: an interrupted write still names every file it may have left
        f"# pglab k8s render of plan '{plan.name}': these files; a later render into this folder replaces them\n"
        + "\n".join(listing) + "\n")
    for m, path in zip(environment, cluster_files, strict=True):
        path.write_text(to_yaml(m.body))
    for item in sequence:
        folder = out_dir / JOBS_DIR
        if isinstance(item, ClusterPatch):
            (folder / item.filename).write_text(json.dumps(item.body, indent=2) + "\n")
        else:
            (folder / item.filename).write_text(to_yaml(item.body))
    script.write_text(run_jobs_script(plan, sequence))
    script.chmod(0o755)
    for d in (CLUSTER_DIR, JOBS_DIR):  # an earlier render's folder left empty
        if not any((out_dir / d).iterdir()):
            (out_dir / d).rmdir()
    return Written(cluster_files, job_files, patch_files, script)
