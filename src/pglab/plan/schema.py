"""The plan: what to provision, what to run, which axes to sweep. Validated strictly (unknown fields fail)."""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainSerializer,
    PlainValidator,
    Tag,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from pglab.units import NotASize, NotWholeBytes, Size

BUILTIN_WORKLOADS = ("tpcb-like", "select-only", "simple-update")
SYNC_COMMIT_LEVELS = ("off", "local", "remote_write", "on", "remote_apply")
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*", re.ASCII)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_PARAM = re.compile(r"[a-z_][a-z0-9_.]{0,62}")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")
_CURRENCY = re.compile(r"[A-Z]{3}")
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_ .-]{0,62}")
MAX_CLIENTS = 10_000
MAX_SCALE = 100_000
MAX_PARTITIONS = 10_000
MAX_WEIGHT = 10_000
MAX_TRANSACTIONS = 1_000_000_000
MAX_REPEATS = 1000
MAX_RATE = 10_000_000
MAX_PRICE = 1e12
MAX_POINTS = 10_000
MAX_TENANTS = 256
MAX_RUNS = 100_000
MAX_LOAD_PODS = 64
MAX_TEXT = 4096  # paths and free text; PATH_MAX on Linux
MAX_VALUE = 1024  # a PostgreSQL parameter value given as text
WEEK = 7 * 24 * 3600
_INT64 = 1 << 63


def show(value: object, limit: int = 60) -> str:
    """A value for a one-line message: quoted, at most ``limit`` characters, control characters escaped."""
    try:
        text = str(value)
    except ValueError:  # an int too long to print
        return "a number with thousands of digits"
    cut = len(text) > limit
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return "'" + text + ("…'" if cut else "'")


def _int_between(low: int, high: int, what: str = "a positive integer") -> Any:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise PydanticCustomError("int", f"must be {what}")
        if value > high:
            raise PydanticCustomError("int", "must be at most {high}", {"high": high})
        return value

    return BeforeValidator(check)


def _number_between(low: float, high: float, *, low_open: bool = False) -> Any:
    """A YAML number (not a string, not a boolean), finite, in [low, high] (or (low, high])."""

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                isinstance(value, float) and not math.isfinite(value)):  # an int is exact, however large
            raise PydanticCustomError("number", "must be a number")
        if value < low or (low_open and value == low):
            raise PydanticCustomError("number", "must be greater than {low}" if low_open else "must be at least {low}",
                                      {"low": f"{low:g}"})
        if value > high:
            raise PydanticCustomError("number", "must be at most {high}", {"high": f"{high:g}"})
        return float(value)

    return BeforeValidator(check)


def _control_chars(text: str, multiline: bool) -> bool:
    allowed = "\n\t" if multiline else ""
    return any(not c.isprintable() and c not in allowed for c in text)


def _text(limit: int = MAX_TEXT, *, multiline: bool = False, pattern: re.Pattern[str] | None = None,
          what: str = "text") -> Any:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise PydanticCustomError("text", f"must be {what}")
        if len(value) > limit:
            raise PydanticCustomError("text", "must be at most {limit} characters long", {"limit": limit})
        if _control_chars(value, multiline):
            raise PydanticCustomError("text", "must not contain control characters (line breaks, tabs, NUL)"
                                      if not multiline else "must not contain control characters (NUL …)")
        if pattern is not None and not pattern.fullmatch(value):
            raise PydanticCustomError("text", f"must be {what}")
        return value

    return BeforeValidator(check)


def _plan_file(value: Any) -> str:
    """A file next to the plan: a relative path that stays inside the plan's folder (checked again on disk)."""
    if not isinstance(value, str) or not value.strip():
        raise PydanticCustomError("file", "must be the path of a file, relative to the plan's folder")
    if len(value) > MAX_TEXT:
        raise PydanticCustomError("file", "must be at most {limit} characters long", {"limit": MAX_TEXT})
    if _control_chars(value, multiline=False):
        raise PydanticCustomError("file", "must not contain control characters (line breaks, tabs, NUL)")
    if value.startswith(("/", "~")):
        raise PydanticCustomError("file", "must be relative to the plan's folder, not {shown}; copy the file next "
                                  "to the plan", {"shown": "an absolute path" if value[0] == "/" else "'~'"})
    if posixpath.normpath(value).split("/")[0] == "..":
        raise PydanticCustomError("file", "{shown} leads out of the plan's folder; copy the file next to the plan",
                                  {"shown": show(value)})
    return value


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PydanticCustomError("positive_int", "must be a positive integer")
    return value


def _seconds(value: Any) -> float:
    """Accept 60, 60.5, "60s", "500ms", "2m", "1h"; return seconds."""
    if isinstance(value, bool):
        raise PydanticCustomError("duration", "must be a duration such as 30, '30s', '2m' or '500ms'")
    if isinstance(value, int) and not 0 <= value <= WEEK:  # before float(): a huge int does not fit one
        raise PydanticCustomError("duration", "must be between 0 and one week")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and len(value) <= 64 and (m := _DURATION.fullmatch(value)):
        unit = m.group(2) or "s"
        seconds = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600}[unit]
    else:
        raise PydanticCustomError("duration", "must be a duration such as 30, '30s', '2m' or '500ms'")
    if not 0 <= seconds <= WEEK:  # also refuses NaN
        raise PydanticCustomError("duration", "must be between 0 and one week")
    return seconds


def _param_value(value: Any) -> str | int | float | bool:
    """A PostgreSQL parameter value: text (one line, written quoted into postgresql.conf), a number or a boolean."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -_INT64 <= value < _INT64:
            raise PydanticCustomError("param_value", "must be a number PostgreSQL can hold (64 bits at most)")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PydanticCustomError("param_value", "must be a finite number")
        return value
    if isinstance(value, str):
        if len(value) > MAX_VALUE:
            raise PydanticCustomError("param_value", "must be at most {limit} characters long", {"limit": MAX_VALUE})
        if _control_chars(value, multiline=False):
            raise PydanticCustomError("param_value", "must not contain control characters (line breaks, tabs, NUL)")
        return value
    raise PydanticCustomError("param_value", "must be a string, a number or a boolean")


PositiveInt = Annotated[int, BeforeValidator(_positive_int)]
Seconds = Annotated[float, BeforeValidator(_seconds)]
ParamValue = Annotated[str | int | float | bool, BeforeValidator(_param_value)]
PlanFile = Annotated[str, BeforeValidator(_plan_file)]
Text = Annotated[str, _text()]
Clients = Annotated[int, _int_between(1, MAX_CLIENTS)]

MIN_SIZE, MAX_SIZE = 1 << 20, 1 << 50


def _size(value: Any) -> Size:
    """A fio size: bytes, or a number with a binary unit (fio's kb_base=1024): 256MiB, 1G, 512m; 1 MiB … 1 PiB.

    Parsed here, once: the field holds the text as written and its ``.bytes``."""
    try:
        size = Size(value)
    except NotWholeBytes as exc:
        if exc.exact > MAX_SIZE:
            raise PydanticCustomError("size", "must be between 1 MiB and 1 PiB") from None
        raise PydanticCustomError("size", "must be a whole number of bytes") from None
    except NotASize:
        raise PydanticCustomError("size", "must be a size such as 256MiB, 1GiB or a number of bytes") from None
    if not MIN_SIZE <= size.bytes <= MAX_SIZE:
        raise PydanticCustomError("size", "must be between 1 MiB and 1 PiB")
    return size


# The text the user wrote (dumps, stored plans and manifests show it unchanged) and its bytes (``.bytes``).
PlanSize = Annotated[Size, PlainValidator(_size), PlainSerializer(str, return_type=str),
                     WithJsonSchema({"type": "string"})]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Synchronous(Strict):
    """Quorum (``any``) or priority (``first``) synchronous replication: ``ANY number (standbys…)``."""

    method: Literal["any", "first"] = Field(
        "any", description="any: a quorum of standbys confirms each commit; first: the first standbys in order do")
    number: Annotated[int, _int_between(1, 8)] = Field(1, description="how many standbys must confirm a commit")


class LabPaths(Strict):
    """Where the lab lives. ``data`` and ``wal`` may be on different devices to separate WAL."""

    lab: Text | None = Field(None, description="lab directory (default: a new temporary directory)")
    data: Text | None = Field(None, description="base directory of the data directories (default: lab)")
    wal: Text | None = Field(None, description="base directory of the WAL directories (default: lab)")


_CPUSET = re.compile(r"\d{1,4}(-\d{1,4})?(,\d{1,4}(-\d{1,4})?){0,63}")
Cpus = Annotated[float, _number_between(0.0, 1024.0, low_open=True)]
Rate = Annotated[float, _number_between(0, MAX_RATE, low_open=True)]  # transactions/s, pgbench -R


class Resources(Strict):
    """Limits per instance, through cgroups (like a Kubernetes pod's requests = limits: Guaranteed QoS)."""

    cpus: Cpus | None = Field(None, description="CPU quota in cores (1.5 = 150 ms of CPU time per 100 ms)")
    memory: PlanSize | None = Field(None, description="memory limit (cgroup memory.max), e.g. 4GiB")
    read_iops: Annotated[int, _int_between(1, 10**9)] | None = Field(None, description="read IOs per second")
    write_iops: Annotated[int, _int_between(1, 10**9)] | None = Field(None, description="write IOs per second")
    read_mbps: Annotated[float, _number_between(0.0, 10**6, low_open=True)] | None = Field(
        None, description="read MiB per second")
    write_mbps: Annotated[float, _number_between(0.0, 10**6, low_open=True)] | None = Field(
        None, description="write MiB per second")


class Client(Strict):
    """pgbench's own budget, so that server and client do not steal from each other unseen."""

    cpus: Cpus | None = Field(None, description="CPU quota of pgbench, in cores")
    cpuset: Annotated[str, _text(256, pattern=_CPUSET, what="a CPU list such as 1 or 0-1,3")] | None = Field(
        None, description="CPUs pgbench may run on (cpuset), e.g. '1'")


class Network(Strict):
    """The replication link between the primary and each standby, shaped through Toxiproxy."""

    latency_ms: Annotated[int, _int_between(0, 10_000, "a whole number of milliseconds, 0 or more")] = Field(
        0, description="added round trip (half each way): what every synchronous commit pays on top")
    jitter_ms: Annotated[int, _int_between(0, 10_000, "a whole number of milliseconds, 0 or more")] = Field(
        0, description="spread of the added round trip (uniform ±)")
    bandwidth_kbps: Annotated[int, _int_between(8, 10**9, "a whole number of kbit/s, at least 8")] | None = Field(
        None, description="primary → standby bandwidth cap in kbit/s (a multiple of 8)")

    @model_validator(mode="after")
    def _consistent(self) -> Network:
        if self.jitter_ms > self.latency_ms:
            raise PydanticCustomError("network", "jitter_ms ({j}) must be at most latency_ms ({l}): a delay cannot "
                                      "be negative", {"j": self.jitter_ms, "l": self.latency_ms, "at": "jitter_ms"})
        if self.bandwidth_kbps is not None and self.bandwidth_kbps % 8:
            raise PydanticCustomError("network", "must be a multiple of 8 (Toxiproxy shapes whole kB/s)",
                                      {"at": "bandwidth_kbps"})
        return self


class LocalTarget(Strict):
    instances: PositiveInt = Field(3, description="primary + standbys")
    synchronous: Synchronous | None = Field(
        default_factory=Synchronous, description="null for asynchronous replication"
    )
    paths: LabPaths = Field(default_factory=LabPaths, description="where the lab, its data and its WAL live")
    run_as: Annotated[str, _text(32, pattern=_USER, what="a user name")] | None = Field(
        None, description="unprivileged user for the servers when pglab runs as root")
    bindir: Text | None = Field(None, description="PostgreSQL bin directory (default: newest installed)")
    resources: Resources | None = Field(None, description="CPU, memory and IO limits of each instance (cgroups)")
    client: Client | None = Field(None, description="pgbench's own cgroup: CPU quota and/or cpuset")
    network: Network | None = Field(None, description="replication link latency/bandwidth through Toxiproxy")
    limits: Literal["strict", "best-effort"] = Field(
        "strict", description="strict: fail when limits cannot be applied; best-effort: run, and record that "
        "they were not")
    ha: Literal["patroni"] | None = Field(
        None, description="'patroni': the instances run under Patroni with an etcd of their own, clients follow "
        "the leader (failover and switchover scenarios need it)")

    @field_validator("instances")
    @classmethod
    def _instances(cls, v: int) -> int:
        if v > 9:
            raise PydanticCustomError("instances", "must be at most 9 on a local lab")
        return v

    @model_validator(mode="after")
    def _ha_fits(self) -> LocalTarget:
        if self.ha is None:
            return self
        if self.instances < 2:
            raise PydanticCustomError("ha", "an HA lab needs at least 2 instances", {"at": "instances"})
        return self

    @model_validator(mode="after")
    def _sync_fits(self) -> LocalTarget:
        if self.instances == 1 and "synchronous" not in self.model_fields_set:
            object.__setattr__(self, "synchronous", None)  # a lone primary has nobody to wait for
        if self.synchronous is not None and self.synchronous.number > self.instances - 1:
            raise PydanticCustomError(
                "synchronous",
                "synchronous.number ({number}) must be at most the number of standbys ({standbys}); "
                "raise instances or set synchronous: null",
                {"number": self.synchronous.number, "standbys": self.instances - 1},
            )
        return self


EXTERNAL_KEYS = ("host", "port", "user", "dbname", "sslmode")


class ExternalTarget(Strict):
    """An existing server pglab does not own: measured, never reconfigured, written only with double consent."""

    conninfo: Annotated[str, _text(1024)] = Field(
        description="libpq connection string: host, port, user, dbname (and sslmode); the password goes in a passfile")
    passfile: Text | None = Field(None, description="libpq password file (default: $PGPASSFILE or ~/.pgpass)")
    destructive: bool = Field(False, description="let pglab load/reset the pgbench dataset and run write workloads; "
                              "also needs --allow-destructive on the command line")
    bindir: Text | None = Field(None, description="directory of pgbench (default: newest installed)")

    @field_validator("conninfo")
    @classmethod
    def _conninfo(cls, v: str) -> str:
        from psycopg.conninfo import conninfo_to_dict

        try:
            params = conninfo_to_dict(v)
        except Exception:
            raise PydanticCustomError("conninfo", "is not a libpq connection string (key=value …)") from None
        if "password" in params:
            raise PydanticCustomError("conninfo", "holds a password; put it in a passfile (target.external.passfile)")
        unknown = sorted(set(params) - set(EXTERNAL_KEYS))
        if unknown:
            raise PydanticCustomError("conninfo", "'{key}' is not supported here; use only {keys}",
                                      {"key": unknown[0], "keys": ", ".join(EXTERNAL_KEYS)})
        missing = [k for k in ("host", "user", "dbname") if not params.get(k)]
        if missing:
            raise PydanticCustomError("conninfo", "needs {keys}", {"keys": ", ".join(missing)})
        return v

    def parameters(self) -> dict[str, str]:
        from psycopg.conninfo import conninfo_to_dict

        return {k: str(v) for k, v in conninfo_to_dict(self.conninfo).items()}


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


class Target(Strict):
    local: LocalTarget | None = Field(None, description="a lab pglab builds on this host (default when no target "
                                      "is given)")
    external: ExternalTarget | None = Field(None, description="an existing server, measured as it is")
    kubernetes: KubernetesTarget | None = Field(None, description="a CloudNativePG cluster pglab creates")

    @model_validator(mode="after")
    def _one(self) -> Target:
        if sum(t is not None for t in (self.local, self.external, self.kubernetes)) != 1:
            raise PydanticCustomError("target", "give exactly one target: 'local: {}' for the embedded lab, "
                                      "'external: {conninfo: …}' for an existing server, or 'kubernetes: {…}' for a "
                                      "CloudNativePG cluster")
        return self


class Postgres(Strict):
    parameters: dict[str, ParamValue] = Field(
        default_factory=dict, description="postgresql.conf settings of every instance, e.g. shared_buffers: 1GB")

    @field_validator("parameters")
    @classmethod
    def _names(cls, v: dict[str, ParamValue]) -> dict[str, ParamValue]:
        for name in v:
            _check_param_name(name)
        return v


def _check_param_name(name: str) -> None:
    if not _PARAM.fullmatch(name):
        raise PydanticCustomError("param", "{name} is not a PostgreSQL parameter name", {"name": show(name)})
    if name in ("port", "listen_addresses", "unix_socket_directories", "synchronous_standby_names",
                "primary_conninfo", "data_directory", "hba_file", "ident_file", "include", "include_dir"):
        raise PydanticCustomError(
            "param", "'{name}' is managed by pglab and cannot be set in a plan", {"name": name}
        )
    if name == "synchronous_commit":
        raise PydanticCustomError(
            "param", "set synchronous_commit with the matrix axis 'synchronous_commit', not as a parameter"
        )


class Dataset(Strict):
    scale: Annotated[int, _int_between(1, MAX_SCALE)] = Field(
        10, description="pgbench scale factor (-s): 100,000 accounts, about 15 MB, per unit")
    partitions: Annotated[int, _int_between(1, MAX_PARTITIONS)] | None = Field(
        None, description="pgbench_accounts partitions (pgbench --partitions); none: not partitioned")
    reset: Literal["vacuum", "reinit", "snapshot"] = Field(
        "vacuum",
        description="before each run: 'vacuum' (truncate history, VACUUM ANALYZE, CHECKPOINT), "
        "'reinit' (reload the dataset with pgbench -i) or 'snapshot' (local lab: every instance put back to the "
        "snapshot taken after the first load, a reflink copy where the filesystem allows)",
    )
    cache: bool = Field(
        True, description="local lab: keep the first load of this dataset in the user's dataset cache and start "
        "later labs with the same PostgreSQL build, dataset and settings that shape the files from it instead of "
        "loading again (a copy, or a reflink where the filesystem allows); the run records whether it came from "
        "the cache (`pglab cache list|clean`; PGLAB_CACHE_DIR, PGLAB_CACHE_SIZE, PGLAB_CACHE=off)",
    )


class Script(Strict):
    """One part of a mixed workload: a built-in script or a custom file, with a weight (pgbench @W)."""

    builtin: Literal["tpcb-like", "select-only", "simple-update"] | None = Field(
        None, description="a pgbench built-in script (instead of file)")
    file: PlanFile | None = Field(None, description="pgbench script, relative to the plan's folder")
    weight: Annotated[int, _int_between(1, MAX_WEIGHT)] = Field(
        1, description="relative share of the transactions run with this script")

    @model_validator(mode="after")
    def _one(self) -> Script:
        if (self.builtin is None) == (self.file is None):
            raise PydanticCustomError("script", "give exactly one of 'builtin' or 'file'")
        return self


class CustomWorkload(Strict):
    name: str = Field(description="the workload's name in tables: 1-63 letters, digits, '-', '_' or '.'")
    scripts: list[Script] = Field(min_length=1, max_length=100, description="the scripts mixed, each with its "
                                  "weight (1 to 100 of them)")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise PydanticCustomError("name", "must be 1-63 letters, digits, '-', '_' or '.'")
        if v in BUILTIN_WORKLOADS:
            raise PydanticCustomError("name", "'{name}' is a built-in workload name", {"name": v})
        return v


Workload = Literal["tpcb-like", "select-only", "simple-update"] | CustomWorkload
def _sync_level(value: Any) -> Any:
    """YAML 1.1 reads unquoted on/off as booleans; for synchronous_commit they can only mean the levels."""
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


SyncCommit = Annotated[Literal["off", "local", "remote_write", "on", "remote_apply"], BeforeValidator(_sync_level)]


class Scenario(Strict):
    """A fault or an operation during every measured run of the point, ``at`` seconds after pgbench starts.

    A witness client writes increasing ids through it and reads them back afterwards (RPO, RTO); pgbench is
    started again whenever the fault ends it, so that the load and its timeline run through the outage."""

    kind: Literal["failover", "switchover", "standby-loss", "backup", "node-loss", "node-drain"] = Field(
        description="failover: kill the leader; switchover: a planned one; standby-loss: a standby stopped for a "
        "while; backup: pg_basebackup of the primary; Kubernetes only: node-loss: the primary's node fails as a "
        "machine does (target.kubernetes.node_fault) and comes back once a new primary is reported; node-drain: "
        "the primary's node cordoned and its instance pods evicted, as an upgrade does, uncordoned after down")
    at: Seconds = Field(5.0, description="seconds after the start of the measured run")
    kill: Literal["node", "postgres"] = Field(
        "node", description="failover: SIGKILL the leader's Patroni and postgres (node) or its postgres only")
    down: Seconds = Field(5.0, description="standby-loss: seconds before the killed standby is started again; "
                          "node-loss, node-drain: the least seconds the node stays away")
    max_rate: Annotated[str, _text(16, pattern=re.compile(r"[1-9][0-9]*[kM]?"), what="a rate such as 32M")] | None = (
        Field(None, description="backup: pg_basebackup --max-rate (kB/s, or with k/M); unthrottled without it"))
    witness: bool = Field(True, description="run the witness writer (acknowledged writes lost, RTO)")

    @property
    def label(self) -> str:
        if self.kind == "failover":
            return f"failover-{self.kill}"
        if self.kind == "backup":
            return f"backup max-rate={self.max_rate}" if self.max_rate else "backup"
        return self.kind


class Tier(Strict):
    """A QoS class of tenants (high, medium, best-effort …): the same limits and the same load for each."""

    name: Annotated[str, _text(63, pattern=_NAME, what="1-63 letters, digits, '-', '_' or '.'")] = Field(
        description="the tier's name in tables (high, best-effort …), unique in its arrangement")
    tenants: Annotated[int, _int_between(1, MAX_TENANTS)] = Field(1, description="how many tenants in this tier")
    resources: Resources | None = Field(None, description="limits of each instance of each tenant (cgroups); "
                                        "none: the tenant competes freely")
    workload: Workload = Field("tpcb-like", description="each tenant's workload: a built-in name or a custom "
                               "{name, scripts}")
    clients: Clients = Field(1, description="pgbench clients of each tenant")
    jobs: Clients = Field(1, description="pgbench threads of each tenant")
    synchronous_commit: SyncCommit = Field("on", description="each tenant's synchronous_commit level")
    storage: K8sStorage | None = Field(None, description="Kubernetes: each tenant's data volumes {class, size} "
                                       "(default: target.kubernetes.storage)")
    namespace: DnsLabel | None = Field(None, description="Kubernetes: the namespace of this tier's Clusters "
                                       "(default: target.kubernetes.namespace)")

    @model_validator(mode="after")
    def _jobs(self) -> Tier:
        if self.jobs > self.clients:
            raise PydanticCustomError("tier", "jobs ({j}) must be at most clients ({c}): pgbench refuses more "
                                      "threads than clients", {"j": self.jobs, "c": self.clients, "at": "jobs"})
        return self


class Arrangement(Strict):
    """One way of packing tenants on the host (for example: no QoS, or one critical tenant on a high tier)."""

    name: Annotated[str, _text(63, pattern=_NAME, what="1-63 letters, digits, '-', '_' or '.'")] = Field(
        description="the arrangement's name in tables (one point each), unique")
    tiers: list[Tier] = Field(min_length=1, max_length=16, description="the tiers sharing the host (1 to 16); "
                              "256 tenants at most in all")

    @field_validator("tiers")
    @classmethod
    def _tiers(cls, v: list[Tier]) -> list[Tier]:
        if len({t.name for t in v}) != len(v):
            raise PydanticCustomError("unique", "tier names must be unique within an arrangement")
        total = sum(t.tenants for t in v)
        if total > MAX_TENANTS:
            raise PydanticCustomError("tenants", "{total} tenants, more than {max}; lower a tier's 'tenants'",
                                      {"total": total, "max": MAX_TENANTS})
        return v

    @property
    def tenant_count(self) -> int:
        return sum(t.tenants for t in self.tiers)


class Tenants(Strict):
    """Many independent tenants, measured in the same window (on one local host, or a Cluster each on Kubernetes);
    each arrangement is one point."""

    instances: Annotated[int, _int_between(1, 5)] = Field(
        1, description="instances per tenant: 1 = a single server; more = a primary and streaming standbys "
        "(target.local.synchronous, or target.kubernetes.synchronous, applies)")
    parallel_builds: Annotated[int, _int_between(1, 64)] | None = Field(
        None, description="tenants built and loaded at the same time (default: the host's cores)")
    arrangements: list[Arrangement] = Field(min_length=1, max_length=20, description="ways of packing the "
                                            "tenants, each measured as one point (1 to 20)")

    @field_validator("arrangements")
    @classmethod
    def _names(cls, v: list[Arrangement]) -> list[Arrangement]:
        if len({a.name for a in v}) != len(v):
            raise PydanticCustomError("unique", "arrangement names must be unique")
        return v


class Capacity(Strict):
    """The highest rate whose latency stays under a target, per configuration: a closed-loop run brackets it
    (nothing beats the clients' own pace), then the rate is bisected; every probe is a stored run."""

    percentile: Literal[50, 95, 99] = Field(99, description="the latency percentile held to the target")
    target: Seconds = Field(description="the latency the percentile must stay under, e.g. '5ms' (from each "
                            "transaction's scheduled start)")
    max_skipped_pct: Annotated[float, _number_between(0, 100)] = Field(
        1.0, description="with run.latency_limit: the share of skipped transactions a passing rate may have")
    precision_pct: Annotated[float, _number_between(0.1, 50)] = Field(
        5.0, description="stop when the bracket (highest passing, lowest failing rate) is narrower than this share "
        "of its top")
    max_probes: Annotated[int, _int_between(2, 30)] = Field(
        10, description="rates probed per configuration at most, the closed-loop run included; each is run "
        "run.repeats times")

    def holds(self, figures: Mapping[str, float | None]) -> bool | None:
        """Whether a run's figures (or the mean of a rate's repeats) held the target (None: no such percentile)."""
        value = figures.get(f"latency_p{self.percentile}_ms")
        if value is None:
            return None
        return value <= self.target * 1000 and (figures.get("skipped_pct") or 0.0) <= self.max_skipped_pct


class Cost(Strict):
    """What the configuration costs per month, to turn TPS into cost per TPS."""

    monthly: Annotated[float, _number_between(0, MAX_PRICE, low_open=True)] = Field(
        description="price per month of the whole configuration")
    currency: Annotated[str, _text(64, pattern=_CURRENCY, what="a currency code such as USD or EUR")] = Field(
        "USD", description="ISO 4217 code of the price (three capitals)")
    breakdown: dict[Annotated[str, _text(63, pattern=_LABEL, what="a label (letters, digits, ' ', '-', '_', '.')")],
                    Annotated[float, _number_between(0, MAX_PRICE)]] = Field(
        default_factory=dict, description="optional parts (compute, storage …)")

    @model_validator(mode="after")
    def _parts_add_up(self) -> Cost:
        if self.breakdown:
            total = sum(self.breakdown.values())
            if abs(total - self.monthly) > 0.01 * self.monthly:
                raise PydanticCustomError("cost", "breakdown adds up to {total}, not to monthly ({monthly})",
                                          {"total": f"{total:g}", "monthly": f"{self.monthly:g}"})
        return self


# ------------------------------------------------------------------ the storage axis (Kubernetes: a Cluster per value)
class StorageOption(Strict):
    """One value of the storage axis: a named storage profile, i.e. the classes and sizes of the data and WAL
    volumes of a whole Cluster (pglab builds a new Cluster for it), and optionally what that configuration costs."""

    name: DnsLabel = Field(description="the value's name in tables and in the names of its volumes (a DNS label, "
                           "e.g. premium-ssd)")
    storage: K8sStorage | None = Field(None, description="data volumes {class, size} (default: "
                                       "target.kubernetes.storage)")
    wal_storage: K8sStorage | None = Field(None, description="WAL volumes {class, size} (default: "
                                           "target.kubernetes.wal_storage)")
    cost: Cost | None = Field(None, description="monthly price of the whole configuration on this storage, for "
                              "cost per TPS per value (default: the plan's cost)")


class Matrix(Strict):
    """Axes; every combination is one point."""

    workload: list[Workload] = Field(default_factory=lambda: list[Workload](["tpcb-like"]), min_length=1,
                                     description="built-in names (tpcb-like, select-only, simple-update) or custom "
                                     "{name, scripts}")
    clients: list[Clients] = Field(default_factory=lambda: [1], min_length=1,
                                   description="pgbench clients (-c), 1 to 10,000 each")
    jobs: list[Clients] | None = Field(None, min_length=1, description="default: min(clients, cores)")
    synchronous_commit: list[SyncCommit] = Field(default_factory=lambda: list[SyncCommit](["on"]), min_length=1,
                                                 description="durability levels: off, local, remote_write, on, "
                                                 "remote_apply (quote on and off)")
    parameters: dict[str, list[ParamValue]] = Field(default_factory=dict, description="any PostgreSQL parameter "
                                                    "as an axis: name → list of values")
    cpus: list[Cpus] | None = Field(None, min_length=1, description="CPU limit per instance as an axis: the "
                                    "scaling loop (a rolling restart between steps)")
    rate: list[Rate] | None = Field(None, min_length=1, max_length=100, description="target transactions/s as an "
                                    "axis (pgbench -R, open loop): latency is measured from each transaction's "
                                    "scheduled start, schedule lag and skipped transactions are figures of the run")
    scenario: list[Scenario] | None = Field(None, min_length=1, max_length=20,
                                            description="faults and operations during the runs, as an axis")
    storage: list[StorageOption] | None = Field(
        None, min_length=1, max_length=20, description="Kubernetes: storage profiles (classes and sizes of the data "
        "and WAL volumes) as an axis; pglab builds one Cluster per value, one after the other")

    @field_validator("storage")
    @classmethod
    def _storage_names(cls, v: list[StorageOption] | None) -> list[StorageOption] | None:
        if v is not None and len({s.name for s in v}) != len(v):
            raise PydanticCustomError("unique", "storage values need distinct names")
        return v

    @field_validator("scenario")
    @classmethod
    def _scenarios(cls, v: list[Scenario] | None) -> list[Scenario] | None:
        if v is not None and len({s.label for s in v}) != len(v):
            raise PydanticCustomError("unique", "scenarios must differ (kind, kill or max_rate)")
        return v

    @field_validator("cpus", "rate")
    @classmethod
    def _cpus(cls, v: list[float] | None) -> list[float] | None:
        return v if v is None else _unique(v)

    @field_validator("clients", "jobs")
    @classmethod
    def _clients(cls, v: list[int] | None) -> list[int] | None:
        return v if v is None else _unique(v)

    @field_validator("synchronous_commit")
    @classmethod
    def _sync(cls, v: list[str]) -> list[str]:
        return _unique(v)

    @field_validator("parameters")
    @classmethod
    def _params(cls, v: dict[str, list[ParamValue]]) -> dict[str, list[ParamValue]]:
        for name, values in v.items():
            _check_param_name(name)
            if not values:
                raise PydanticCustomError("param", "axis 'parameters.{name}' needs at least one value",
                                          {"name": name, "at": name})
            if len({(type(x), x) for x in values}) != len(values):
                raise PydanticCustomError("param", "values must be unique", {"at": name})
        return v

    @field_validator("workload")
    @classmethod
    def _workloads(cls, v: list[Any]) -> list[Any]:
        names = [w if isinstance(w, str) else w.name for w in v]
        if len(set(names)) != len(names):
            raise PydanticCustomError("workload", "workload names must be unique")
        return v

    @model_validator(mode="after")
    def _size(self) -> Matrix:
        axes = {"workload": len(self.workload), "synchronous_commit": len(self.synchronous_commit),
                "clients": len(self.clients), "jobs": len(self.jobs or [1])}
        axes.update({f"parameters.{name}": len(values) for name, values in self.parameters.items()})
        axes["cpus"] = len(self.cpus or [1])
        axes["scenario"] = len(self.scenario or [1])
        axes["storage"] = len(self.storage or [1])
        if math.prod(axes.values()) > MAX_POINTS:
            sizes = " × ".join(f"{n} {axis}" for axis, n in axes.items() if n > 1)
            raise PydanticCustomError("matrix", "{sizes} make {points} points, more than {max}; shorten an axis",
                                      {"sizes": sizes, "points": math.prod(axes.values()), "max": MAX_POINTS})
        return self

    @property
    def points(self) -> int:
        """How many points the axes make (at most; see expand)."""
        return math.prod([len(self.workload), len(self.synchronous_commit), len(self.clients), len(self.jobs or [1]),
                          len(self.cpus or [1]), len(self.scenario or [1]), len(self.storage or [1]),
                          *(len(values) for values in self.parameters.values())])


def _unique(values: list[Any]) -> list[Any]:
    if len(set(values)) != len(values):
        raise PydanticCustomError("unique", "values must be unique")
    return values


def _percent(value: Any) -> float:
    """``5%`` (or a bare number, read as percent): in (0, 100)."""
    text = value.strip().removesuffix("%").strip() if isinstance(value, str) and value.strip().endswith("%") else None
    try:
        number = float(text) if text is not None else value
    except ValueError:
        number = None
    if isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number):
        raise PydanticCustomError("percent", "must be a percentage such as 5%")
    if not 0 < number < 100:
        raise PydanticCustomError("percent", "must be more than 0% and less than 100%")
    return float(number)


Percent = Annotated[float, BeforeValidator(_percent)]


class AdaptiveRepeats(Strict):
    """Repeat a point until its TPS is known well enough, as pyperf and the Phoronix suite do: at least ``min``
    runs, then more (one round at a time) until the 95 % interval's half-width is within ``target_ci`` of the mean,
    or ``max`` runs."""

    min: Annotated[int, _int_between(2, MAX_REPEATS, "an integer of at least 2 (an interval needs two runs)")] = (
        Field(3, description="runs before the interval is first checked (at least 2)"))
    max: Annotated[int, _int_between(2, MAX_REPEATS, "an integer of at least 2")] = Field(
        10, description="runs at most, even when the interval is still wider")
    target_ci: Percent = Field(description="half-width of TPS's 95 % interval, % of the mean, e.g. 5%")

    @model_validator(mode="after")
    def _bounds(self) -> AdaptiveRepeats:
        if self.max < self.min:
            raise PydanticCustomError("run", "max ({max}) must be at least min ({min})",
                                      {"max": self.max, "min": self.min, "at": "max"})
        return self


# a count, or a mapping of adaptive settings: told apart by the input's type, so each gets its own messages
Repeats = Annotated[Annotated[Annotated[int, _int_between(1, MAX_REPEATS)], Tag("count")]
                    | Annotated[AdaptiveRepeats, Tag("adaptive")],
                    Discriminator(lambda v: "adaptive" if isinstance(v, dict | AdaptiveRepeats) else "count")]


class Run(Strict):
    duration: Seconds | None = Field(None, description="measured seconds per run (default 60 s)")
    transactions: Annotated[int, _int_between(1, MAX_TRANSACTIONS)] | None = Field(
        None, description="transactions per client instead of duration")
    warmup: Seconds = Field(0.0, description="run before the measured window, outside it")
    repeats: Repeats = Field(
        1, description="runs per point, or {min, max, target_ci} to repeat until TPS is known within target_ci")
    order: Literal["interleaved", "sequential"] = Field(
        "interleaved", description="interleaved: each round runs every point once, in a shuffled order, so drift "
                                   "spreads over the points; CPU steps and parameter sets form blocks")
    seed: Annotated[int, _int_between(0, 2**63 - 1, "a non-negative integer")] | None = Field(
        None, description="seed of the interleaved order (default: drawn and recorded with the sweep)")
    rate: Rate | None = Field(None, description="target transactions/s (pgbench -R); as an axis: matrix.rate")
    latency_limit: Seconds | None = Field(
        None, description="pgbench --latency-limit (e.g. '5ms'): transactions slower count as late; with a rate, "
        "those already that late at their scheduled start are skipped")
    sampling_rate: Annotated[float, _number_between(0, 1, low_open=True)] = Field(
        1.0, description="share of transactions logged (pgbench --sampling-rate)")
    protocol: Literal["simple", "extended", "prepared"] = Field(
        "simple", description="query protocol of pgbench (-M)")
    pause: Seconds = Field(0.0, description="idle seconds between runs")
    load_pods: Annotated[int, _int_between(1, MAX_LOAD_PODS)] = Field(
        1, description="Kubernetes: pgbench pods that drive each run together (one Indexed Job, on distinct nodes "
        "where possible): the point's clients and threads split over them, TPS summed over their common window, "
        "latency from their merged transaction logs")

    @field_validator("duration")
    @classmethod
    def _duration(cls, v: float | None) -> float | None:
        if v is not None and v < 1:
            raise PydanticCustomError("run", "must be at least 1 second")
        return v

    @model_validator(mode="after")
    def _duration_or_tx(self) -> Run:
        if self.duration is not None and self.transactions is not None:
            raise PydanticCustomError("run", "give either 'duration' or 'transactions', not both")
        return self

    @property
    def min_repeats(self) -> int:
        return self.repeats.min if isinstance(self.repeats, AdaptiveRepeats) else self.repeats

    @property
    def max_repeats(self) -> int:
        return self.repeats.max if isinstance(self.repeats, AdaptiveRepeats) else self.repeats

    @property
    def target_ci_pct(self) -> float | None:
        return self.repeats.target_ci if isinstance(self.repeats, AdaptiveRepeats) else None

    @property
    def measured_seconds(self) -> float | None:
        if self.transactions is not None:
            return None
        return self.duration if self.duration is not None else 60.0


class Probes(Strict):
    wait_hz: Annotated[float, _number_between(1, 50)] = Field(5.0, description="wait-event sampling rate")
    enabled: bool = Field(True, description="false: no disk, CPU, memory or PostgreSQL sampling during runs "
                          "(pgbench's own figures only)")


FioProfile = Literal["randread-8k", "randwrite-8k", "wal-fdatasync-8k", "seqread-1m", "seqwrite-1m", "mixed-70-30-8k"]
StoragePath = Literal["data", "wal"]


class Storage(Strict):
    """The storage phase: fio on the lab's own data and WAL paths, before the database phase."""

    profiles: list[FioProfile] = Field(
        default_factory=lambda: list[FioProfile](["randread-8k", "randwrite-8k", "wal-fdatasync-8k", "seqwrite-1m"]),
        description="built-in fio jobs: 8 KiB random IO, WAL-like 8 KiB writes with fdatasync, 1 MiB sequential IO")
    job_files: list[PlanFile] = Field(default_factory=list, max_length=100,
                                      description="custom fio job files (relative to the plan's folder)")
    runtime: Seconds = Field(30.0, description="seconds per fio job")
    size: PlanSize = Field("1GiB", validate_default=True, description="size of each job's test file")
    paths: list[StoragePath] = Field(default_factory=lambda: list[StoragePath](["data", "wal"]), min_length=1,
                                     description="which of the lab's paths fio measures: data, wal or both")

    @field_validator("runtime")
    @classmethod
    def _runtime(cls, v: float) -> float:
        if v < 1:
            raise PydanticCustomError("runtime", "must be at least 1 second")
        return v

    @field_validator("profiles", "paths")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        return _unique(v)


class Plan(Strict):
    name: str = Field(description="the plan's name: 1-63 letters, digits, '-', '_' or '.'; the default results "
                      "folder is results/<name>")
    description: Annotated[str, _text(MAX_TEXT, multiline=True)] | None = Field(
        None, description="free text stored with the results and shown in reports")
    target: Target = Field(default_factory=lambda: Target(local=LocalTarget()),
                           description="where PostgreSQL runs: exactly one of local, external, kubernetes")
    postgres: Postgres = Field(default_factory=Postgres, description="server settings for every point")
    dataset: Dataset = Field(default_factory=Dataset, description="the pgbench dataset and how runs start from it")
    matrix: Matrix = Field(default_factory=Matrix, description="the axes swept; every combination is one point")
    run: Run = Field(default_factory=Run, description="how long each run lasts, how often points repeat, in which "
                     "order")
    probes: Probes = Field(default_factory=Probes, description="what is sampled during runs")
    storage: Storage | None = Field(None, description="run fio on the lab's paths before the database phase")
    cost: Cost | None = Field(None, description="monthly price, for cost per TPS")
    capacity: Capacity | None = Field(None, description="search, for each point of the matrix, the highest rate "
                                      "(transactions/s) whose latency percentile stays under a target")
    tenants: Tenants | None = Field(None, description="many tenants in QoS tiers, measured in the same window "
                                    "(instead of the matrix): on one local host, or a CloudNativePG Cluster each on "
                                    "Kubernetes")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise PydanticCustomError("name", "must be 1-63 letters, digits, '-', '_' or '.'")
        return v

    @model_validator(mode="after")
    def _external_is_not_reconfigured(self) -> Plan:
        if self.target.external is None:
            return self
        for given, field in ((self.postgres.parameters, "postgres.parameters"),
                             (self.matrix.parameters, "matrix.parameters"), (self.storage, "storage"),
                             (self.matrix.cpus, "matrix.cpus"), (self.dataset.reset == "snapshot", "dataset.reset")):
            if given:
                raise PydanticCustomError("external", "an external target is measured as it is (pglab never "
                                          "changes its settings nor runs fio on its disks); remove this",
                                          {"at": field})
        return self

    @model_validator(mode="after")
    def _kubernetes_fits(self) -> Plan:
        """What the Kubernetes target cannot do yet is refused here, not discovered half-way through a sweep."""
        k8s = self.target.kubernetes
        if k8s is None:
            return self
        for where, names in (("postgres.parameters", self.postgres.parameters),
                             ("matrix.parameters", self.matrix.parameters)):
            for name in names:
                if name in K8S_FIXED_PARAMETERS:
                    raise PydanticCustomError("kubernetes", "'{name}' is managed by CloudNativePG and cannot be set "
                                              "on a Kubernetes target", {"name": name, "at": f"{where}.{name}"})
        for given, field, why in (
                (self.storage and self.storage.job_files, "storage.job_files", "custom fio job files"),
                (self.dataset.reset == "snapshot", "dataset.reset", "resetting to a snapshot")):
            if given:
                raise PydanticCustomError("kubernetes", "{why} is not available on a Kubernetes target yet; remove "
                                          "this", {"why": why, "at": field})
        if self.storage and k8s.wal_storage is None and self.storage.paths == ["wal"]:
            raise PydanticCustomError("kubernetes", "'wal' needs target.kubernetes.wal_storage: without it the WAL "
                                      "is on the data volume", {"at": "storage.paths"})
        return self

    @model_validator(mode="after")
    def _one_rate(self) -> Plan:
        """A rate is one value (run.rate) or an axis (matrix.rate), not both; tenants carry their own load."""
        if self.matrix.rate and self.run.rate is not None:
            raise PydanticCustomError("rate", "run.rate and matrix.rate both set the rate; keep one",
                                      {"at": "run.rate"})
        for given, field in ((self.matrix.rate, "matrix.rate"), (self.run.rate, "run.rate"),
                             (self.tenants, "tenants"), (self.matrix.scenario, "matrix.scenario")):
            if self.capacity is not None and given:
                raise PydanticCustomError("capacity", "the capacity search chooses the rates itself and measures "
                                          "one load; remove this", {"at": field})
        if self.capacity is not None and self.run.target_ci_pct is not None:
            raise PydanticCustomError("capacity", "the capacity search runs each probe rate a fixed number of times; "
                                      "give repeats as a number", {"at": "run.repeats"})
        if self.matrix.rate and self.tenants is not None:
            raise PydanticCustomError("rate", "the rate axis is not for tenants plans (each tier sets its own "
                                      "load); remove it", {"at": "matrix.rate"})
        return self

    @model_validator(mode="after")
    def _storage_axis_fits(self) -> Plan:
        """The storage axis builds a CloudNativePG Cluster per value: Kubernetes only."""
        if not self.matrix.storage:
            return self
        if self.target.kubernetes is None:
            raise PydanticCustomError("storage_axis", "the storage axis builds a CloudNativePG Cluster per value and "
                                      "runs on a Kubernetes target only; remove it (on a local lab, compare paths "
                                      "with one plan per path)", {"at": "matrix.storage"})
        cluster = self.target.kubernetes.cluster_name
        for i, option in enumerate(self.matrix.storage):
            # the value's fio Job on the last instance's node: a label value, 63 at most
            longest = f"{cluster}-fio-{option.name}-data-{self.target.kubernetes.instances}"
            if len(longest) > 63:
                raise PydanticCustomError("storage_axis", "'{name}' with cluster_name '{cluster}' makes names "
                                          "longer than Kubernetes allows (63); shorten one of them",
                                          {"name": option.name, "cluster": cluster, "at": f"matrix.storage.{i}.name"})
        return self

    @model_validator(mode="after")
    def _scenarios_fit(self) -> Plan:
        local = self.target.local
        ha = local is not None and local.ha is not None
        if ha and self.dataset.reset == "snapshot":  # Patroni owns the data directories: no snapshot restore yet
            raise PydanticCustomError("ha", "not available with target.local.ha yet; remove it",
                                      {"at": "dataset.reset"})
        for i, sc in enumerate(self.matrix.scenario or []):
            at = f"matrix.scenario.{i}"
            k8s = self.target.kubernetes
            if k8s is not None:  # pglab asks CloudNativePG (or deletes the primary pod); the operator does the rest
                if sc.kind == "backup" and k8s.wal_archive is None:
                    raise PydanticCustomError("scenario", "a backup on Kubernetes needs target.kubernetes.wal_archive "
                                              "(the object store the Barman Cloud plugin archives WAL and writes "
                                              "the base backup to)", {"at": f"{at}.kind"})
                if sc.kind == "backup" and sc.max_rate is not None:
                    raise PydanticCustomError("scenario", "max_rate is pg_basebackup's: the Barman Cloud plugin's "
                                              "backup has no rate limit; remove it", {"at": f"{at}.max_rate"})
                if sc.kind == "node-loss" and k8s.node_fault is None:
                    raise PydanticCustomError("scenario", "a node-loss needs target.kubernetes.node_fault: the "
                                              "commands that stop and start a node (Kubernetes cannot power a "
                                              "machine off)", {"at": f"{at}.kind"})
                if sc.kind == "failover" and sc.kill != "node":
                    raise PydanticCustomError("scenario", "on Kubernetes a failover deletes the primary pod (kill: "
                                              "node); kill: postgres is not available there", {"at": f"{at}.kill"})
                if k8s.instances < 2 and sc.kind != "backup":
                    raise PydanticCustomError("scenario", "a {kind} needs a standby: raise "
                                              "target.kubernetes.instances", {"kind": sc.kind, "at": f"{at}.kind"})
            elif sc.kind in ("node-loss", "node-drain"):
                raise PydanticCustomError("scenario", "{kind} runs on a Kubernetes target only (the local lab's "
                                          "failover with kill: node is its node loss)",
                                          {"kind": sc.kind, "at": f"{at}.kind"})
            elif local is None:
                raise PydanticCustomError("scenario", "scenarios run on the local lab only (pglab must be able to "
                                          "kill and restart the servers)", {"at": at})
            elif sc.kind in ("failover", "switchover") and not ha:
                raise PydanticCustomError("scenario", "a {kind} needs target.local.ha: patroni (something must "
                                          "elect the new primary)", {"kind": sc.kind, "at": f"{at}.kind"})
            if sc.kind == "standby-loss" and local is not None and local.instances < 2:
                raise PydanticCustomError("scenario", "standby-loss needs a standby: raise target.local.instances",
                                          {"at": f"{at}.kind"})
            seconds = self.run.measured_seconds
            if seconds is None:
                raise PydanticCustomError("scenario", "a scenario needs run.duration, not run.transactions",
                                          {"at": "run.transactions"})
            end = sc.at + (sc.down if sc.kind == "standby-loss" else 0)
            if end >= seconds:
                raise PydanticCustomError("scenario", "the scenario ends at {end} s, after the {seconds} s run; "
                                          "lower 'at' or raise run.duration", {"end": f"{end:g}",
                                                                                "seconds": f"{seconds:g}",
                                                                                "at": f"{at}.at"})
        return self

    @model_validator(mode="after")
    def _tenants_fit(self) -> Plan:
        """Tenants replace the single lab and the matrix: what would be ignored with them is refused."""
        if self.tenants is None:
            return self
        if self.target.kubernetes is not None:
            return self._kubernetes_tenants_fit()
        local = self.target.local
        if local is None:
            raise PydanticCustomError("tenants", "tenants run on the local target or on Kubernetes (pglab builds "
                                      "every tenant); use target: {local: {}} or target: {kubernetes: {…}}",
                                      {"at": "target"})
        for i, a in enumerate(self.tenants.arrangements):
            for j, t in enumerate(a.tiers):
                for field in ("storage", "namespace"):
                    if getattr(t, field) is not None:
                        raise PydanticCustomError("tenants", "is for a Kubernetes target; on a local lab remove it",
                                                  {"at": f"tenants.arrangements.{i}.tiers.{j}.{field}"})
        given = [("target.local.instances", "instances" in local.model_fields_set, "set tenants.instances instead"),
                 ("target.local.resources", local.resources is not None, "give each tier its resources instead"),
                 ("target.local.client", local.client is not None, "not available with tenants yet; remove it"),
                 ("target.local.network", local.network is not None, "not available with tenants yet; remove it"),
                 ("target.local.ha", local.ha is not None, "not available with tenants; remove it"),
                 ("matrix", "matrix" in self.model_fields_set, "each tier gives its tenants' workload, clients and "
                  "synchronous_commit; remove the matrix")]
        for field, present, what in given:
            if present:
                raise PydanticCustomError("tenants", "{what}", {"what": what, "at": field})
        if self.tenants.instances == 1 and any(t.synchronous_commit in ("remote_write", "remote_apply")
                                               for a in self.tenants.arrangements for t in a.tiers):
            raise PydanticCustomError("tenants", "remote_write and remote_apply need a standby: raise "
                                      "tenants.instances or use on/local/off", {"at": "tenants.arrangements"})
        return self

    def _kubernetes_tenants_fit(self) -> Plan:
        """Tenants on Kubernetes: a CloudNativePG Cluster per tenant, each tier's resources and storage class; what
        it cannot honour is refused."""
        k8s, tenants = self.target.kubernetes, self.tenants
        assert k8s is not None and tenants is not None
        given = [("target.kubernetes.instances", "instances" in k8s.model_fields_set, "set tenants.instances instead"),
                 ("matrix", "matrix" in self.model_fields_set, "each tier gives its tenants' workload, clients and "
                  "synchronous_commit; remove the matrix"),
                 ("storage", self.storage is not None, "the storage phase is not available with tenants on "
                  "Kubernetes yet; remove it"),
                 ("tenants.parallel_builds", tenants.parallel_builds is not None, "a Kubernetes cluster builds every "
                  "tenant's Cluster at once; remove it")]
        for field, present, what in given:
            if present:
                raise PydanticCustomError("tenants", "{what}", {"what": what, "at": field})
        if k8s.synchronous is not None and "synchronous" in k8s.model_fields_set and \
                k8s.synchronous.number >= tenants.instances:
            raise PydanticCustomError("tenants", "synchronous.number ({number}) must be lower than tenants.instances "
                                      "({instances}); raise tenants.instances or set synchronous: null",
                                      {"number": k8s.synchronous.number, "instances": tenants.instances,
                                       "at": "target.kubernetes.synchronous.number"})
        if tenants.instances == 1 and any(t.synchronous_commit in ("remote_write", "remote_apply")
                                          for a in tenants.arrangements for t in a.tiers):
            raise PydanticCustomError("tenants", "remote_write and remote_apply need a standby: raise "
                                      "tenants.instances or use on/local/off", {"at": "tenants.arrangements"})
        for i, a in enumerate(tenants.arrangements):
            width = max(2, len(str(a.tenant_count)))
            for j, t in enumerate(a.tiers):
                at = f"tenants.arrangements.{i}.tiers.{j}"
                if not _DNS_LABEL.fullmatch(t.name):
                    raise PydanticCustomError("tenants", "on Kubernetes a tier's name labels its Clusters: use "
                                              "lower-case letters, digits and '-'", {"at": f"{at}.name"})
                r = t.resources
                if r is not None and any(v is not None for v in (r.read_iops, r.write_iops, r.read_mbps,
                                                                 r.write_mbps)):
                    raise PydanticCustomError("tenants", "IO limits are not available on Kubernetes (give the tier a "
                                              "storage class with the limits instead: storage.class); remove them",
                                              {"at": f"{at}.resources"})
                if isinstance(t.workload, CustomWorkload) and any(s.file for s in t.workload.scripts):
                    raise PydanticCustomError("tenants", "script files are not available with tenants on Kubernetes "
                                              "yet; use built-in scripts", {"at": f"{at}.workload"})
            if len(f"{k8s.cluster_name}-t{'0' * width}-pgbench-init") > 63:
                raise PydanticCustomError("tenants", "'{cluster}' is too long to name the tenants' Clusters and Jobs "
                                          "(63 characters at most); shorten it",
                                          {"cluster": k8s.cluster_name, "at": "target.kubernetes.cluster_name"})
        return self

    @model_validator(mode="after")
    def _load_pods_fit(self) -> Plan:
        """run.load_pods: several pgbench pods per run exist on a Kubernetes target only, each with a client."""
        n = self.run.load_pods
        if n == 1:
            return self
        if self.target.kubernetes is None:
            raise PydanticCustomError("load_pods", "spreading a run over pgbench pods needs target: kubernetes; "
                                      "remove run.load_pods", {"at": "run.load_pods"})
        fewest = min(self.matrix.clients)
        if fewest < n:
            raise PydanticCustomError("load_pods", "{n} pods need at least {n} clients, but matrix.clients has "
                                      "{fewest}; lower run.load_pods or raise the clients",
                                      {"n": n, "fewest": fewest, "at": "run.load_pods"})
        if self.matrix.scenario:
            raise PydanticCustomError("load_pods", "scenarios run with one pgbench pod (load_pods: 1); remove "
                                      "run.load_pods or matrix.scenario", {"at": "run.load_pods"})
        return self

    @model_validator(mode="after")
    def _runs(self) -> Plan:
        probes = self.capacity.max_probes if self.capacity else 1
        runs = self.matrix.points * self.run.max_repeats * probes
        if runs > MAX_RUNS:
            raise PydanticCustomError("plan", "{points} points × {repeats} repeats{probes} make {runs} runs, more "
                                      "than {max}; lower run.repeats or shorten an axis",
                                      {"points": self.matrix.points, "repeats": self.run.max_repeats, "runs": runs,
                                       "probes": f" × {probes} capacity probes" if self.capacity else "",
                                       "max": MAX_RUNS, "at": "run.repeats"})
        return self
