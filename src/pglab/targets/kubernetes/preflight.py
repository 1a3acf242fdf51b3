"""``pglab k8s check PLAN``: what a Kubernetes sweep would trip on, asked of the cluster before anything is created.

Why: on a cluster a sweep fails late and far from its cause. A Cluster that cannot be scheduled (too few nodes for a
required anti-affinity, a taint the plan does not tolerate) or whose claims name a missing storage class waits out
the 30 min readiness timeout; a missing permission fails halfway, with objects to clean up; an operator older than a
field the plan sets drops it without a word. Each check here only reads (GETs and SelfSubjectAccessReviews): nothing
is created, nothing is pulled. ``pglab run`` runs them first and stops at the first blocking one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import urllib3
from kubernetes import client  # the client ships no type information (pyproject's mypy section)
from kubernetes.client.rest import ApiException

from pglab.errors import UserError, first_line
from pglab.plan.schema import KubernetesTarget, Placement, Plan, Toleration
from pglab.targets.kubernetes.render import BARMAN_PLUGIN, rbac, target_of

Level = Literal["ok", "warn", "FAIL", "info"]
TIMEOUT = (5.0, 15.0)  # connect, read: a preflight that hangs is worse than none
CRD = "clusters.postgresql.cnpg.io"
CNPG_GROUP = "postgresql.cnpg.io"
OPERATOR_LABEL = "app.kubernetes.io/name=cloudnative-pg"  # the release manifest's and the Helm chart's label
OPERATOR_IMAGE = "cloudnative-pg"  # ghcr.io/cloudnative-pg/cloudnative-pg:1.27.0 (its operand is …/postgresql)
DEFAULT_CLASS = ("storageclass.kubernetes.io/is-default-class", "storageclass.beta.kubernetes.io/is-default-class")
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")  # PreferNoSchedule only steers the scheduler
RBAC_DOC = "docs/kubernetes.md, 'RBAC pglab needs'"


@dataclass(frozen=True)
class Finding:
    """One printed line: ``ok``, ``warn`` (non-blocking), ``FAIL`` (blocking) or ``info``, and its sentence."""

    level: Level
    text: str

    @property
    def blocking(self) -> bool:
        return self.level == "FAIL"

    @property
    def line(self) -> str:
        return f"{self.level:<6}{self.text}"


class PreflightError(UserError):
    """A check found a blocking problem; the message is its sentence (the field or thing, and what to do)."""

    def __init__(self, findings: list[Finding]):
        self.findings = findings
        super().__init__(next(f.text for f in findings if f.blocking))


Check = Callable[[Plan, client.ApiClient], list[Finding]]


def run_checks(plan: Plan, api: client.ApiClient, emit: Callable[[Finding], None] = lambda _: None) -> list[Finding]:
    """Every check in order, each finding emitted as it comes; after the first check with a blocking finding,
    ``PreflightError`` (the later checks would read a cluster the plan cannot use anyway)."""
    found: list[Finding] = []
    checks: tuple[Check, ...] = (check_server, check_operator, check_wal_archive, check_nodes, check_storage_classes,
                                 check_access, check_images)
    for check in checks:
        try:
            results = check(plan, api)
        except urllib3.exceptions.HTTPError as exc:  # the API server went away in the middle
            results = [Finding("FAIL", f"kubeconfig: {api.configuration.host} stopped answering ({_why(exc)}); "
                                       "check that the cluster is up")]
        for f in results:
            emit(f)
        found += results
        if any(f.blocking for f in results):
            raise PreflightError(found)
    return found


# ------------------------------------------------------------------ reading the cluster
def _read(call: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """A call's JSON as plain data: the client's typed models refuse some real objects (CRDs without conditions)."""
    resp = call(*args, _preload_content=False, _request_timeout=TIMEOUT, **kw)
    return json.loads(resp.data or b"null")


def _why(exc: BaseException) -> str:
    """urllib3's long wrapper reduced to its cause (``Connection refused``, a name that does not resolve)."""
    text = str(getattr(exc, "reason", None) or exc)
    for marker in ("Failed to establish a new connection: ", "Failed to resolve "):
        if marker in text:
            text = text.split(marker, 1)[1]
    return first_line(Exception(text.rstrip(")'\"")))


def _status(exc: ApiException) -> str:
    return f"{exc.status} {exc.reason}".strip()


# ------------------------------------------------------------------ 1. the API server
def check_server(plan: Plan, api: client.ApiClient) -> list[Finding]:
    """The kubeconfig's server answers /version (with the kubeconfig's credentials)."""
    k8s = target_of(plan)
    where = f"{api.configuration.host}{' (context ' + k8s.context + ')' if k8s.context else ''}"
    fix = "check target.kubernetes.kubeconfig and context"
    try:
        version = _read(client.VersionApi(api).get_code)
    except ApiException as exc:
        if exc.status == 401:
            return [Finding("FAIL", f"kubeconfig: {where} refused its credentials (401 Unauthorized); renew them "
                                    f"or {fix}")]
        why = _status(exc) if exc.status else first_line(Exception(str(exc.reason)))
        return [Finding("FAIL", f"kubeconfig: {where} answered /version with {why}; {fix}")]
    except urllib3.exceptions.HTTPError as exc:
        return [Finding("FAIL", f"kubeconfig: {where} does not answer ({_why(exc)}); check that the cluster is up, "
                                f"or {fix}")]
    return [Finding("ok", f"kubeconfig: {where} reachable (Kubernetes {version.get('gitVersion', '?')})")]


# ------------------------------------------------------------------ 2. CloudNativePG
class Version(NamedTuple):
    """An operator version; a pre-release (1.25.0-rc1) sorts before its release."""

    major: int
    minor: int
    patch: int
    final: bool = True

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}{'' if self.final else ' (pre-release)'}"


_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?$")


def image_tag(image: str) -> str | None:
    """The tag of an image reference (``…/cloudnative-pg:1.27.0@sha256:…`` → ``1.27.0``), None when untagged."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


def parse_version(tag: str | None) -> Version | None:
    """``1.27.0``, ``v1.25.1``, ``1.26.0-rc1`` as a Version; None for what is no version (``latest``, a digest)."""
    m = _VERSION.match(tag or "")
    if m is None:
        return None
    return Version(int(m[1]), int(m[2]), int(m[3]), final=m[4] is None)


class Need(NamedTuple):
    """The operator version a part of the plan needs, and whether an older one blocks the sweep."""

    version: Version
    what: str
    blocking: bool


def operator_needs(k8s: KubernetesTarget) -> list[Need]:
    """What the plan's fields need of CloudNativePG (docs/kubernetes.md, 'On a real cluster')."""
    needs = []
    if k8s.synchronous is not None:
        needs.append(Need(Version(1, 24, 0), "target.kubernetes.synchronous (.spec.postgresql.synchronous, dropped "
                                             "by older operators: the replication would be asynchronous)", True))
        if k8s.synchronous.data_durability == "preferred":
            needs.append(Need(Version(1, 25, 0), "synchronous.data_durability: preferred (older operators drop "
                                                 "dataDurability without a word: it would silently be required)",
                              True))
    needs.append(Need(Version(1, 25, 1), "the WAL figures (1.24.x and 1.25.0 lose them after an instance restart: "
                                         "every CPU step, a failover)", False))
    return needs


def _operator_image(deployment: dict[str, Any]) -> str | None:
    """The image of the Deployment's operator container (its image's name, not its path, says cloudnative-pg)."""
    containers = deployment.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []
    images = [str(c.get("image") or "") for c in containers]
    return next((i for i in images if _named_operator(i)), images[0] if images else None)


def _named_operator(image: str) -> bool:
    """An image whose name (not its registry path, which the operand images share) says cloudnative-pg."""
    return OPERATOR_IMAGE in image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]


def _operator_deployments(api: client.ApiClient) -> list[dict[str, Any]]:
    """The operator's Deployments in any namespace: by its label, else by a container image named cloudnative-pg."""
    apps = client.AppsV1Api(api)
    items = _read(apps.list_deployment_for_all_namespaces, label_selector=OPERATOR_LABEL).get("items") or []
    if items:
        return list(items)
    everything = _read(apps.list_deployment_for_all_namespaces).get("items") or []
    return [d for d in everything
            if any(_named_operator(str(c.get("image") or ""))
                   for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or [])]


def _crd_present(api: client.ApiClient) -> Finding | None:
    """None when the Cluster CRD serves v1; else the finding that says why not (or that it cannot be known)."""
    try:
        crd = _read(client.ApiextensionsV1Api(api).read_custom_resource_definition, CRD)
    except ApiException as exc:
        if exc.status == 404:
            return Finding("FAIL", f"CloudNativePG: CRD {CRD} not found, the operator is not installed; install "
                                   "CloudNativePG 1.25.1 or newer (docs/kubernetes.md, 'On a real cluster')")
        try:  # no permission on CRDs: API discovery is open to every authenticated identity
            groups = _read(client.ApisApi(api).get_api_versions).get("groups") or []
        except ApiException:
            return Finding("warn", f"CloudNativePG: CRD {CRD} cannot be read ({_status(exc)}) nor the API groups "
                                   "listed: whether the operator is installed is not known")
        versions = {v.get("version") for g in groups if g.get("name") == CNPG_GROUP for v in g.get("versions", [])}
        if "v1" not in versions:
            return Finding("FAIL", f"CloudNativePG: the API server serves no {CNPG_GROUP}/v1, the operator is not "
                                   "installed; install CloudNativePG 1.25.1 or newer (docs/kubernetes.md)")
        return None
    served = {v.get("name") for v in crd.get("spec", {}).get("versions", []) if v.get("served")}
    if "v1" not in served:
        return Finding("FAIL", f"CloudNativePG: CRD {CRD} serves {', '.join(sorted(served)) or 'no version'}, not "
                               "v1; upgrade the operator to 1.25.1 or newer")
    return None


def check_operator(plan: Plan, api: client.ApiClient) -> list[Finding]:
    """The Cluster CRD is there, and the operator is as recent as the plan's fields need (read from its image)."""
    k8s = target_of(plan)
    if (missing := _crd_present(api)) is not None and missing.blocking:
        return [missing]
    out = [missing] if missing is not None else []
    needs = operator_needs(k8s)
    hard = [n for n in needs if n.blocking]
    wanted = (f"; the plan needs {max(n.version for n in hard)} or newer for {', '.join(n.what for n in hard)}"
              if hard else "")
    try:
        deployments = _operator_deployments(api)
    except ApiException as exc:
        return [*out, Finding("warn", f"CloudNativePG: CRD {CRD} present; the operator's version cannot be read "
                                      f"(listing deployments: {_status(exc)}){wanted}")]
    found: list[tuple[Version, str, str]] = []  # (version, namespace/name, image)
    for d in deployments:
        where = f"{d.get('metadata', {}).get('namespace')}/{d.get('metadata', {}).get('name')}"
        image = _operator_image(d) or "?"
        version = parse_version(image_tag(image))
        if version is None:
            return [*out, Finding("warn", f"CloudNativePG: CRD {CRD} present; the operator's version cannot be read "
                                          f"from its image {image} (Deployment {where}){wanted}")]
        found.append((version, where, image))
    if not found:
        return [*out, Finding("warn", f"CloudNativePG: CRD {CRD} present, but no operator Deployment found (label "
                                      f"{OPERATOR_LABEL}, or an image named {OPERATOR_IMAGE}): a Cluster nobody "
                                      f"reconciles never becomes healthy{wanted}")]
    version, where, image = min(found)  # several installs: the oldest decides
    for need in needs:
        if version < need.version:
            level: Level = "FAIL" if need.blocking else "warn"
            fix = ("; upgrade the operator (docs/kubernetes.md, 'On a real cluster')" if need.blocking else "")
            out.append(Finding(level, f"CloudNativePG {version} (Deployment {where}): {need.what} needs "
                                      f"{need.version} or newer{fix}"))
            if need.blocking:
                return out
    return [*out, Finding("ok", f"CloudNativePG: CRD {CRD} present, operator {version} (Deployment {where})")]


# ------------------------------------------------------------------ 3. nodes
@dataclass(frozen=True)
class Node:
    """What the scheduler's filters read of a node for pglab's pods: labels, taints, cordon, readiness."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect)
    unschedulable: bool = False
    ready: bool = True

    @classmethod
    def of(cls, obj: dict[str, Any]) -> Node:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        taints = tuple((str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
                       for t in spec.get("taints") or [])
        conditions = (obj.get("status") or {}).get("conditions") or []
        ready = all(c.get("status") == "True" for c in conditions if c.get("type") == "Ready")
        return cls(str(meta.get("name")), dict(meta.get("labels") or {}), taints, bool(spec.get("unschedulable")),
                   ready)

    def domain(self, key: str) -> str:
        """The node's topology domain under ``key``; a node without the label is a domain of its own."""
        return self.labels.get(key, f"\0{self.name}")


ZONE_LABEL = "topology.kubernetes.io/zone"


def tolerates(tolerations: Iterable[Toleration], key: str, value: str, effect: str) -> bool:
    """The Kubernetes rule (``Toleration.ToleratesTaint``): effect and key match when given; Exists ignores the
    value, Equal compares it."""
    for t in tolerations:
        if t.effect and t.effect != effect:
            continue
        if t.key and t.key != key:
            continue
        if t.operator == "Exists" or (t.value or "") == value:
            return True
    return False


def refusal(node: Node, placement: Placement) -> str | None:
    """Why a pod of ``placement`` cannot go to ``node`` (its selector, an untolerated taint, a cordon), or None."""
    if node.unschedulable:
        return "cordoned"
    if not node.ready:
        return "not Ready"
    missing = [f"{k}={v}" for k, v in placement.node_selector.items() if node.labels.get(k) != v]
    if missing:
        return f"no label {', '.join(missing)}"
    for key, value, effect in node.taints:
        if effect in BLOCKING_EFFECTS and not tolerates(placement.tolerations, key, value, effect):
            return f"taint {key}{'=' + value if value else ''}:{effect} not tolerated"
    return None


def _fits(nodes: list[Node], db: Placement, instances: int) -> bool:
    """Whether the instances can be placed on ``nodes``: one per topology domain when the anti-affinity is
    required (CloudNativePG's podAntiAffinityType), anywhere otherwise."""
    if db.anti_affinity == "required":
        return len({n.domain(db.topology_key) for n in nodes}) >= instances
    return bool(nodes)


def _selector(p: Placement) -> str:
    rules = ", ".join(f"{k}={v}" for k, v in p.node_selector.items()) or "any labels"
    return f"{rules}{' and ' + str(len(p.tolerations)) + ' toleration(s)' if p.tolerations else ''}"


def _refused(nodes: list[Node], placement: Placement, limit: int = 6) -> str:
    """The nodes a placement cannot use and why, those refused for something else than their labels first."""
    why = sorted(((r, n.name) for n in nodes if (r := refusal(n, placement)) is not None),
                 key=lambda x: (x[0].startswith("no label"), x[1]))
    shown = [f"{name} ({r})" for r, name in why[:limit]]
    return "; ".join(shown) + (f"; {len(why) - limit} more" if len(why) > limit else "")


def database_nodes(k8s: KubernetesTarget, nodes: list[Node]) -> tuple[list[Node], Finding]:
    """The nodes the instances may use, and whether they are enough for the instances and their anti-affinity."""
    db = k8s.database
    usable = [n for n in nodes if refusal(n, db) is None]
    names = ", ".join(n.name for n in usable) or "none"
    domains = len({n.domain(db.topology_key) for n in usable})
    if not _fits(usable, db, k8s.instances):
        need = (f"{k8s.instances} schedulable nodes apart by {db.topology_key} (anti_affinity: required)"
                if db.anti_affinity == "required" else "a schedulable node")
        fix = ("label or untaint more nodes, or set database.anti_affinity: preferred"
               if db.anti_affinity == "required" and usable else "label or untaint nodes, or change the selector")
        refused = _refused(nodes, db)
        return usable, Finding("FAIL", f"target.kubernetes.database: {k8s.instances} instance(s) need {need} "
                                       f"matching {_selector(db)}; {len(usable)} match ({names})"
                                       f"{'; refused: ' + refused if refused else ''}; {fix}")
    if db.anti_affinity == "preferred" and domains < k8s.instances:
        return usable, Finding("warn", f"nodes: database: {k8s.instances} instances on {domains} node(s) ({names}): "
                                       "with anti_affinity: preferred some will share a node")
    spread = f", one instance per {db.topology_key}" if db.anti_affinity == "required" else ""
    return usable, Finding("ok", f"nodes: database: {len(usable)} match ({names}){spread}")


def client_nodes(k8s: KubernetesTarget, nodes: list[Node], db_nodes: list[Node]) -> Finding:
    """pgbench's nodes: one at least; with a required anti-affinity (rendered on pods labelled with the Cluster's
    name, by ``clients.topology_key``) one whose domain the instances can leave free, and ok only when they must."""
    c, db = k8s.clients, k8s.database
    usable = [n for n in nodes if refusal(n, c) is None]
    names = ", ".join(n.name for n in usable) or "none"
    if not usable:
        refused = _refused(nodes, c)
        return Finding("FAIL", f"target.kubernetes.clients: no schedulable node matches {_selector(c)}"
                               f"{'; refused: ' + refused if refused else ''}; label or untaint a node for pgbench, "
                               "or change clients.node_selector")
    if c.anti_affinity != "required":
        return Finding("ok", f"nodes: clients: {len(usable)} match ({names})")
    key = c.topology_key
    free = [n for n in usable if _fits([d for d in db_nodes if d.domain(key) != n.domain(key)], db, k8s.instances)]
    if not free:
        return Finding("FAIL", f"target.kubernetes.clients: anti_affinity: required keeps pgbench off every "
                               f"{key} holding an instance, and each node it may use ({names}) is needed for the "
                               f"{k8s.instances} instance(s); give the clients a node of their own "
                               "(clients.node_selector) or set clients.anti_affinity: preferred")
    client_domains = {n.domain(key) for n in usable}
    shared = {d.domain(key) for d in db_nodes} & client_domains
    if len(client_domains) > min(k8s.instances, len(shared)):  # the instances cannot take all of them
        return Finding("ok", f"nodes: clients: {len(usable)} match ({names}), one at least apart from the instances")
    return Finding("warn", f"nodes: clients: {len(usable)} match ({names}) but the instances may land there too "
                           f"(they are database nodes as well): pgbench then finds no node; give the clients a node "
                           "of their own (clients.node_selector)")


def check_nodes(plan: Plan, api: client.ApiClient) -> list[Finding]:
    """Enough schedulable nodes for the instances (selector, tolerations, anti-affinity) and one for pgbench."""
    k8s = target_of(plan)
    if plan.tenants is not None:  # each tenant's Cluster has tenants.instances instances
        k8s = k8s.model_copy(update={"instances": plan.tenants.instances})
    try:
        nodes = [Node.of(n) for n in _read(client.CoreV1Api(api).list_node).get("items") or []]
    except ApiException as exc:
        return [Finding("warn", f"nodes: cannot be listed ({_status(exc)}): the placement is not checked")]
    db_nodes, db = database_nodes(k8s, nodes)
    if db.blocking:
        return [db]
    clients = client_nodes(k8s, nodes, db_nodes)
    return [db, clients] if clients.blocking else [db, clients, node_map(k8s, nodes)]


def node_map(k8s: KubernetesTarget, nodes: list[Node]) -> Finding:
    """Every node, its zone, and which of the plan's pods its placement lets go there (or why none)."""
    parts = []
    for n in sorted(nodes, key=lambda n: n.name):
        allowed = [what for what, placement in (("instances", k8s.database), ("clients", k8s.clients))
                   if refusal(n, placement) is None]
        zone = n.labels.get(ZONE_LABEL)
        where = f"{n.name} ({zone})" if zone else n.name
        refused = refusal(n, k8s.database) or refusal(n, k8s.clients)
        parts.append(f"{where}: {' and '.join(allowed)}" if allowed else f"{where}: neither ({refused})")
    return Finding("info", f"nodes: {len(nodes)}: " + "; ".join(parts))


# ------------------------------------------------------------------ 4. storage classes
def check_storage_classes(plan: Plan, api: client.ApiClient) -> list[Finding]:
    """The storage classes the plan names exist; without a name, the cluster has a default class."""
    k8s = target_of(plan)
    try:
        items = _read(client.StorageV1Api(api).list_storage_class).get("items") or []
    except ApiException as exc:
        return [Finding("warn", f"storage classes: cannot be listed ({_status(exc)}): not checked")]
    classes = {str(c["metadata"]["name"]): any((c["metadata"].get("annotations") or {}).get(a) == "true"
                                               for a in DEFAULT_CLASS) for c in items}
    existing = ", ".join(f"{n}{' (default)' if d else ''}" for n, d in sorted(classes.items())) or "none"
    defaults = sorted(n for n, d in classes.items() if d)
    used = []
    volumes = [("target.kubernetes.storage", "data", k8s.storage),
               ("target.kubernetes.wal_storage", "WAL", k8s.wal_storage)]
    for i, option in enumerate(plan.matrix.storage or []):  # the storage axis: every value's classes
        volumes += [(f"matrix.storage[{i}].storage", f"{option.name} data", option.storage),
                    (f"matrix.storage[{i}].wal_storage", f"{option.name} WAL", option.wal_storage)]
    for i, arrangement in enumerate(plan.tenants.arrangements if plan.tenants else []):  # tenants: each tier's
        volumes += [v for j, tier in enumerate(arrangement.tiers)
                    for v in ((f"tenants.arrangements[{i}].tiers[{j}].storage", f"tier {tier.name}", tier.storage),
                              (f"tenants.arrangements[{i}].tiers[{j}].wal_storage", f"tier {tier.name} WAL",
                               tier.wal_storage))]
    for fld, role, storage in volumes:
        if storage is None:
            continue
        name = storage.storage_class
        if name is None:
            if not defaults:
                return [Finding("FAIL", f"{fld}.class: not given and the cluster has no default "
                                        f"storage class (existing: {existing}); name one")]
            used.append(f"{role} on the default {defaults[0]}")
        elif name not in classes:
            return [Finding("FAIL", f"storage class '{name}' ({fld}.class): not found; existing: "
                                    f"{existing}")]
        else:
            used.append(f"{role} on {name}")
    return [Finding("ok", f"storage classes: {', '.join(used)}"), *_host_path_allowed(plan, api)]


def _host_path_allowed(plan: Plan, api: client.ApiClient) -> list[Finding]:
    """storage.host_path's fio pod mounts a hostPath volume: the baseline and restricted Pod Security Standards,
    enforced on the namespace by its label, refuse it."""
    if plan.storage is None or plan.storage.host_path is None:
        return []
    ns = target_of(plan).namespace
    try:
        labels = (_read(client.CoreV1Api(api).read_namespace, ns).get("metadata") or {}).get("labels") or {}
    except ApiException:
        return []  # not there yet: pglab creates it without a Pod Security label
    level = labels.get("pod-security.kubernetes.io/enforce")
    if level in ("baseline", "restricted"):
        return [Finding("FAIL", f"storage.host_path: namespace {ns} enforces the {level} Pod Security Standard "
                                "(label pod-security.kubernetes.io/enforce), which refuses the hostPath volume of "
                                "the host-path fio pod; label the namespace privileged or remove storage.host_path")]
    return []


# ------------------------------------------------------------------ the WAL archive's plugin
BARMAN_CRD = "objectstores.barmancloud.cnpg.io"
PLUGIN_LABEL = "cnpg.io/pluginName"  # the label of the Service by which the operator finds a plugin
PLUGIN_DOC = "docs/kubernetes.md, 'Backup and WAL archiving'"


def check_wal_archive(plan: Plan, api: client.ApiClient) -> list[Finding]:
    """With ``wal_archive``: the Barman Cloud plugin's ObjectStore CRD is served, the operator can find the plugin
    (its Service, labelled with its name, in the operator's namespace), and what the plan names exists (its
    ObjectStore, or the Secret pglab copies the credentials from). Without them the Cluster never becomes healthy:
    the operator refuses a plugin it does not know, and the instances cannot archive."""
    k8s = target_of(plan)
    archive = k8s.wal_archive
    if archive is None:
        return []
    try:
        crd = _read(client.ApiextensionsV1Api(api).read_custom_resource_definition, BARMAN_CRD)
    except ApiException as exc:
        if exc.status == 404:
            return [Finding("FAIL", f"target.kubernetes.wal_archive: CRD {BARMAN_CRD} not found, CloudNativePG's "
                                    f"Barman Cloud plugin is not installed; install it in the operator's namespace "
                                    f"({PLUGIN_DOC})")]
        return [Finding("warn", f"Barman Cloud plugin: CRD {BARMAN_CRD} cannot be read ({_status(exc)}): not checked")]
    if "v1" not in {v.get("name") for v in crd.get("spec", {}).get("versions", []) if v.get("served")}:
        return [Finding("FAIL", f"target.kubernetes.wal_archive: CRD {BARMAN_CRD} serves no v1; upgrade "
                                "CloudNativePG's Barman Cloud plugin to 0.15 or newer")]
    out: list[Finding] = []
    namespaces: list[str] = []
    services: list[dict[str, Any]] = []
    try:
        namespaces = sorted({str(d.get("metadata", {}).get("namespace")) for d in _operator_deployments(api)})
        services = [svc for ns in namespaces for svc in _read(client.CoreV1Api(api).list_namespaced_service, ns,
                                                            label_selector=f"{PLUGIN_LABEL}={BARMAN_PLUGIN}")
                    .get("items") or []]
    except ApiException as exc:
        out.append(Finding("warn", f"Barman Cloud plugin: its Service cannot be listed ({_status(exc)}): whether the "
                                   "operator finds it is not known"))
    else:
        if namespaces and not services:
            return [Finding("FAIL", f"target.kubernetes.wal_archive: no Service labelled {PLUGIN_LABEL}="
                                    f"{BARMAN_PLUGIN} in the operator's namespace ({', '.join(namespaces)}): the "
                                    f"Barman Cloud plugin is not deployed there ({PLUGIN_DOC})")]
    if out or not namespaces:
        where = f"CRD {BARMAN_CRD} served"
    else:
        where = "Service " + ", ".join(f"{svc['metadata']['namespace']}/{svc['metadata']['name']}"
                                       for svc in services)
    try:
        if archive.object_store is not None:
            what, fld = f"ObjectStore {k8s.namespace}/{archive.object_store}", "wal_archive.object_store"
            _read(client.CustomObjectsApi(api).get_namespaced_custom_object, "barmancloud.cnpg.io", "v1",
                  k8s.namespace, "objectstores", archive.object_store)
        else:
            assert archive.s3 is not None
            ns, name = archive.s3.credentials.split("/", 1)
            what, fld = f"Secret {ns}/{name}", "wal_archive.s3.credentials"
            _read(client.CoreV1Api(api).read_namespaced_secret, name, ns)
    except ApiException as exc:
        if exc.status == 404:
            return [*out, Finding("FAIL", f"target.kubernetes.{fld}: {what} not found; create it or name one "
                                          "that exists")]
        return [*out, Finding("warn", f"Barman Cloud plugin: {where}; {what} cannot be read ({_status(exc)})")]
    return [*out, Finding("ok", f"Barman Cloud plugin: {where}; {what} present")]


# ------------------------------------------------------------------ 5. permissions
@dataclass(frozen=True)
class Access:
    """One request pglab makes: what a SelfSubjectAccessReview asks, and whether lacking it stops the sweep."""

    verb: str
    group: str
    resource: str  # "pods" or "pods/log": the subresource after the slash
    namespace: str = ""  # "" at cluster scope
    name: str = ""
    blocking: bool = True
    why: str = ""

    @property
    def attributes(self) -> dict[str, str]:
        resource, _, sub = self.resource.partition("/")
        attrs = {"verb": self.verb, "group": self.group, "resource": resource, "subresource": sub,
                 "namespace": self.namespace, "name": self.name}
        return {k: v for k, v in attrs.items() if v}


def required_access(plan: Plan, namespace_exists: bool | None) -> list[Access]:
    """Every permission pglab's identity uses: the rendered Role's rules (they are also what it must hold to create
    that Role), the RBAC objects themselves, the namespace when pglab creates it, and what only pglab reads
    (``pods/proxy``: the exporters, node-exporter; lacking it costs figures, not the sweep)."""
    k8s = target_of(plan)
    ns = k8s.namespace
    out: list[Access] = []
    role = next(m for m in rbac(plan) if m.kind == "Role")
    for rule in role.body["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:  # a Role's namespaces rule grants its own namespace, by name
                    out.append(Access(verb, group, resource, ns, ns if resource == "namespaces" else "",
                                      why="the Role pglab creates"))
    for group, resource in (("", "serviceaccounts"), ("rbac.authorization.k8s.io", "roles"),
                            ("rbac.authorization.k8s.io", "rolebindings")):
        out += [Access(verb, group, resource, ns, why="pglab creates its RBAC") for verb in ("create", "delete")]
    if namespace_exists is False:  # created by pglab, and deleted again at the end
        out += [Access("create", "", "namespaces", why=f"namespace {ns} does not exist yet"),
                Access("delete", "", "namespaces", ns, ns, why=f"namespace {ns} does not exist yet")]
    out.append(Access("get", "", "pods/proxy", ns, blocking=False,
                      why="without it no PostgreSQL figures and no wait for the standbys to catch up"))
    if any(sc.kind == "node-drain" for sc in plan.matrix.scenario or []):  # kubectl drain's own calls
        out += [Access("patch", "", "nodes", why="node-drain cordons and uncordons the primary's node"),
                Access("create", "", "pods/eviction", ns, why="node-drain evicts the instance pods")]
    if (ne := k8s.node_exporter) is not None:
        out += [Access("list", "", "pods", ne.namespace, blocking=False, why="without it no disk figures"),
                Access("get", "", "pods/proxy", ne.namespace, blocking=False, why="without it no disk figures")]
    return out


def _namespace_exists(api: client.ApiClient, namespace: str) -> bool | None:
    """Whether the benchmark namespace is there already (pglab then uses it and needs no cluster-wide create)."""
    try:
        _read(client.CoreV1Api(api).read_namespace, namespace)
        return True
    except ApiException as exc:
        return False if exc.status == 404 else None  # unknown: its Role rule 'get namespaces' is reviewed anyway


def _allowed(api: client.ApiClient, access: Access) -> bool:
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": access.attributes}}
    review = _read(client.AuthorizationV1Api(api).create_self_subject_access_review, body)
    return bool((review.get("status") or {}).get("allowed"))


def _denied_line(group: list[Access]) -> Finding:
    a = group[0]
    what = f"{a.group + '/' if a.group else ''}{a.resource}"
    where = f"in namespace {a.namespace}" if a.namespace else "at cluster scope"
    verbs = ", ".join(dict.fromkeys(x.verb for x in group))
    if a.blocking:
        return Finding("FAIL", f"RBAC: the kubeconfig's identity cannot {verbs} {what} {where} ({a.why}); grant it "
                               f"({RBAC_DOC})")
    return Finding("warn", f"RBAC: the kubeconfig's identity cannot {verbs} {what} {where}: {a.why}")


def check_access(plan: Plan, api: client.ApiClient) -> list[Finding]:
    """A SelfSubjectAccessReview per permission pglab uses; one line per resource with verbs missing."""
    k8s = target_of(plan)
    wanted = required_access(plan, _namespace_exists(api, k8s.namespace))
    denied: dict[tuple[str, str, str, bool], list[Access]] = {}
    try:
        for access in wanted:
            if not _allowed(api, access):
                denied.setdefault((access.group, access.resource, access.namespace, access.blocking), []).append(
                    access)
    except ApiException as exc:
        return [Finding("warn", f"RBAC: the permissions cannot be reviewed (SelfSubjectAccessReview: "
                                f"{_status(exc)}): not checked")]
    lines = sorted((_denied_line(g) for g in denied.values()), key=lambda f: not f.blocking)
    if any(f.blocking for f in lines):
        return lines
    granted = len(wanted) - sum(len(g) for g in denied.values())
    return [*lines, Finding("ok", f"RBAC: {granted} of {len(wanted)} permissions granted (SelfSubjectAccessReview), "
                                  "every one the sweep needs")]


# ------------------------------------------------------------------ 6. images
def check_images(plan: Plan, api: client.ApiClient) -> list[Finding]:
    """The images the plan's pods will use, named (nothing is pulled): the nodes must be able to pull them."""
    k8s = target_of(plan)
    c = k8s.clients
    clients = c.image or f"{k8s.image} (the database image)"
    return [Finding("info", f"images (not pulled here, the nodes must pull them): database {k8s.image}; pgbench, "
                            f"psql, witness {clients}; fio, disk sampler, volume probe {c.fio_image}")]
