"""Create → wait → collect → clean up, over the official ``kubernetes`` client, with the rendered manifests.

Every object applied is one ``render`` produced (so what cnpg-check decoded is what runs). Results come back
through a Job pod's log, or the output of a run's script exec'd in a long-lived client pod (a base64 tarball
between markers either way). Whatever was created is deleted again on the way out, also after a failure or
Ctrl-C; whatever was exec'd is stopped first.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream

from pglab import interrupts
from pglab.errors import first_line
from pglab.plan.schema import Plan
from pglab.targets.kubernetes.render import (
    COPY_FROM,
    DISK_SAMPLER,
    LOAD_DIR,
    Manifest,
    render,
    target_of,
)
from pglab.targets.kubernetes.scripts import BEGIN_MARK, END_MARK

CNPG = ("postgresql.cnpg.io", "v1", "clusters")
CUSTOM = {"Cluster": CNPG, "Backup": ("postgresql.cnpg.io", "v1", "backups"),
          "ObjectStore": ("barmancloud.cnpg.io", "v1", "objectstores")}  # the custom kinds pglab creates
HEALTHY = "Cluster in healthy state"
SCRAPE_TIMEOUT = (3.0, 5.0)  # connect, read: a pod port the API server cannot reach is a gap, not a stall
# how often a wait reads the object it waits for (a Cluster healthy, a Job ended, pods running): kubectl wait
# watches and learns at once; a read every 2 s cost a second a wait on average, four waits in a short sweep
POLL_S = 0.5
POD_LOOK_S = 10.0  # how often a running Job's pod is looked at for a reason it cannot start
POD_START_GRACE_S = 120.0  # how long such a reason may last (a slow pull, a node being added) before the Job fails
LOG_SETTLE_S = 10.0  # how long the log of a Job that ended may take to hold the whole of its results
LOG_SETTLE_POLL_S = 0.5
CANNOT_START = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                "CreateContainerError"}
PROMOTE_TRIES = 5  # a switchover request conflicting with the operator's own status writes is read and sent again
KILL_GRACE_S = 1  # a failover's pod deletion: SIGTERM, then the kubelet's SIGKILL a second later
CLUSTER_GONE_S = 300.0  # a deleted Cluster and its claims gone (their volumes' deletion included)
INSTANCES_GONE_S = 60  # killed instance pods gone (the kubelet stops their containers; seconds on the lab)
DRAIN_FRAMES = 64  # at most this many frames read at one look of a command left running (its output is short)
GONE_POLL_S = 0.1  # killed instance pods go within a second or two: the sweep's end looks often, briefly
SWITCHOVER = "Switchover in progress"  # the phase a requested switchover starts in
FENCED = "cnpg.io/fencedInstances"  # the Cluster annotation listing the instances whose postgres is stopped
POSTGRES_CONTAINER = "postgres"  # the instance pods' PostgreSQL container, as CloudNativePG names it
EXPORTER_PORT = 9187  # each instance's metrics exporter


class K8sError(Exception):
    """The cluster refused or failed something pglab asked for; the message says what and where, ``status`` the
    API server's HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


@dataclass
class JobOutcome:
    """A finished Job: whether it succeeded, its log (results markers removed) and where its files went."""

    name: str
    succeeded: bool
    log: str
    files: list[str] = field(default_factory=list)
    node: str | None = None  # the node its pod ran on


def api_client(plan: Plan) -> client.ApiClient:
    """A client for the plan's kubeconfig and context (default: $KUBECONFIG or ~/.kube/config, current context)."""
    k8s = target_of(plan)
    return config.new_client_from_config(config_file=k8s.kubeconfig, context=k8s.context)


def extract_results(log: str, dest: Path) -> tuple[str, list[str]]:
    """Split a pod log into its text and the files of the results tarball, written under ``dest``."""
    if BEGIN_MARK not in log:
        if END_MARK in log:  # the API serves the current log file only: the start went with a rotated one
            raise K8sError("the pod's log lost the start of its results: the kubelet rotated it while they were "
                           "printed (containerLogMaxSize, 10 MiB by default); lower run.sampling_rate (pgbench's -l "
                           "logs) or raise the kubelet's containerLogMaxSize")
        return log, []
    text, _, rest = log.partition(BEGIN_MARK)
    blob, found, after = rest.partition(END_MARK)
    if not found:
        raise K8sError("the pod's log ends inside its results (truncated log?)")
    try:
        data = base64.b64decode("".join(blob.split()), validate=True)
        names: list[str] = []
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            dest.mkdir(parents=True, exist_ok=True)
            for member in tar.getmembers():
                if not member.isfile():
                    continue  # directories are implied; links and devices have no business here
                rel = Path(member.name)
                if rel.is_absolute() or ".." in rel.parts:
                    raise tarfile.TarError(f"{member.name!r} leads out of the results folder")
                source = tar.extractfile(member)
                assert source is not None
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                (dest / rel).write_bytes(source.read())
                names.append(str(rel))
    except (binascii.Error, tarfile.TarError, OSError) as exc:
        raise K8sError(f"the results in the pod's log cannot be read: {exc}") from None
    return text + after, sorted(names)


@dataclass
class LoadOutcome:
    """A finished Indexed Job of load pods: whether every pod succeeded, each pod's outcome (by index, files
    relative to the run's folder) and node."""

    name: str
    succeeded: bool
    pods: list[JobOutcome]
    nodes: dict[int, str] = field(default_factory=dict)

    @property
    def files(self) -> list[str]:
        return [f for p in self.pods for f in p.files]

    @property
    def log(self) -> str:
        return "\n".join(p.log for p in self.pods)


CLIENT_COMPONENT = "pgbench-client"  # the long-lived client pods' pglab/component label
STOP_TIMEOUT_S = 15.0  # a stop command's own deadline (TERM, up to 5 s, then KILL)
# every process of the container but its own (PID 1, whose children are its idle sleep) and this shell's: TERM,
# then KILL what is left after 5 s; exit 0 once none is left. Builtins only (read, kill), so no image needs
# procps; a process's parent is the 4th field of /proc/<pid>/stat.
STOP_SCRIPT = r"""me=$$
left() { n=0; for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = 1 ] || [ "$p" = "$me" ] || {
  read -r _ _ _ pp _ < "$d/stat" 2>/dev/null && [ "$pp" != 1 ] && [ "$pp" != "$me" ] &&
  kill -"$1" "$p" 2>/dev/null && n=$((n+1)); }; done; }
left TERM; i=0
while [ "$n" -gt 0 ] && [ "$i" -lt 50 ]; do sleep 0.1; left 0; i=$((i+1)); done
[ "$n" = 0 ] || { left KILL; sleep 0.2; left 0; }
[ "$n" = 0 ] || { echo "pglab: $n processes left after KILL" >&2; exit 1; }"""


@dataclass
class Exec:
    """A command started in a pod by exec: its output so far, stdout and stderr in the order they came (as a
    pod's log has them), and its exit status once it ended."""

    pod: str
    ws: Any  # kubernetes.stream.ws_client.WSClient
    chunks: list[str] = field(default_factory=list)
    _code: int | None = None

    def pump(self, timeout: float) -> bool:
        """Read what came within ``timeout`` seconds; whether the command still runs (a connection lost is its
        end, without an exit status)."""
        if self.ws.is_open():
            try:
                self.ws.update(timeout=timeout)
                for channel in (1, 2):  # one frame per update: at most one of them has news
                    if data := self.ws.read_channel(channel):
                        self.chunks.append(data)
            except Exception as exc:  # websocket-client's own errors: the connection went
                self.chunks.append(f"\npglab: the connection to pod/{self.pod} was lost: {exc}\n")
                self.close()
        return bool(self.ws.is_open())

    def drain(self) -> bool:
        """Read what has already come, without waiting (a command left running while something else is waited
        for, so that its output never backs up); whether it still runs."""
        for _ in range(DRAIN_FRAMES):
            before = len(self.chunks)
            if not self.pump(0) or len(self.chunks) == before:
                break
        return bool(self.ws.is_open())

    @property
    def output(self) -> str:
        return "".join(self.chunks)

    @property
    def returncode(self) -> int | None:
        """None while it runs; its exit status once ended (-1 when the API server gave none: the connection was
        lost, the container went)."""
        if self.ws.is_open():
            return None
        if self._code is None:
            try:
                self._code = int(self.ws.returncode)
            except (TypeError, KeyError, IndexError, ValueError, AttributeError):
                self._code = -1
        return self._code

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


class Orchestrator:
    """Applies a plan's manifests in order and undoes them; each step waits for the operator or the Job."""

    def __init__(self, plan: Plan, base_dir: Path, api: client.ApiClient, *, poll_s: float = POLL_S,
                 ready_timeout_s: float = 1800.0, job_timeout_s: float | None = None,
                 log: Callable[[str], None] = lambda _: None):
        self.plan, self.base_dir, self.log = plan, base_dir, log
        self.k8s = target_of(plan)
        self.ns = self.k8s.namespace
        self.core, self.batch, self.apps = client.CoreV1Api(api), client.BatchV1Api(api), client.AppsV1Api(api)
        self.rbac, self.custom = client.RbacAuthorizationV1Api(api), client.CustomObjectsApi(api)
        self.poll_s, self.ready_timeout_s = poll_s, ready_timeout_s
        seconds = (plan.run.measured_seconds or 3600) + plan.run.warmup
        self.job_timeout_s = job_timeout_s or max(600.0, 3 * seconds + 600)
        self.created: list[Manifest] = []
        self._exec_core: client.CoreV1Api | None = None  # exec's own client (see ``exec_start``)

    # -------------------------------------------------------------- create / delete one object
    def create(self, m: Manifest) -> None:
        body, kind = m.body, m.kind
        if kind == "Namespace":
            if self._create_namespace(m):
                self.created.append(m)
            return  # else an existing namespace is used, and left in place
        try:
            if kind in CUSTOM:
                group, version, plural = CUSTOM[kind]
                self.custom.create_namespaced_custom_object(group, version, self.ns, plural, body)
            elif kind == "Secret" and COPY_FROM in (body["metadata"].get("annotations") or {}):
                self.core.create_namespaced_secret(self.ns, self._copied_secret(body))
            else:
                getattr(self._api(kind), f"create_namespaced_{_snake(kind)}")(self.ns, body)
        except ApiException as exc:
            raise K8sError(f"creating {kind}/{m.name} in {self.ns}: {_reason(exc)}") from None
        self.created.append(m)

    def _copied_secret(self, body: dict[str, Any]) -> dict[str, Any]:
        """A Secret whose data pglab copies from the namespace/name its annotation names (the object store's
        credentials: an ObjectStore reads its Secrets in its own namespace only)."""
        source = body["metadata"]["annotations"][COPY_FROM]
        ns, name = source.split("/", 1)
        try:
            found = self.core.read_namespaced_secret(name, ns)
        except ApiException as exc:
            raise K8sError(f"reading Secret/{name} in {ns} (target.kubernetes.wal_archive.s3.credentials) to copy "
                           f"it: {_reason(exc)}") from None
        return {**body, "data": dict(found.data or {})}

    def _create_namespace(self, m: Manifest) -> bool:
        """True when pglab created the namespace (it deletes it at the end), False when one was there to use.

        Authorization comes before the existence check: an identity without ``create namespaces`` gets 403 for a
        namespace that exists too, so 403 and 409 are both answered by reading it. A namespace still being deleted
        (the previous sweep's, its pods shutting down) admits no new object: it is waited out, then created."""
        deadline, told = time.monotonic() + self.ready_timeout_s, False
        while True:
            try:
                self.core.create_namespace(m.body)
                return True
            except ApiException as exc:
                if exc.status not in (403, 409):
                    raise K8sError(f"creating Namespace/{m.name}: {_reason(exc)}") from None
                refused = exc
            try:
                found = self.core.read_namespace(m.name)
                phase = found.status.phase if found.status is not None else None
            except ApiException as exc:
                if exc.status != 404:
                    raise K8sError(f"creating Namespace/{m.name}: {_reason(refused)}, and reading it: "
                                   f"{_reason(exc)}; create it beforehand and grant pglab's identity the Role of "
                                   "docs/kubernetes.md in it") from None
                if refused.status == 403:
                    raise K8sError(f"creating Namespace/{m.name}: {_reason(refused)}; create it beforehand or "
                                   "grant pglab's identity 'create namespaces'") from None
                continue  # it went between the two calls: create it now
            if phase != "Terminating":
                return False
            if time.monotonic() > deadline:
                raise K8sError(f"Namespace/{m.name} is still being deleted {self.ready_timeout_s:.0f} s later (its "
                               "pods or finalizers); wait for it or use another namespace")
            if not told:
                told = True
                self.log(f"namespace {m.name} is still being deleted (a previous sweep's): waiting for it to go")
            interrupts.sleep(self.poll_s)

    def delete(self, m: Manifest) -> None:
        kind, name = m.kind, m.name
        try:
            if kind == "Namespace":
                self.core.delete_namespace(name)
            elif kind == "Cluster":
                self.custom.delete_namespaced_custom_object(*CNPG[:2], self.ns, CNPG[2], name)
                self._kill_instances(name)
            elif kind in CUSTOM:
                group, version, plural = CUSTOM[kind]
                self.custom.delete_namespaced_custom_object(group, version, self.ns, plural, name)
            else:
                getattr(self._api(kind), f"delete_namespaced_{_snake(kind)}")(
                    name, self.ns, propagation_policy="Background")  # a Job's pods go with it
        except ApiException as exc:
            if exc.status != 404:
                raise K8sError(f"deleting {kind}/{name} in {self.ns}: {_reason(exc)}") from None

    def _kill_instances(self, cluster: str) -> None:
        """The Cluster is being thrown away: its instance pods are deleted at once (no grace), and waited for, before
        anything else goes. Left to CloudNativePG, a primary whose synchronous standbys went first ran a smart
        shutdown for minutes; and the namespace controller, finding any pod still running when the namespace is
        deleted, looks again only after that pod's terminationGracePeriodSeconds — CloudNativePG's stopDelay,
        30 min. Both were seen on a real cluster: the namespace stayed Terminating for over 5 minutes."""
        selector = f"cnpg.io/cluster={cluster}"
        for pod in self.core.list_namespaced_pod(self.ns, label_selector=selector).items:
            try:
                # 0: removed from the API at once (the kubelet kills the containers after); nothing can start a new
                # pod on their volumes now that the Cluster is gone. With 1 s the pods were seen lingering > 60 s
                # on a busy node, and the namespace controller then waited out their 30 min grace.
                self.core.delete_namespaced_pod(pod.metadata.name, self.ns, grace_period_seconds=0)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        started = time.monotonic()
        deadline = started + INSTANCES_GONE_S
        while self.core.list_namespaced_pod(self.ns, label_selector=selector).items:
            if time.monotonic() > deadline:
                self.log(f"the instance pods of Cluster/{cluster} were still there {INSTANCES_GONE_S} s after being "
                         "killed; the namespace may take up to CloudNativePG's stopDelay to go")
                return
            interrupts.sleep(min(self.poll_s, GONE_POLL_S))
        self.log(f"the instance pods of Cluster/{cluster} killed and gone in {time.monotonic() - started:.1f} s")

    def _api(self, kind: str) -> Any:
        return {"Job": self.batch, "Role": self.rbac, "RoleBinding": self.rbac, "DaemonSet": self.apps}.get(kind,
                                                                                                        self.core)

    def cleanup(self) -> list[str]:
        """Delete everything this orchestrator created, newest first; returns the problems, never raises."""
        problems = []
        while self.created:
            m = self.created.pop()
            try:
                self.delete(m)
            except K8sError as exc:
                problems.append(str(exc))
            except Exception as exc:  # the API server gone (urllib3): still try the rest, and say what is left
                problems.append(f"deleting {m.kind}/{m.name} in {self.ns}: {type(exc).__name__}: {exc}")
        return problems

    # -------------------------------------------------------------- waiting
    def wait_cluster_ready(self, name: str | None = None, instances: int | None = None,
                           timeout_s: float | None = None,
                           on_poll: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Until the operator reports Cluster ``name`` healthy with its ``instances`` ready (the plan's Cluster and
        count by default); one of its pods that cannot start (no node fits it, say) fails it before the timeout.
        ``on_poll`` is given each status read before then: what can start while the Cluster comes up."""
        name, instances = name or self.k8s.cluster_name, instances or self.k8s.instances
        timeout_s = self.ready_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        next_look = time.monotonic() + POD_LOOK_S
        stuck_since: float | None = None  # since when one of its pods has been seen unable to start
        while True:
            status = self.cluster_status(name)
            if self.is_healthy(status, instances):
                return status
            if on_poll is not None:
                on_poll(status)
            if time.monotonic() >= next_look:  # a pod no node fits would otherwise wait out the whole timeout
                next_look = time.monotonic() + POD_LOOK_S
                stuck_since = self._pod_cannot_start(f"cnpg.io/cluster={name}", f"Cluster/{name}", stuck_since)
            if time.monotonic() > deadline:
                raise K8sError(f"Cluster/{name} not ready after {timeout_s:.0f} s ({self._state(status, instances)})")
            interrupts.sleep(self.poll_s)

    def is_healthy(self, status: dict[str, Any], instances: int | None = None) -> bool:
        """The operator reports the Cluster healthy with every instance (``instances``, the plan's by default) ready."""
        return status.get("readyInstances") == (instances or self.k8s.instances) and status.get("phase") == HEALTHY

    def _state(self, status: dict[str, Any], instances: int | None = None) -> str:
        return (f"phase: {status.get('phase', 'none')}, ready instances: {status.get('readyInstances', 0)} of "
                f"{instances or self.k8s.instances}")

    def custom_status(self, kind: str, name: str) -> dict[str, Any]:
        """The status of one of the custom objects pglab created (a Backup, say)."""
        group, version, plural = CUSTOM[kind]
        try:
            obj = self.custom.get_namespaced_custom_object(group, version, self.ns, plural, name)
        except ApiException as exc:
            raise K8sError(f"reading {kind}/{name}: {_reason(exc)}", exc.status) from None
        return dict(obj.get("status") or {})

    def cluster_status(self, name: str | None = None) -> dict[str, Any]:
        """The operator's status of Cluster ``name``, the plan's by default (primary, phase, instances)."""
        return self.custom_status("Cluster", name or self.k8s.cluster_name)

    def cluster_health(self) -> str | None:
        """None while the operator reports the Cluster healthy with every instance ready, else what it says."""
        try:
            status = self.cluster_status()
        except K8sError as exc:
            return str(exc)  # reading Cluster/<name>: why not
        healthy = self.is_healthy(status)
        return None if healthy else f"Cluster/{self.k8s.cluster_name} not healthy ({self._state(status)})"

    # -------------------------------------------------------------- changing the Cluster between points
    def patch_cluster(self, patch: dict[str, Any]) -> None:
        """A JSON merge patch of the Cluster (the operator rolls it out; ``wait_rollout`` waits for that)."""
        name = self.k8s.cluster_name
        try:
            self.custom.patch_namespaced_custom_object(*CNPG[:2], self.ns, CNPG[2], name, patch)
        except ApiException as exc:
            raise K8sError(f"patching Cluster/{name} in {self.ns}: {_reason(exc)}") from None

    def promote(self, instance: str) -> None:
        """Ask CloudNativePG for a switchover to ``instance``, as ``kubectl cnpg promote`` does: the Cluster's
        status names it target primary (phase "Switchover in progress"), under the read status's resourceVersion
        so that a status the operator changed meanwhile makes the request fail rather than undo its change."""
        name = self.k8s.cluster_name
        for attempt in range(1, PROMOTE_TRIES + 1):  # a conflict: the operator wrote the status meanwhile
            try:
                obj = self.custom.get_namespaced_custom_object(*CNPG[:2], self.ns, CNPG[2], name)
                stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # Go's RFC3339Micro, as the plugin's
                patch = {"metadata": {"resourceVersion": obj.get("metadata", {}).get("resourceVersion")},
                         "status": {"targetPrimary": instance, "targetPrimaryTimestamp": stamp,
                                    "phase": SWITCHOVER, "phaseReason": f"Switching over to {instance}"}}
                if patch["metadata"]["resourceVersion"] is None:
                    del patch["metadata"]
                self.custom.patch_namespaced_custom_object_status(*CNPG[:2], self.ns, CNPG[2], name, patch)
                return
            except ApiException as exc:
                if exc.status != 409 or attempt == PROMOTE_TRIES:
                    raise K8sError(f"switching Cluster/{name} over to {instance}: {_reason(exc)}") from None

    def instance_pods(self) -> list[Any]:
        """The Cluster's PostgreSQL pods (by CloudNativePG's own labels), not its Jobs' nor pglab's."""
        selector = f"cnpg.io/cluster={self.k8s.cluster_name},cnpg.io/podRole=instance"
        try:
            return list(self.core.list_namespaced_pod(self.ns, label_selector=selector).items)
        except ApiException as exc:
            raise K8sError(f"listing the pods of Cluster/{self.k8s.cluster_name}: {_reason(exc)}", exc.status) from None

    def wait_rollout(self, what: str, pods_ok: Callable[[list[Any]], str | None] | None = None) -> float:
        """Until the operator reports the Cluster healthy with every instance ready and ``pods_ok`` (given the
        instance pods) has nothing left to say; returns the seconds it took. A healthy phase alone is not enough
        right after a patch (the operator may not have started yet): the pods are what proves a rolling update."""
        started = time.monotonic()
        deadline = started + self.ready_timeout_s
        while True:
            status = self.cluster_status()
            waiting = pods_ok(self.instance_pods()) if pods_ok is not None else None
            if self.is_healthy(status) and waiting is None:
                return time.monotonic() - started
            if time.monotonic() > deadline:
                raise K8sError(f"{what}: Cluster/{self.k8s.cluster_name} still rolling out after "
                               f"{self.ready_timeout_s:.0f} s ({self._state(status)}"
                               f"{'; ' + waiting if waiting else ''})")
            interrupts.sleep(self.poll_s)

    def scrape(self, pod: str, port: int = EXPORTER_PORT, namespace: str | None = None, scheme: str = "http") -> str:
        """A pod's /metrics text (an instance's exporter by default), through the API server's pod proxy (no
        network path needed); ``https`` as the proxy spells it, ``https:<pod>:<port>``."""
        ns = namespace or self.ns
        target = f"{pod}:{port}" if scheme == "http" else f"{scheme}:{pod}:{port}"
        try:
            resp = self.core.connect_get_namespaced_pod_proxy_with_path(
                target, ns, "metrics", _preload_content=False, _request_timeout=SCRAPE_TIMEOUT)
        except ApiException as exc:
            raise K8sError(f"reading the metrics of pod/{pod}{'' if ns == self.ns else ' in ' + ns}: "
                           f"{_reason(exc)}", exc.status) from None
        return bytes(resp.data).decode("utf-8", errors="replace")

    # -------------------------------------------------------------- Jobs
    def run_job(self, m: Manifest, dest: Path, on_poll: Callable[[], None] | None = None) -> JobOutcome:
        """Create a Job, wait for it to end, bring back its log and results, delete it. ``on_poll`` runs at every
        look at the Job (the sweep samples the exporters there)."""
        self.create(m)
        return self.finish_job(m, dest, on_poll)

    def finish_job(self, m: Manifest, dest: Path, on_poll: Callable[[], None] | None = None) -> JobOutcome:
        """Wait for a Job already created to end, bring back its log and results, delete it (also on a failure)."""
        deadline = time.monotonic() + self.job_timeout_s
        next_look = time.monotonic() + POD_LOOK_S
        stuck_since: float | None = None  # since when its pod has been seen unable to start
        try:
            while True:
                if on_poll is not None:
                    on_poll()
                try:
                    st = self.batch.read_namespaced_job(m.name, self.ns).status  # jobs/status needs its own RBAC
                except ApiException as exc:
                    raise K8sError(f"reading Job/{m.name}: {_reason(exc)}") from None
                if st is not None and (st.succeeded or st.failed):
                    break
                if time.monotonic() > deadline:
                    kept = self.keep_log_so_far(m.name, dest)
                    raise K8sError(f"Job/{m.name} still running after {self.job_timeout_s:.0f} s"
                                   + (f" (its log so far: {kept})" if kept else ""))
                if time.monotonic() >= next_look:  # a pod that cannot start would otherwise wait out the timeout
                    next_look = time.monotonic() + POD_LOOK_S
                    stuck_since = self._pod_cannot_start(f"job-name={m.name}", f"Job/{m.name}", stuck_since)
                interrupts.sleep(self.poll_s)
            raw = self.settled_log(m.name)
            if raw is None:
                raise K8sError(f"Job/{m.name} ended without a pod to read")
            try:
                text, files = extract_results(raw, dest)
            except K8sError:
                dest.mkdir(parents=True, exist_ok=True)
                (dest / "pod.log").write_text(raw)  # as read: what was wrong with it stays to be seen
                raise
            outcome = JobOutcome(m.name, bool(st.succeeded), text, files, self.job_node(m.name))
        finally:
            self.discard(m)
        (dest / "pod.log").parent.mkdir(parents=True, exist_ok=True)
        (dest / "pod.log").write_text(outcome.log)
        return outcome

    def _pod_cannot_start(self, selector: str, owner: str, since: float | None) -> float | None:
        """When a pod of ``owner`` (a Job, a Cluster; its pods are those of ``selector``) was first seen unable to
        start (an image that cannot be pulled, a missing secret or ConfigMap, no node that fits, a claim that cannot
        bind), None while none is; raises once that has lasted POD_START_GRACE_S (a pull may be slow, a node may
        come), whatever the reasons in between (the kubelet alternates ErrImagePull and ImagePullBackOff). A pod
        that cannot be read changes nothing: the owner's own state decides then."""
        try:
            pods = self.core.list_namespaced_pod(self.ns, label_selector=selector).items
        except ApiException:
            return since
        reasons = []
        for pod in pods:
            st = pod.status
            if st is None:
                continue
            name = pod.metadata.name if pod.metadata is not None else "?"
            for c in st.container_statuses or []:
                waiting = c.state.waiting if c.state is not None else None
                if waiting is not None and waiting.reason in CANNOT_START:
                    reasons.append((name, f"{waiting.reason}: {waiting.message or 'no message'}"))
            for cond in st.conditions or []:
                if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
                    reasons.append((name, f"Unschedulable: {cond.message or 'no message'}"))
        if not reasons:
            return None
        now_ = time.monotonic()
        since = now_ if since is None else since
        if now_ - since >= POD_START_GRACE_S:
            pod, why = reasons[-1]
            its = "its pod" if owner.startswith("Job/") else f"its pod {pod}"
            raise K8sError(f"{owner}: {its} cannot start after {now_ - since:.0f} s ({why})")
        return since

    # -------------------------------------------------------------- commands in long-lived pods (exec)
    def wait_pods_running(self, names: list[str], what: str) -> dict[str, str]:
        """Until every pod of ``names`` runs with its container ready; pod → node. A pod that ended (its container
        gone) or cannot start (an image, no node that fits: ``_pod_cannot_start``) fails, naming it."""
        deadline = time.monotonic() + self.ready_timeout_s
        next_look = time.monotonic() + POD_LOOK_S
        stuck_since: float | None = None
        while True:
            nodes = self.pods_running(names, what)
            if len(nodes) == len(names):
                return nodes
            if time.monotonic() > deadline:
                raise K8sError(f"{what}: {len(names) - len(nodes)} of {len(names)} pods not running after "
                               f"{self.ready_timeout_s:.0f} s")
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + POD_LOOK_S
                stuck_since = self._pod_cannot_start(f"pglab/cluster={self.k8s.cluster_name},pglab/component="
                                                     f"{CLIENT_COMPONENT}", what, stuck_since)
            interrupts.sleep(self.poll_s)

    def pods_running(self, names: list[str], what: str) -> dict[str, str]:
        """One look at ``names``: those running with their container ready, pod → node. A pod that ended fails,
        naming it."""
        nodes: dict[str, str] = {}
        for name in names:
            try:
                pod = self.core.read_namespaced_pod(name, self.ns)
            except ApiException as exc:
                raise K8sError(f"reading pod/{name}: {_reason(exc)}") from None
            phase = pod.status.phase if pod.status is not None else None
            if phase in ("Succeeded", "Failed"):
                raise K8sError(f"{what}: pod/{name} ended ({phase}) instead of waiting for the runs")
            ready = phase == "Running" and all(c.ready for c in (pod.status.container_statuses or [None]) if c)
            if ready and pod.spec is not None and pod.spec.node_name:
                nodes[name] = str(pod.spec.node_name)
        return nodes

    def exec_start(self, pod: str, command: list[str]) -> Exec:
        """Start ``command`` in ``pod``'s container (the API's exec, over a WebSocket); its output is read by
        ``exec_wait``. Exec has an API client of its own: the client library's ``stream`` swaps the request method
        of the client it is given while it connects, and the exporters' readers share the sweep's from threads."""
        if self._exec_core is None:
            self._exec_core = client.CoreV1Api(client.ApiClient(self.core.api_client.configuration))
        try:
            ws = stream(self._exec_core.connect_get_namespaced_pod_exec, pod, self.ns, command=command,
                        stdout=True, stderr=True, stdin=False, tty=False, _preload_content=False)
        except ApiException as exc:
            raise K8sError(f"starting a command in pod/{pod}: {exc.reason or exc.status}") from None
        return Exec(pod, ws)

    def exec_wait(self, execs: list[Exec], what: str, on_poll: Callable[[], None] | None = None,
                  timeout_s: float | None = None) -> None:
        """Read the output of ``execs`` until each has ended, or one ended with a failure (the others are left
        running: the caller stops them); ``on_poll`` runs at every look, as a Job's. Past the deadline (a Job's:
        ``job_timeout_s``) or on an interrupt (RunInterrupted from ``interrupts.check``), raises; the caller stops
        what still runs."""
        limit = timeout_s if timeout_s is not None else self.job_timeout_s
        deadline = time.monotonic() + limit
        next_poll = time.monotonic()
        while True:
            interrupts.check()
            running = [e for e in execs if e.pump(interrupts.POLL_S / max(1, len(execs)))]
            if not running or any(e.returncode not in (None, 0) for e in execs if e not in running):
                return
            if on_poll is not None and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + self.poll_s
                on_poll()
            if time.monotonic() > deadline:
                raise K8sError(f"{what} still running after {limit:.0f} s")

    def tell_job(self, job: str, command: list[str]) -> str | None:
        """Run a short ``command`` in Job ``job``'s running pod and wait for it (STOP_TIMEOUT_S); None once it
        succeeded, else why not (its pod not running, the exec refused or failing): never raises."""
        try:
            pods = self.core.list_namespaced_pod(self.ns, label_selector=f"job-name={job}").items
            running = [p.metadata.name for p in pods if p.status is not None and p.status.phase == "Running"]
            if not running:
                return f"no pod of Job/{job} is running"
            code, output = self._exec_short(running[0], command)
            return None if code == 0 else f"pod/{running[0]}: exit {code} ({last_line(output)})"
        except Exception as exc:  # the API server or the pod gone: the caller goes on without it
            return f"Job/{job}: {type(exc).__name__}: {first_line(exc)}"

    def _exec_short(self, pod: str, command: list[str]) -> tuple[int | None, str]:
        """A short command run in ``pod`` and waited for, STOP_TIMEOUT_S at most: its exit status and output."""
        e = self.exec_start(pod, command)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while e.pump(0.1) and time.monotonic() < deadline:
            pass
        e.close()
        return e.returncode, e.output

    def exec_stop(self, pods: list[str]) -> list[str]:
        """Stop whatever pglab started by exec in ``pods`` (``STOP_SCRIPT``: every process but the pod's own, TERM
        then KILL), each waited for; the pods that could not be told (their names and why), never raises."""
        problems = []
        for pod in pods:
            try:
                code, output = self._exec_short(pod, ["/bin/sh", "-c", STOP_SCRIPT])
                if code != 0:
                    problems.append(f"pod/{pod}: stopping its run ended with {code} ({last_line(output)})")
            except Exception as exc:  # the API server gone, the pod gone: said, and the pod is deleted later
                problems.append(f"pod/{pod}: {type(exc).__name__}: {exc}")
        return problems

    # -------------------------------------------------------------- a run over several load pods (run.load_pods)
    def run_load_job(self, m: Manifest, dest: Path, pods: int,
                     on_poll: Callable[[], None] | None = None) -> LoadOutcome:
        """Create an Indexed Job of ``pods`` load pods, wait until it is Complete (every index succeeded) or Failed
        (one failed: backoffLimit 0 ends the others), bring back each pod's log and results into
        ``dest``/load-<index>, delete it (also on a failure)."""
        self.create(m)
        deadline = time.monotonic() + self.job_timeout_s
        next_look = time.monotonic() + POD_LOOK_S
        stuck_since: float | None = None
        try:
            while True:
                if on_poll is not None:
                    on_poll()
                try:
                    st = self.batch.read_namespaced_job(m.name, self.ns).status
                except ApiException as exc:
                    raise K8sError(f"reading Job/{m.name}: {_reason(exc)}") from None
                conditions = {c.type for c in (st.conditions or []) if c.status == "True"} if st is not None else set()
                if conditions & {"Complete", "Failed"}:
                    break
                if time.monotonic() > deadline:
                    raise K8sError(f"Job/{m.name} still running after {self.job_timeout_s:.0f} s")
                if time.monotonic() >= next_look:
                    next_look = time.monotonic() + POD_LOOK_S
                    stuck_since = self._pod_cannot_start(f"job-name={m.name}", f"Job/{m.name}", stuck_since)
                interrupts.sleep(self.poll_s)
            outcome = LoadOutcome(m.name, "Complete" in conditions, [])
            for index, (pod, node, ok, log) in sorted(self._load_logs(m.name).items()):
                where = dest / LOAD_DIR.format(index=index)
                try:
                    text, files = extract_results(log, where)
                except K8sError as exc:  # a pod ended by the Job controller (another one failed) printed no end
                    text, files = f"{log}\n{exc}", []
                where.mkdir(parents=True, exist_ok=True)
                (where / "pod.log").write_text(text)
                outcome.pods.append(JobOutcome(pod, ok, text, [f"{where.name}/{f}" for f in files]))
                outcome.nodes[index] = node
            if len(outcome.pods) != pods and outcome.succeeded:
                raise K8sError(f"Job/{m.name} completed with {len(outcome.pods)} of its {pods} pods left to read")
        finally:
            self.discard(m)
        return outcome

    def _load_logs(self, job: str) -> dict[int, tuple[str, str, bool, str]]:
        """Index → (pod, node, succeeded, log) of an Indexed Job's pods (the last pod of each index)."""
        try:
            pods = self.core.list_namespaced_pod(self.ns, label_selector=f"job-name={job}").items
        except ApiException as exc:
            raise K8sError(f"listing the pods of Job/{job}: {_reason(exc)}") from None
        out: dict[int, tuple[str, str, bool, str]] = {}
        for pod in sorted(pods, key=lambda p: p.metadata.creation_timestamp or datetime.min.replace(tzinfo=UTC)):
            notes = pod.metadata.annotations or {}
            index = notes.get("batch.kubernetes.io/job-completion-index")
            if index is None or not index.isdigit():
                continue
            try:
                log = str(self.core.read_namespaced_pod_log(pod.metadata.name, self.ns))
            except ApiException as exc:
                if exc.status == 404:
                    continue  # deleted by the Job controller after another pod failed
                raise K8sError(f"reading the log of pod/{pod.metadata.name}: {_reason(exc)}") from None
            node = (pod.spec.node_name if pod.spec is not None else None) or ""
            out[int(index)] = (pod.metadata.name, node, pod.status is not None and pod.status.phase == "Succeeded", log)
        return out

    def discard(self, m: Manifest) -> None:
        """Delete an object this orchestrator created, now rather than at the end (a no-op once it is gone)."""
        if m in self.created:
            self.created.remove(m)
            self.delete(m)

    # -------------------------------------------------------------- the storage axis: a Cluster replaced
    def wait_cluster_gone(self, name: str, timeout_s: float = CLUSTER_GONE_S) -> None:
        """After the Cluster's deletion: its claims deleted too (not left to the garbage collector, whose pace is
        its own) and both waited for, so a new Cluster of that name starts on new volumes, never on the old."""
        selector = f"cnpg.io/cluster={name}"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                claims = self.core.list_namespaced_persistent_volume_claim(self.ns, label_selector=selector).items
                for pvc in claims:
                    if pvc.metadata.deletion_timestamp is None:
                        self.core.delete_namespaced_persistent_volume_claim(pvc.metadata.name, self.ns)
                try:
                    self.custom.get_namespaced_custom_object(*CNPG[:2], self.ns, CNPG[2], name)
                    cluster_left = True
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                    cluster_left = False
            except ApiException as exc:
                raise K8sError(f"waiting for Cluster/{name} and its claims to go: {_reason(exc)}") from None
            if not claims and not cluster_left:
                return
            if time.monotonic() > deadline:
                left = [f"PersistentVolumeClaim/{c.metadata.name}" for c in claims] + (
                    [f"Cluster/{name}"] if cluster_left else [])
                raise K8sError(f"{', '.join(left)} still there {timeout_s:.0f} s after the Cluster was deleted "
                               "(finalizers, or a pod still using a claim)")
            interrupts.sleep(self.poll_s)

    def settled_log(self, job: str) -> str | None:
        """The log of a Job that ended, once its results are whole: the last of a container's output can reach its
        log file after the Job is reported ended (seen once on a loaded lab: the results' end missing), so a log
        with the results begun and not ended is read again, every LOG_SETTLE_POLL_S for LOG_SETTLE_S at most."""
        deadline = time.monotonic() + LOG_SETTLE_S
        raw = self.job_log(job)
        while raw is not None and BEGIN_MARK in raw and END_MARK not in raw.partition(BEGIN_MARK)[2] \
                and time.monotonic() < deadline:
            interrupts.sleep(LOG_SETTLE_POLL_S)
            raw = self.job_log(job)
        return raw

    def keep_log_so_far(self, job: str, dest: Path) -> Path | None:
        """Write what a Job's pod has logged so far to ``dest``/pod.log before the Job is deleted (a Job that
        overran its deadline is diagnosed from it); None when it has no pod or its log cannot be read."""
        try:
            raw = self.job_log(job)
        except K8sError:
            return None
        if raw is None:
            return None
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "pod.log").write_text(raw)
        return dest / "pod.log"

    def job_log(self, job: str) -> str | None:
        """The log of a Job's pod so far; None while it has no pod."""
        try:
            pods = self.core.list_namespaced_pod(self.ns, label_selector=f"job-name={job}").items
            if not pods:
                return None
            return str(self.core.read_namespaced_pod_log(pods[0].metadata.name, self.ns))
        except ApiException as exc:
            raise K8sError(f"reading the log of Job/{job}: {_reason(exc)}") from None

    def job_node(self, job: str) -> str | None:
        """The node a Job's (first) pod ran on; None when it has no pod."""
        try:
            pods = self.core.list_namespaced_pod(self.ns, label_selector=f"job-name={job}").items
        except ApiException as exc:
            raise K8sError(f"listing the pods of Job/{job}: {_reason(exc)}") from None
        return next((str(p.spec.node_name) for p in pods if p.spec is not None and p.spec.node_name), None)

    def sampler_pods(self) -> dict[str, str]:
        """The disk sampler's running pods by node name (the DaemonSet's, found by pglab's labels)."""
        return self.pods_by_node(f"pglab/cluster={self.k8s.cluster_name},pglab/component={DISK_SAMPLER}",
                                 what="the disk sampler's pods")

    def pods_by_node(self, selector: str, namespace: str | None = None, what: str = "pods") -> dict[str, str]:
        """Node name → the pod (not being deleted) matching ``selector`` there: one per node, as a DaemonSet's."""
        try:
            pods = self.core.list_namespaced_pod(namespace or self.ns, label_selector=selector).items
        except ApiException as exc:
            raise K8sError(f"listing {what}: {_reason(exc)}") from None
        return {p.spec.node_name: p.metadata.name for p in pods
                if p.spec is not None and p.spec.node_name and p.metadata.deletion_timestamp is None}

    def pod_log(self, name: str, since_seconds: int | None = None) -> str:
        """A pod's log, its last ``since_seconds`` only when given (the kubelet keeps the lines' arrival times)."""
        kw: dict[str, Any] = {"since_seconds": since_seconds} if since_seconds is not None else {}
        try:
            return str(self.core.read_namespaced_pod_log(name, self.ns, **kw))
        except ApiException as exc:
            raise K8sError(f"reading the log of pod/{name}: {_reason(exc)}") from None

    def delete_pod(self, name: str, grace_s: int = KILL_GRACE_S) -> None:
        """Delete one pod (the failover scenario's fault: CloudNativePG then promotes a standby).

        With the pod's default grace period the instance manager would run a smart shutdown (up to the Cluster's
        smartShutdownTimeout, 180 s), sessions going on meanwhile: a planned stop, not a failure. One second of
        grace makes it the kubelet's SIGKILL, as a crash; not 0, which would remove the pod object before its
        containers are dead and let the operator start another on the same volume."""
        try:
            self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=grace_s)
        except ApiException as exc:
            raise K8sError(f"deleting pod/{name} in {self.ns}: {_reason(exc)}") from None

    def instance_node(self, name: str) -> str:
        """The node an instance pod of the Cluster was scheduled to."""
        node = next((p.spec.node_name for p in self.instance_pods() if p.metadata.name == name and p.spec), None)
        if not node:
            raise K8sError(f"pod/{name} in {self.ns} is on no node")
        return str(node)

    def cordon(self, node: str, unschedulable: bool = True) -> None:
        """Mark a node unschedulable (``kubectl cordon``) or schedulable again (``uncordon``)."""
        try:
            self.core.patch_node(node, {"spec": {"unschedulable": unschedulable or None}})
        except ApiException as exc:
            raise K8sError(f"{'cordoning' if unschedulable else 'uncordoning'} node {node}: {_reason(exc)}",
                           exc.status) from None

    def evict(self, pod: str) -> bool:
        """Ask for a pod's eviction as ``kubectl drain`` does; False while a PodDisruptionBudget refuses it (429)."""
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=self.ns))
        try:
            self.core.create_namespaced_pod_eviction(pod, self.ns, body)
        except ApiException as exc:
            if exc.status == 429:
                return False
            if exc.status == 404:
                return True
            raise K8sError(f"evicting pod/{pod} in {self.ns}: {_reason(exc)}", exc.status) from None
        return True

    # -------------------------------------------------------------- the whole plan
    def run(self, out_dir: Path) -> list[JobOutcome]:
        """Access, database, storage phase, init, every run; everything created is deleted at the end."""
        manifests = render(self.plan, self.base_dir)
        outcomes: list[JobOutcome] = []
        try:
            for m in manifests:
                if m.kind == "Job":
                    continue
                self.create(m)
                if m.kind == "Cluster":
                    self.log(f"waiting for Cluster/{m.name} ({self.k8s.instances} instances)")
                    self.wait_cluster_ready()
            # a witness Job runs beside its run's Job, during a scenario: only `pglab run` schedules that
            for m in (m for m in manifests if m.kind == "Job" and m.body["metadata"]["labels"]["pglab/component"]
                      != "witness"):
                self.log(f"running Job/{m.name}")
                outcome = self.run_job(m, out_dir / m.name)
                outcomes.append(outcome)
                if not outcome.succeeded and m.body["metadata"]["labels"]["pglab/component"] == "pgbench-init":
                    raise K8sError(f"Job/{m.name} failed: {outcome.log.strip()[-300:]}")
        finally:
            problems = self.cleanup()
            for p in problems:
                self.log(f"cleanup: {p}")
        return outcomes


def _snake(kind: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in kind).lstrip("_")


def _reason(exc: ApiException) -> str:
    return f"{exc.status} {exc.reason}".strip()
