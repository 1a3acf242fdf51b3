"""target.kubernetes: the CloudNativePG Cluster pglab creates, where its pods go, and the sources of its
figures (node-exporter, Prometheus), a node's fault, the WAL archive."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from pglab.plan.schema.base import Seconds, Strict, Synchronous, Text, _int_between, _text

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?")  # short enough for the names pglab derives
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_IMAGE = re.compile(r"[a-z0-9][a-z0-9._/:@-]{0,254}", re.ASCII)
_QUANTITY = re.compile(r"\d{1,15}(\.\d{1,6})?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?", re.ASCII)
_CPU = re.compile(r"\d{1,6}(\.\d{1,3})?|\d{1,9}m", re.ASCII)
# postgresql.conf settings CloudNativePG fixes itself (its webhook refuses them in .spec.postgresql.parameters)
K8S_FIXED_PARAMETERS = frozenset({
    "archive_command", "archive_mode", "cluster_name", "hot_standby", "log_destination", "log_directory",
    "log_filename", "logging_collector", "primary_slot_name", "restore_command", "shared_preload_libraries", "ssl",
    "ssl_ca_file", "ssl_cert_file", "ssl_key_file", "unix_socket_group", "unix_socket_permissions"})
DnsLabel = Annotated[str, _text(40, pattern=_DNS_LABEL, what="a DNS label: lower-case letters, digits and '-', at "
                                "most 40 characters")]
Image = Annotated[str, _text(255, pattern=_IMAGE, what="a container image reference such as "
                             "ghcr.io/cloudnative-pg/postgresql:17.5")]
# pglab's tools image (fio and a shell), built by tools/images/Containerfile; pglab publishes none: build it and push
# it to the registry the nodes pull from under this name, or name yours in clients.fio_image.
TOOLS_IMAGE = "pglab/tools:1"
Quantity = Annotated[str, _text(32, pattern=_QUANTITY, what="a Kubernetes quantity such as 100Gi or 512Mi")]
_QUANTITY_UNITS = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "k": 10**3, "M": 10**6,
                   "G": 10**9, "T": 10**12, "P": 10**15}


def quantity_bytes(quantity: str) -> float:
    """The bytes a (validated) Kubernetes quantity means: Ki, Mi… binary, k, M… decimal."""
    m = re.fullmatch(r"([\d.]+)([A-Za-z]*)", quantity)
    assert m is not None, quantity
    return float(m.group(1)) * _QUANTITY_UNITS[m.group(2)]


def _cpu(value: Any) -> str:
    """Cores as Kubernetes writes them: 2, 1.5 or 500m (text, so that requests and limits render identically)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not (math.isfinite(value) and 0 < value <= 1024):
            raise PydanticCustomError("cpu", "must be a number of cores between 0 and 1024, such as 2 or '500m'")
        value = f"{value:g}"
    if not isinstance(value, str) or not _CPU.fullmatch(value) or float(value.rstrip("m") or 0) == 0:
        raise PydanticCustomError("cpu", "must be a number of cores such as 2, 1.5 or '500m'")
    return value


class Toleration(Strict):
    """A taint the pods tolerate (dedicated benchmark nodes are usually tainted)."""

    key: Annotated[str, _text(253, pattern=_LABEL_KEY, what="a label key")] | None = Field(
        None, description="taint key (none with Exists: every taint)")
    operator: Literal["Equal", "Exists"] = Field(
        "Equal", description="Equal: the taint's value must be 'value'; Exists: any value")
    value: Annotated[str, _text(63, pattern=_LABEL_VALUE, what="a label value")] | None = Field(
        None, description="taint value, with operator Equal")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="taint effect tolerated (default: every effect)")


class Placement(Strict):
    """Which nodes pods may use; ``anti_affinity: required`` keeps them off the nodes of the pods they avoid."""

    node_selector: dict[Annotated[str, _text(253, pattern=_LABEL_KEY, what="a label key")],
                        Annotated[str, _text(63, pattern=_LABEL_VALUE, what="a label value")]] = Field(
        default_factory=dict, description="node labels the pods require")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32,
                                          description="taints the pods tolerate (at most 32)")
    anti_affinity: Literal["required", "preferred", "none"] = Field(
        "required", description="database: one instance per node; clients: never on a database node")
    topology_key: Annotated[str, _text(253, pattern=_LABEL_KEY, what="a label key")] = Field(
        "kubernetes.io/hostname", description="the node label that makes two nodes 'apart'")


class K8sStorage(Strict):
    """A volume claimed from a storage class: ``class`` (default: the cluster's default class) and ``size``."""

    storage_class: Annotated[str, _text(253, pattern=_LABEL_KEY, what="a storage class name")] | None = Field(
        None, alias="class", description="storage class (default: the cluster's default class)")
    size: Quantity = Field("10Gi", description="volume size, e.g. 100Gi")


class K8sResources(Strict):
    """CPU and memory of each instance, written as requests = limits so that pods get Guaranteed QoS."""

    cpu: Annotated[str, BeforeValidator(_cpu)] = Field(description="cores, e.g. 2, 1.5 or '500m'")
    memory: Quantity = Field(description="memory, e.g. 8Gi")


class K8sSynchronous(Synchronous):
    """CloudNativePG's .spec.postgresql.synchronous: quorum or priority, and what happens with too few standbys."""

    data_durability: Literal["required", "preferred"] = Field(
        "required", description="required: writes wait for enough standbys; preferred: the quorum shrinks when "
        "standbys are missing")


class K8sClients(Placement):
    """The pods that run pgbench and fio, placed apart from the database by default."""

    image: Image | None = Field(None, description="image of the pgbench, psql and witness Jobs: needs pgbench, psql "
                                "and a POSIX shell (default: the database image, which has them)")
    fio_image: Image = Field(TOOLS_IMAGE, description="image of the fio Jobs, the disk sampler and the volume probe: "
                             "needs fio and a POSIX shell; nothing is installed at run time (build it with "
                             "tools/images/Containerfile and push it where the nodes pull from)")
    cpu: Annotated[str, BeforeValidator(_cpu)] | None = Field(None, description="pgbench's cores (requests = limits)")
    memory: Quantity | None = Field(None, description="pgbench's memory (requests = limits)")


class NodeExporter(Strict):
    """Prometheus node-exporter pods already running on the database nodes (kube-prometheus-stack, say): pglab reads
    their disk counters through the API server's pod proxy instead of starting its own disk sampler."""

    namespace: DnsLabel = Field("monitoring", description="namespace of the node-exporter pods")
    labels: dict[Annotated[str, _text(253, pattern=_LABEL_KEY, what="a label key")],
                 Annotated[str, _text(63, pattern=_LABEL_VALUE, what="a label value")]] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "prometheus-node-exporter"}, min_length=1,
        description="labels of the node-exporter pods")
    port: Annotated[int, _int_between(1, 65535)] = Field(9100, description="node-exporter's metrics port")
    scheme: Literal["http", "https"] = Field("http", description="https when it serves TLS (no client certificate "
                                             "or token is sent)")


_PROM_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_PROM_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")
PromLabel = Annotated[str, _text(128, pattern=_PROM_LABEL, what="a Prometheus label name (letters, digits, '_')")]


class PrometheusSource(Strict):
    """The cluster's Prometheus as the source of a run's node disk, container CPU and CloudNativePG figures: range
    queries over the run's window (instead of pglab's disk sampler and its reads of the exporters). It must
    scrape node-exporter, the kubelets' cAdvisor (/metrics/cadvisor) and the instances' exporters (port 9187, as
    CloudNativePG's PodMonitor does)."""

    url: Annotated[str, _text(2048, pattern=_PROM_URL, what="an http:// or https:// URL")] = Field(
        description="Prometheus's base URL (its HTTP API is under /api/v1), e.g. http://prometheus.monitoring:9090")
    bearer_token_file: Text | None = Field(None, description="file whose content is sent as 'Authorization: Bearer "
                                           "…' (read at every query: a rotated token is picked up)")
    ca_file: Text | None = Field(None, description="CA bundle to verify an https URL with (default: the system's)")
    cert_file: Text | None = Field(None, description="client certificate for mutual TLS (with key_file)")
    key_file: Text | None = Field(None, description="client key for mutual TLS (with cert_file)")
    insecure_skip_verify: bool = Field(False, description="do not verify an https URL's certificate")
    interval: Seconds = Field(15.0, description="the scrape interval of the series read: the range queries' step "
                              "(Prometheus's default is 15 s)")
    lag: Seconds | None = Field(None, description="how long after a run's window the queries wait for its last "
                                "scrapes to be stored (default: 2 x interval + 1 s)")
    selector: dict[PromLabel, Annotated[str, _text(256)]] = Field(
        default_factory=dict, max_length=16, description="label matchers added to every query, e.g. {cluster: "
        "prod} on a Prometheus that holds several clusters")
    node_label: PromLabel = Field("instance", description="label of node-exporter's series that holds the "
                                  "Kubernetes node name (its value the name, or name:port)")
    pod_label: PromLabel = Field("pod", description="label holding the pod name on cAdvisor's and the exporters' "
                                 "series")
    namespace_label: PromLabel = Field("namespace", description="label holding the namespace on cAdvisor's and "
                                       "the exporters' series")
    container_label: PromLabel = Field("container", description="label holding the container name on cAdvisor's "
                                       "series")
    timeout: Seconds = Field(30.0, description="seconds each query may take")

    @model_validator(mode="after")
    def _pair(self) -> PrometheusSource:
        if (self.cert_file is None) != (self.key_file is None):
            raise PydanticCustomError("prometheus", "give cert_file and key_file together (mutual TLS), or neither",
                                      {"at": "cert_file" if self.cert_file is None else "key_file"})
        return self


class NodeFault(Strict):
    """How to make a node fail as a machine fails, and come back (a node-loss scenario): Kubernetes cannot power a
    machine off, the platform can (a cloud CLI, a BMC, or tools/kube-lab/kubelab.py on the lab). Each command is
    an argument list; ``{node}`` in an argument is replaced by the node's name."""

    stop: list[Annotated[str, _text(4096)]] = Field(min_length=1, max_length=64, description="command that makes "
                                                    "the node fail at once (power off, kill): its processes stop, "
                                                    "nothing is cleaned up")
    start: list[Annotated[str, _text(4096)]] = Field(min_length=1, max_length=64, description="command that brings "
                                                     "the node back")
    timeout: Seconds = Field(120.0, description="seconds each command may take")


class S3Store(Strict):
    """An S3-compatible bucket for the ObjectStore pglab creates (CloudNativePG's BarmanObjectStoreConfiguration)."""

    endpoint: Annotated[str, _text(2048)] | None = Field(None, description="endpointURL (default: AWS S3), e.g. "
                                                           "http://s3.objectstore.svc:7070 for the lab's")
    destination: Annotated[str, _text(2048, pattern=re.compile(r"s3://[^/\s]+(/[^\s]*)?"),
                                      what="an s3://bucket/path URL")] = Field(
        description="destinationPath, s3://bucket/path: an empty path (barman refuses to archive over another "
        "server's WAL)")
    credentials: Annotated[str, _text(253, pattern=re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*"
                                                              r"[a-z0-9])?"), what="namespace/name")] = Field(
        description="the Secret (namespace/name) holding ACCESS_KEY_ID and ACCESS_SECRET_KEY; pglab copies it into "
        "its namespace (on the lab: objectstore/s3-credentials)")
    compression: Literal["gzip", "bzip2", "snappy"] | None = Field(None, description="WAL and data compression")
    max_parallel: Annotated[int, _int_between(1, 32)] = Field(1, description="wal.maxParallel: segments archived "
                                                              "at once")
    jobs: Annotated[int, _int_between(1, 32)] | None = Field(None, description="data.jobs: files uploaded at once "
                                                             "by a base backup")
    immediate_checkpoint: bool = Field(True, description="data.immediateCheckpoint: the base backup starts with a "
                                       "fast checkpoint, as pg_basebackup -c fast (else a spread one: up to "
                                       "checkpoint_completion_target x checkpoint_timeout under load)")


class WalArchive(Strict):
    """Continuous WAL archiving through CloudNativePG's Barman Cloud plugin (``isWALArchiver``), to an ObjectStore;
    the backup scenario's base backup goes there too."""

    object_store: DnsLabel | None = Field(None, description="an ObjectStore (barmancloud.cnpg.io) already in the "
                                          "namespace; without it pglab creates one from s3")
    s3: S3Store | None = Field(None, description="the bucket of the ObjectStore pglab creates (and deletes at the "
                               "end), named <cluster_name>-store")

    @model_validator(mode="after")
    def _one_store(self) -> WalArchive:
        if (self.object_store is None) == (self.s3 is None):
            raise PydanticCustomError("wal_archive", "give object_store (an ObjectStore in the namespace) or s3 (pglab "
                                      "creates one), exactly one", {"at": "object_store"})
        return self


class KubernetesTarget(Strict):
    """A CloudNativePG ``Cluster`` pglab creates in a namespace, with pgbench and fio as Jobs on client nodes."""

    kubeconfig: Text | None = Field(None, description="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    context: Annotated[str, _text(253)] | None = Field(None, description="kubeconfig context (default: current)")
    namespace: DnsLabel = Field("pglab", description="namespace pglab creates everything in")
    cluster_name: DnsLabel = Field("pglab", description="name of the Cluster (and prefix of what pglab creates)")
    instances: Annotated[int, _int_between(1, 16)] = Field(3, description="primary + standbys")
    image: Image = Field("ghcr.io/cloudnative-pg/postgresql:17.5", description="PostgreSQL operand image")
    startup_probe_period: Annotated[int, _int_between(1, 60, "a whole number of seconds from 1")] | None = Field(
        None, description="seconds between the kubelet's startup probes of an instance (.spec.probes.startup."
        "periodSeconds; default: CloudNativePG's, 10). An instance is ready at the first probe after its "
        "PostgreSQL is, so the Cluster's creation and each rolling update (a CPU step) wait up to this long per "
        "instance; 1 shortens them, and no figure of a run's window depends on it")
    storage: K8sStorage = Field(default_factory=K8sStorage, description="data volumes (.spec.storage)")
    wal_storage: K8sStorage | None = Field(None, description="separate WAL volumes (.spec.walStorage)")
    resources: K8sResources = Field(description="per instance; requests = limits (Guaranteed QoS)")
    synchronous: K8sSynchronous | None = Field(default_factory=K8sSynchronous,
                                               description="null for asynchronous replication")
    database: Placement = Field(default_factory=Placement, description="where the instances run")
    clients: K8sClients = Field(default_factory=K8sClients, description="where pgbench and fio run")
    node_exporter: NodeExporter | None = Field(None, description="read disk counters from these node-exporter pods "
                                               "instead of pglab's disk-sampler DaemonSet")
    prometheus: PrometheusSource | None = Field(None, description="read the runs' node disk, container CPU and "
                                                "CloudNativePG figures from this Prometheus (range queries over each "
                                                "run's window) instead of pglab's own samplers and exporter reads")
    exporter_queries: Literal["pglab", "default"] = Field(
        "pglab", description="what each instance's exporter runs when read: 'pglab', the queries of the figures pglab "
        "reads (pg_stat_database, pg_stat_bgwriter or pg_stat_checkpointer, pg_stat_replication, pg_stat_archiver; "
        "a read costs the instance about half the CPU of the default set), or 'default', the operator's whole "
        "default set (for dashboards of your own)")
    node_fault: NodeFault | None = Field(None, description="commands that stop and start a node, for the node-loss "
                                         "scenario")
    wal_archive: WalArchive | None = Field(None, description="archive WAL continuously to an object store through "
                                           "the Barman Cloud plugin (the backup scenario needs it)")

    @model_validator(mode="after")
    def _one_disk_source(self) -> KubernetesTarget:
        if self.prometheus is not None and self.node_exporter is not None:
            raise PydanticCustomError("kubernetes", "give node_exporter or prometheus, not both: with prometheus the "
                                      "disk counters come from the node-exporter series it holds",
                                      {"at": "node_exporter"})
        return self

    @model_validator(mode="after")
    def _sync_fits(self) -> KubernetesTarget:
        if self.instances == 1 and "synchronous" not in self.model_fields_set:
            object.__setattr__(self, "synchronous", None)  # a lone primary has nobody to wait for
        if self.synchronous is not None and self.synchronous.number >= self.instances:
            raise PydanticCustomError(
                "synchronous", "synchronous.number ({number}) must be lower than instances ({instances}), as "
                "CloudNativePG requires; raise instances or set synchronous: null",
                {"number": self.synchronous.number, "instances": self.instances, "at": "synchronous.number"})
        return self
