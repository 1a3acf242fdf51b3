"""A fake Kubernetes API server at the HTTP boundary, shared by the orchestration and the `pglab run` tests.

It is a real HTTP server speaking the REST paths the official client uses (namespaces, RBAC, CNPG clusters, Jobs,
PVCs, ConfigMaps, pods and their logs, the pod proxy, /version); it keeps the objects, plays the operator (a Cluster
turns healthy after a few reads; a merge PATCH of its resources or parameters starts a rolling update that recreates
the instance pods one by one, primary last, over a few reads; deleting the primary pod starts a failover that names
and promotes another instance over a few reads) and the Job controller (a Job ends after a read, its
pod's log carries a results tarball), each instance's metrics exporter behind the pod proxy, and the disk sampler
DaemonSet's controller (one pod on each instance's node, instance n on node-n, whose log is ``diskstats_log``).
For the preflight (``pglab k8s check``) it also serves what a cluster has before pglab comes: nodes with labels,
taints and conditions, storage classes, the CloudNativePG CRD and operator Deployment, API discovery, and answers
SelfSubjectAccessReviews (every permission granted unless listed in ``denied``); by default a cluster the tests'
plans pass on. Nothing is mocked inside pglab or the client.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from kubernetes import client

from pglab.targets.kubernetes.orchestrate import FENCED, HEALTHY, SWITCHOVER
from pglab.targets.kubernetes.render import BEGIN_MARK, DISKSTATS_MARK, END_MARK, VOLUME_MARK


def results_log(files: dict[str, str], text: str = "progress: 1.0 s, 100 tps\n") -> str:
    """A pod log as a pglab Job prints it: its own output, then its /results folder as a base64 tarball."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, content in files.items():
            data = content.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob = base64.encodebytes(buf.getvalue()).decode()
    return f"{text}{BEGIN_MARK}\n{blob}{END_MARK}\n"


class FakeAPI:
    """Objects by path; the operator and the Job controller reduced to what pglab waits for."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.created: list[str] = []  # every object path ever created, in order
        self.posted: list[dict[str, Any]] = []  # every object body ever created, as posted
        self.job_posts: list[tuple[int, str]] = []  # (index in requests, name) of every Job created
        self.ready_after = 2  # Cluster reads before it is healthy
        self.never_ready = False
        self.unhealthy_after_jobs: set[str] = set()  # the Cluster reads unhealthy once one of these Jobs was read
        self.failing_jobs: set[str] = set()
        self.hanging_jobs: set[str] = set()  # Jobs that never end
        self.forbidden: set[str] = set()  # collection paths that answer 403
        self.forbidden_gets: set[str] = set()  # object paths whose GET answers 403
        self.pod_waiting: dict[str, list[tuple[str, str]]] = {}  # job -> (reason, message)s its pod waits with
        self.status_conflicts = 0  # Cluster status patches answered 409 before one is applied
        self.proxy_forbidden = False  # every pod proxy read answers 403
        self.terminating_reads = 0  # a namespace in phase Terminating goes after this many more reads
        self.logs: dict[str, str] = {}
        self.log_not_ready: dict[str, int] = {}  # job -> log reads answering 400 (its container still starting)
        self.default_log: Callable[[str], str] = lambda job: results_log({"pgbench.out": f"{job} done\n"})
        self.on_job_created: Callable[[str], None] = lambda job: None
        self.reads: dict[str, int] = {}
        self.job_seconds = 0.0  # a Job also stays active this long after its creation (exporter samples need time)
        self.job_created_at: dict[str, float] = {}
        self.rollout_reads = 3  # Cluster reads a rolling update lasts after a PATCH
        self.stuck_rollout = False  # a rolling update that never ends (one replica never comes back)
        self.on_patch: Callable[[dict[str, Any]], None] = lambda patch: None
        self.patches: list[dict[str, Any]] = []
        self.phases: list[str] = []  # every phase the Cluster was read in, in order
        # the exporter of each instance: (pod, time served) -> its text; None answers 503 as a pod not ready would
        self.exporter: Callable[[str, float], str | None] = lambda pod, t: (
            exporter_text(pod, standbys={p: CAUGHT_UP for p in self._pods if p != pod}) if pod == self.primary else
            exporter_text(pod, primary=False))
        self.scrapes: list[tuple[str, float, str]] = []  # (pod, time served, text) of every scrape answered
        self.lock = threading.Lock()
        self._degraded = False
        self._rollout: dict[str, Any] | None = None  # {"left": reads, "old": pod spec, "new": pod spec}
        self._pods: dict[str, dict[str, Any]] = {}  # instance pod name -> its resources and parameters
        # the failover: deleting the primary pod makes the operator promote the next instance after this many
        # Cluster reads ("Failing over", targetPrimary pending, then named), and report it healthy a read later
        self.promote_after = 3
        self.never_promote = False  # the failover never completes (no standby can be promoted)
        self.primary = ""  # the current primary's pod name, set when the Cluster is created
        self.deleted_pods: list[tuple[str, float]] = []
        self.killed_at_cleanup: list[tuple[str, dict[str, list[str]]]] = []  # instance pods deleted after the Cluster
        self.pod_delete_queries: list[dict[str, list[str]]] = []  # the query of each instance pod's deletion
        self.status_patches: list[dict[str, Any]] = []  # every patch of the Cluster's status (switchover requests)
        self.fenced_reads: list[list[str]] = []  # the fenced instances at every Cluster read
        self.unfence_reads = 0  # Cluster reads a standby stays not ready after its fence is lifted
        self._restarting = 0
        self.ready_reads: list[tuple[float, int]] = []  # (time, readyInstances) of every Cluster read
        self._failover: dict[str, Any] | None = None
        # the disk sampler: its pods exist once its DaemonSet does (unless ``no_sampler_pods``), one per instance
        # node; each one's log is diskstats_log(node); nodes in ``sampler_log_forbidden`` answer 403
        self.no_sampler_pods = False
        self.diskstats_log: Callable[[str], str] = lambda node: ""
        self.sampler_log_forbidden: set[str] = set()
        self.log_queries: list[tuple[str, dict[str, list[str]]]] = []  # (pod, query) of every sampler log read
        # node-exporter (namespace "monitoring"): a pod on each instance node (but those in no_node_exporter_on)
        # once set; node_exporter(node, time served) is its text
        self.node_exporter: Callable[[str, float], str | None] | None = None
        self.no_node_exporter_on: set[str] = set()
        self.node_exporter_schemes: set[str] = set()  # the schemes pglab's proxy reads named (http unless given)
        # the volume probe: what the mount of each claim is on (device number, fstype, source), as its log says
        self.volume_mount: Callable[[str], tuple[str, str, str]] = lambda claim: ("254:16", "ext4", "/dev/vdb")
        self._wal = False  # the Cluster has a WAL volume: its pods mount a second claim
        self._generation: dict[str, int] = {}  # instance pod -> times it was recreated (its uid changes)
        self.boot_id: Callable[[str], str] = boot_id  # each node's kernel boot id (as the probe prints it)
        # what the preflight reads: the cluster as it is before pglab comes (enough for the tests' plans)
        self.nodes: list[dict[str, Any]] = [node(f"node-{i}") for i in range(1, 5)]
        self.storage_classes: list[dict[str, Any]] = [storage_class("standard", default=True)]
        self.crds: dict[str, dict[str, Any]] = {CNPG_CRD: cnpg_crd()}
        self.deployments: list[dict[str, Any]] = [operator_deployment()]
        self.denied: set[tuple[str, str, str]] = set()  # (verb, group, resource[/subresource]) reviews refuse
        self.access_reviews: list[dict[str, str]] = []  # the resourceAttributes of every review asked

    def handle(self, method: str, url: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        parsed = urlparse(url)
        path = parsed.path
        with self.lock:
            self.requests.append((method, path))
            if method == "GET" and path.rstrip("/") == "/version":
                return 200, {"major": "1", "minor": "33", "emulationMajor": "1", "emulationMinor": "33",
                             "minCompatibilityMajor": "1", "minCompatibilityMinor": "32", "gitVersion": "v1.33.1-fake",
                             "gitCommit": "0" * 40, "gitTreeState": "clean", "buildDate": "2025-05-15T08:19:08Z",
                             "goVersion": "go1.24.2", "compiler": "gc", "platform": "linux/amd64"}
            if (answer := self._cluster_wide(method, path, parse_qs(parsed.query), body)) is not None:
                return answer
            if method == "PATCH":
                return self._patch(path, body)
            if method == "GET" and "/proxy/" in path and path.split("/")[4] == NODE_EXPORTER_NS:
                target = unquote(path.split("/")[6]).split(":")
                self.node_exporter_schemes.add(target[0] if len(target) == 3 else "http")
                node = target[-2].removeprefix("node-exporter-")
                text = self.node_exporter(node, time.time()) if self.node_exporter is not None else None
                if text is None:
                    return 503, {"kind": "Status", "status": "Failure", "reason": "ServiceUnavailable", "code": 503}
                return 200, text
            if method == "GET" and "/proxy/" in path and self.proxy_forbidden:  # no pods/proxy in the identity
                return 403, {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}
            if method == "GET" and "/proxy/" in path:
                pod = unquote(path.split("/")[6]).split(":")[0]
                served_at = time.time()
                text = self.exporter(pod, served_at)
                if text is None:
                    return 503, {"kind": "Status", "status": "Failure", "reason": "ServiceUnavailable", "code": 503}
                self.scrapes.append((pod, served_at, text))
                return 200, text
            if method == "POST":
                if path in self.forbidden:
                    return 403, {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}
                assert body is not None
                key = f"{path}/{body['metadata']['name']}"
                if key in self.objects:
                    return 409, {"kind": "Status", "status": "Failure", "reason": "AlreadyExists", "code": 409}
                ns = path.split("/")[4] if path.count("/") >= 5 else None
                if ns is not None and self.objects.get(f"/api/v1/namespaces/{ns}", {}).get("status", {}).get(
                        "phase") == "Terminating":  # NamespaceLifecycle admission
                    return 403, {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
                                 "message": f"unable to create new content in namespace {ns} because it is being "
                                            "terminated"}
                self.objects[key] = body
                self.created.append(key)
                self.posted.append(json.loads(json.dumps(body)))
                if body["kind"] == "Cluster":
                    body["metadata"]["resourceVersion"] = "1"
                    spec = _pod_spec(body)
                    self._pods = {f"{body['metadata']['name']}-{i}": spec for i in range(1, body["spec"]["instances"]
                                                                                          + 1)}
                    self.primary = f"{body['metadata']['name']}-1"
                    self._wal = "walStorage" in body["spec"]
                if body["kind"] == "Job":
                    self.job_posts.append((len(self.requests) - 1, body["metadata"]["name"]))
                    self.job_created_at[body["metadata"]["name"]] = time.time()
                    threading.Thread(target=self.on_job_created, args=(body["metadata"]["name"],)).start()
                return 201, body
            if method == "DELETE":
                pod = path.rsplit("/", 1)[1]
                cluster_gone = not any("/clusters/" in k for k in self.objects)
                if "/pods/" in path and pod in self._pods and cluster_gone:  # torn down: killed, not recreated
                    self._pods.pop(pod)
                    self.killed_at_cleanup.append((pod, parse_qs(parsed.query)))
                    return 200, {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": pod}}
                if "/pods/" in path and pod in self._pods:  # an instance pod: the operator recreates it
                    self._recreated(pod)
                    self.deleted_pods.append((pod, time.time()))
                    self.pod_delete_queries.append(parse_qs(parsed.query))
                    if pod == self.primary and self._failover is None:
                        self._failover = {"old": pod, "left": self.promote_after}
                    return 200, {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": pod}}
                if self.objects.pop(path, None) is None:
                    return 404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}
                if path.startswith("/api/v1/namespaces/") and path.count("/") == 4:  # a namespace: all inside
                    for key in [k for k in self.objects if k.startswith(path + "/")]:
                        del self.objects[key]
                return 200, {"kind": "Status", "status": "Success"}
            if path.endswith("/log") and (node := self._sampler_node(path.split("/")[-2])) is not None:
                self.log_queries.append((path.split("/")[-2], parse_qs(parsed.query)))
                if node in self.sampler_log_forbidden:
                    return 403, {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}
                return 200, self.diskstats_log(node)
            if path.endswith("/log"):
                job = path.split("/")[-2].removesuffix("-pod")
                if self.log_not_ready.get(job, 0) > 0:
                    self.log_not_ready[job] -= 1
                    return 400, {"kind": "Status", "status": "Failure", "reason": "BadRequest", "code": 400,
                                 "message": f'container "main" in pod "{job}-pod" is waiting to start: '
                                            "ContainerCreating"}
                if job in self.logs:
                    return 200, self.logs[job]
                if (probe := self._volume_probe(path.split("/")[4], job)) is not None:
                    return 200, probe
                return 200, self.default_log(job)
            if path.endswith("/pods") and path.split("/")[4] == NODE_EXPORTER_NS:  # node-exporter's DaemonSet
                nodes = sorted({f"node-{n.rsplit('-', 1)[1]}" for n in self._pods} - self.no_node_exporter_on)
                items = [{"metadata": {"name": f"node-exporter-{node}", "namespace": NODE_EXPORTER_NS},
                          "spec": {"nodeName": node, "containers": [{"name": "node-exporter"}]}}
                         for node in nodes if self.node_exporter is not None
                         and parse_qs(parsed.query)["labelSelector"][0] == NODE_EXPORTER_SELECTOR]
                return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
            if path.endswith("/pods"):
                selector = parse_qs(parsed.query)["labelSelector"][0]
                if "pglab/component=disk-sampler" in selector:
                    items = [{"metadata": {"name": pod, "namespace": path.split("/")[4]},
                              "spec": {"nodeName": node, "containers": [{"name": "main"}]}}
                             for pod, node in self._sampler_pods().items()]
                    return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
                if selector.startswith("cnpg.io/cluster="):
                    return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                                 "items": [self._instance_pod(n, path.split("/")[4]) for n in self._pods]}
                job = selector.removeprefix("job-name=")
                pods = [{"metadata": {"name": f"{job}-pod", "namespace": path.split("/")[4]}}]
                if self.pod_waiting.get(job):  # it cannot start: as the kubelet (or the scheduler) reports it
                    self.pod_waiting[job].append(self.pod_waiting[job].pop(0))  # the reasons take turns
                    reason, message = self.pod_waiting[job][-1]
                    pods[0]["status"] = {"phase": "Pending", "conditions": [
                        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]
                    } if reason == "Unschedulable" else {"phase": "Pending", "containerStatuses": [
                        {"name": "main", "image": "example/none:1", "imageID": "", "ready": False,
                         "restartCount": 0, "state": {"waiting": {"reason": reason, "message": message}}}]}
                return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods}
            if path in self.forbidden_gets:
                return 403, {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}
            if "/jobs/" in path and path.endswith("/status"):  # jobs/status: a subresource the Role does not grant
                return 403, {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}
            key = path.removesuffix("/status")
            obj = self.objects.get(key)
            if obj is not None and obj["kind"] == "Namespace" and obj.get("status", {}).get("phase") == "Terminating":
                self.terminating_reads -= 1  # its pods shutting down; then it is gone
                if self.terminating_reads < 0:
                    del self.objects[key]
                    obj = None
            if obj is None:
                return 404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}
            self.reads[key] = self.reads.get(key, 0) + 1
            obj = json.loads(json.dumps(obj))
            if obj["kind"] == "Cluster":
                ready = not self.never_ready and not self._degraded and self.reads[key] > self.ready_after
                n = obj["spec"]["instances"]
                obj["status"] = {"readyInstances": n if ready else 0,
                                 "phase": HEALTHY if ready else "Setting up primary",
                                 "currentPrimary": self.primary, "targetPrimary": self.primary}
                if ready and self._failover is not None:
                    obj["status"].update(self._failing_over(n))
                fenced = json.loads(obj["metadata"].get("annotations", {}).get(FENCED, "[]"))
                self.fenced_reads.append(fenced)
                if fenced:  # the operator stopped their postgres: their pods are not ready
                    obj["status"]["readyInstances"] -= len(fenced)
                elif self._restarting > 0:  # fence lifted: postgres starting again, not ready yet
                    self._restarting -= 1
                    obj["status"]["readyInstances"] -= 1
                self.ready_reads.append((time.time(), obj["status"]["readyInstances"]))
                if ready and self._rollout is not None:
                    obj["status"].update(self._roll(obj["metadata"]["name"], n))
                self.phases.append(obj["status"]["phase"])
            elif obj["kind"] == "Job":
                name = obj["metadata"]["name"]
                if name in self.unhealthy_after_jobs:
                    self._degraded = True
                young = time.time() - self.job_created_at.get(name, 0.0) < self.job_seconds
                obj["status"] = ({"active": 1} if self.reads[key] == 1 or young or name in self.hanging_jobs else
                                 {"failed": 1} if name in self.failing_jobs else {"succeeded": 1})
            return 200, obj


    # -------------------------------------------------------------- what the preflight reads
    def _cluster_wide(self, method: str, path: str, query: dict[str, list[str]],
                      body: dict[str, Any] | None) -> tuple[int, Any] | None:
        """Nodes, storage classes, CRDs, deployments in every namespace, API groups, access reviews; None for the
        other paths. A path in ``forbidden_gets`` (``forbidden`` for the reviews) answers 403."""
        forbidden = {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}
        if method == "POST" and path == ACCESS_REVIEWS:
            if path in self.forbidden:
                return 403, forbidden
            assert body is not None
            attrs = body["spec"]["resourceAttributes"]
            self.access_reviews.append(attrs)
            resource = attrs.get("resource", "") + (f"/{attrs['subresource']}" if attrs.get("subresource") else "")
            allowed = (attrs["verb"], attrs.get("group", ""), resource) not in self.denied
            return 201, {**body, "status": {"allowed": allowed} if allowed else {"allowed": False,
                                                                                  "reason": "no RBAC rule"}}
        if method != "GET":
            return None
        path = path.rstrip("/")
        lists = {"/api/v1/nodes": ("NodeList", "v1", self.nodes),
                 "/apis/storage.k8s.io/v1/storageclasses": ("StorageClassList", "storage.k8s.io/v1",
                                                             self.storage_classes),
                 "/apis/apps/v1/deployments": ("DeploymentList", "apps/v1", self.deployments)}
        crd = path.startswith(f"{CRDS}/")
        if path not in lists and not crd and path != "/apis":
            return None
        if path in self.forbidden_gets:
            return 403, forbidden
        if crd:
            found = self.crds.get(path.rsplit("/", 1)[1])
            return (200, found) if found else (404, {"kind": "Status", "status": "Failure", "reason": "NotFound",
                                                     "code": 404})
        if path == "/apis":
            groups = [{"name": c["spec"]["group"], "versions": [{"groupVersion": f"{c['spec']['group']}/{v['name']}",
                                                                 "version": v["name"]} for v in c["spec"]["versions"]]}
                      for c in self.crds.values()]
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        kind, version, items = lists[path]
        if selector := query.get("labelSelector", [""])[0]:
            wanted = dict(term.split("=", 1) for term in selector.split(","))
            items = [i for i in items if wanted.items() <= (i["metadata"].get("labels") or {}).items()]
        return 200, {"kind": kind, "apiVersion": version, "metadata": {}, "items": items}

    # -------------------------------------------------------------- the operator's failover
    def _failing_over(self, n: int) -> dict[str, Any]:
        """One read into a failover, as CloudNativePG reports it: "Failing over" with targetPrimary "pending"
        (the old primary shut down), then the new primary named as target, then promoted (currentPrimary), the
        old pod rejoining as a replica, then healthy again. A switchover names its target from the start, in phase
        "Switchover in progress"."""
        f = self._failover
        assert f is not None
        if not self.never_promote:
            f["left"] -= 1
        new = f.get("to") or next(p for p in self._pods if p != f["old"])
        if f.get("to") and (f["left"] > 0 or self.never_promote):
            return {"phase": SWITCHOVER, "readyInstances": n, "currentPrimary": f["old"], "targetPrimary": new}
        if f["left"] > 1 or self.never_promote:
            return {"phase": "Failing over", "readyInstances": n - 1, "currentPrimary": f["old"],
                    "targetPrimary": "pending"}
        if f["left"] == 1:
            return {"phase": "Failing over", "readyInstances": n - 1, "currentPrimary": f["old"],
                    "targetPrimary": new}
        if f["left"] == 0:  # promoted; the old pod restarts and rejoins as a replica
            self.primary = new
            return {"phase": "Waiting for the instances to become active", "readyInstances": n - 1,
                    "currentPrimary": new, "targetPrimary": new}
        self._failover = None
        return {}

    # -------------------------------------------------------------- the operator's rolling update
    def _patch(self, path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        """A JSON merge patch (RFC 7386, what the client sends for custom objects); a Cluster whose resources or
        parameters change starts a rolling update."""
        if path.endswith("/status"):  # the status subresource: a switchover request, as kubectl cnpg promote
            obj = self.objects.get(path.removesuffix("/status"))
            if obj is None:
                return 404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}
            assert body is not None
            self.status_patches.append(body)
            meta = obj.setdefault("metadata", {})
            if self.status_conflicts > 0:  # the operator writes the status after pglab read it
                self.status_conflicts -= 1
                meta["resourceVersion"] = str(int(meta.get("resourceVersion", "1")) + 1)
            sent = body.get("metadata", {}).get("resourceVersion")
            if sent is not None and sent != meta.get("resourceVersion", "1"):  # the optimistic lock
                return 409, {"kind": "Status", "status": "Failure", "reason": "Conflict", "code": 409}
            meta["resourceVersion"] = str(int(meta.get("resourceVersion", "1")) + 1)
            self._failover = {"old": self.primary, "left": self.promote_after, "to": body["status"]["targetPrimary"]}
            return 200, obj
        obj = self.objects.get(path)
        if obj is None:
            return 404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}
        assert body is not None
        self.patches.append(body)
        if FENCED in obj.get("metadata", {}).get("annotations", {}) and body.get("metadata", {}).get(
                "annotations", {}).get(FENCED, "") is None:
            self._restarting = self.unfence_reads  # the fence lifted: its postgres starts again
        old = _pod_spec(obj)
        _merge(obj, body)
        if obj["kind"] == "Cluster" and _pod_spec(obj) != old:
            # the operator notices at its next reconcile: one more read still says healthy, the pods unchanged
            self._rollout = {"lag": 1, "left": self.rollout_reads, "reads": self.rollout_reads, "new": _pod_spec(obj)}
        threading.Thread(target=self.on_patch, args=(body,)).start()
        return 200, obj

    def _roll(self, cluster: str, n: int) -> dict[str, Any]:
        """One read into the rolling update: replicas recreated from the highest serial down, the primary last."""
        r = self._rollout
        assert r is not None
        if r["lag"] > 0:
            r["lag"] -= 1
            return {}
        if r["left"] <= 0:
            for name in self._pods:
                if self._pods[name] != r["new"]:
                    self._recreated(name)
                self._pods[name] = r["new"]
            self._rollout = None
            return {}
        done_reads = r["reads"] - r["left"]
        if not self.stuck_rollout:
            r["left"] -= 1
        updated = n if r["left"] <= 0 else min(n - 1, (done_reads * n) // r["reads"]) if not self.stuck_rollout \
            else n - 1
        for i in range(n, n - updated, -1):  # serials n, n-1, …: the primary (1) last
            if self._pods[f"{cluster}-{i}"] != r["new"]:
                self._recreated(f"{cluster}-{i}")
            self._pods[f"{cluster}-{i}"] = r["new"]
        return {"phase": "Upgrading cluster", "readyInstances": n - 1}

    def _instance_pod(self, name: str, namespace: str) -> dict[str, Any]:
        spec = self._pods[name]
        labels = {"cnpg.io/cluster": name.rsplit("-", 1)[0], "cnpg.io/podRole": "instance",
                  "cnpg.io/instanceName": name}
        volumes = [{"name": "pgdata", "persistentVolumeClaim": {"claimName": name}},  # as CloudNativePG names them
                   {"name": "scratch-data", "emptyDir": {}}]
        if self._wal:
            volumes.append({"name": "pg-wal", "persistentVolumeClaim": {"claimName": f"{name}-wal"}})
        uid = f"00000000-0000-4000-8000-{self._generation.get(name, 0):04d}{sum(map(ord, name)):08d}"
        return {"metadata": {"name": name, "namespace": namespace, "labels": labels, "uid": uid},
                "spec": {"nodeName": f"node-{name.rsplit('-', 1)[1]}", "volumes": volumes,
                         "containers": [{"name": "postgres", "resources": spec["resources"]}]}}

    def _recreated(self, pod: str) -> None:
        """An instance pod replaced by a new one of the same name (a new uid)."""
        self._generation[pod] = self._generation.get(pod, 0) + 1

    def _volume_probe(self, namespace: str, job: str) -> str | None:
        """A volume probe Job's log, as its script prints it for the claims it mounts; None for other Jobs."""
        body = self.objects.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{job}")
        if body is None or body["metadata"]["labels"].get("pglab/component") != "volume-probe":
            return None
        claims = [v["persistentVolumeClaim"]["claimName"] for v in body["spec"]["template"]["spec"]["volumes"]]
        node = body["metadata"]["annotations"]["pglab/node"]
        return "".join(f"{VOLUME_MARK} {c} {' '.join(self.volume_mount(c))} {self.boot_id(node)}\n" for c in claims)

    # -------------------------------------------------------------- the disk sampler's DaemonSet controller
    def _sampler_pods(self) -> dict[str, str]:
        """pod name -> node, one pod per instance node while a disk-sampler DaemonSet exists."""
        sets = [k for k, o in self.objects.items() if o["kind"] == "DaemonSet"]
        if not sets or self.no_sampler_pods:
            return {}
        ds = sets[0].rsplit("/", 1)[1]
        nodes = sorted({f"node-{n.rsplit('-', 1)[1]}" for n in self._pods})
        return {f"{ds}-{node}": node for node in nodes}

    def _sampler_node(self, pod: str) -> str | None:
        return self._sampler_pods().get(pod)

    def primary_parameters(self) -> dict[str, str]:
        """The parameters the primary runs with once a run's Job has waited for them: a rolling update under way
        (and not stuck) is waited out, as the Job's wait loop does."""
        primary = next(name for name in self._pods if name.endswith("-1"))
        if self._rollout is not None and not self.stuck_rollout:
            return dict(self._rollout["new"]["parameters"])
        return dict(self._pods[primary]["parameters"])

    def pod_resources(self) -> dict[str, dict[str, Any]]:
        """Each instance pod's resources as the fake's pods have them now."""
        return {name: spec["resources"] for name, spec in self._pods.items()}


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    """What an instance pod takes from the Cluster: resources, and the parameters it runs with."""
    spec = obj.get("spec", {})
    return json.loads(json.dumps({"resources": spec.get("resources", {}),
                                  "parameters": spec.get("postgresql", {}).get("parameters", {})}))


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = v


# ------------------------------------------------------------------ the exporter
CAUGHT_UP = {"replay_diff_bytes": 0.0, "replay_lag_seconds": 0.0, "write_lag_seconds": 0.0, "flush_lag_seconds": 0.0}


def exporter_text(pod: str, values: dict[str, float | None] | None = None, *, primary: bool = True,
                  standbys: dict[str, dict[str, float]] | None = None, pg17: bool = False,
                  stats_reset: str = "2026-11-20T08:12:31.203411Z", database: str = "app") -> str:
    """The text CloudNativePG's exporter serves on :9187/metrics, for the metrics pglab reads.

    The shape (HELP/TYPE lines, metric and label names, Go's float formatting such as 1.3429908e+07, the
    ``stats_reset`` label of the pg_stat_wal figures, one sample per database with the empty datname of shared
    objects) follows a real exporter dump of a CloudNativePG 1.24 instance running PostgreSQL 16.5, published in
    tensorchord/pgvecto.rs-docs (src/cloud/monitoring/collect-metrics.md), and the metric definitions of
    cloudnative-pg's config/manager/default-monitoring.yaml and metricserver/pg_collector.go (PostgreSQL 17 moves
    the checkpoint counters to cnpg_pg_stat_checkpointer_*). Values are the given ones over defaults from that
    dump; a value given as None is left out, as an exporter that does not serve it."""
    v = {"xact_commit": 7887.0, "xact_rollback": 3.0, "blks_read": 316.0, "blks_hit": 1284724.0,
         "wal_bytes": 13429908.0, "checkpoints_timed": 4.0, "checkpoints_req": 2.0, "buffers_checkpoint": 1145.0,
         **(values or {})}
    v = {k: x for k, x in v.items() if x is not None}  # None: the exporter does not serve it
    out: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
        out.extend(f"{name}{labels} {_go_float(value)}" for labels, value in samples)

    family("cnpg_collector_up", "gauge", "1 if PostgreSQL is up, 0 otherwise.", [(f'{{cluster="{pod[:-2]}"}}', 1)])
    if "wal_bytes" in v:
        family("cnpg_collector_wal_bytes", "gauge", "Total amount of WAL generated in bytes. Only available on PG 14+",
               [(f'{{stats_reset="{stats_reset}"}}', v["wal_bytes"])])
    family("cnpg_collector_wal_records", "gauge", "Total number of WAL records generated. Only available on PG 14+",
           [(f'{{stats_reset="{stats_reset}"}}', 32123)])
    family("cnpg_pg_replication_in_recovery", "gauge", "Whether the instance is in recovery",
           [("", 0 if primary else 1)])
    family("cnpg_pg_replication_lag", "gauge", "Replication lag behind primary in seconds", [("", 0)])
    prefix, written = ("cnpg_pg_stat_checkpointer", "buffers_written") if pg17 else ("cnpg_pg_stat_bgwriter",
                                                                                     "buffers_checkpoint")
    for metric, key, text in ((written, "buffers_checkpoint", "Number of buffers written during checkpoints"),
                              ("checkpoints_req", "checkpoints_req", "Number of requested checkpoints that have "
                               "been performed"),
                              ("checkpoints_timed", "checkpoints_timed", "Number of scheduled checkpoints that have "
                               "been performed")):
        if key in v:
            family(f"{prefix}_{metric}", "counter", text, [("", v[key])])
    for metric, text in (("blks_hit", "Number of times disk blocks were found already in the buffer cache"),
                         ("blks_read", "Number of disk blocks read in this database"),
                         ("xact_commit", "Number of transactions in this database that have been committed"),
                         ("xact_rollback", "Number of transactions in this database that have been rolled back")):
        if metric in v:
            family(f"cnpg_pg_stat_database_{metric}", "counter", text,
                   [('{datname=""}', 94), (f'{{datname="{database}"}}', v[metric]), ('{datname="postgres"}', 5928),
                    ('{datname="template0"}', 0), ('{datname="template1"}', 1177)])
    if primary and standbys:
        for metric, text in (("flush_lag_seconds", "Time elapsed between flushing recent WAL locally and receiving "
                              "notification that this standby server has written and flushed it"),
                             ("replay_diff_bytes", "Difference in bytes from the last write-ahead log location "
                              "replayed into the database on this standby server"),
                             ("replay_lag_seconds", "Time elapsed between flushing recent WAL locally and receiving "
                              "notification that this standby server has written, flushed and applied it"),
                             ("write_lag_seconds", "Time elapsed between flushing recent WAL locally and receiving "
                              "notification that this standby server has written it")):
            family(f"cnpg_pg_stat_replication_{metric}", "gauge", text,
                   [(f'{{application_name="{name}",client_addr="10.244.0.{11 + i}",client_port="4{i}210",'
                     f'usename="streaming_replica"}}', lags[metric])
                    for i, (name, lags) in enumerate(sorted(standbys.items())) if metric in lags])
    family("go_goroutines", "gauge", "Number of goroutines that currently exist.", [("", 77)])
    return "\n".join(out) + "\n"


def _go_float(value: float) -> str:
    """A value as the Prometheus Go client prints it (strconv 'g', shortest digits): exponent form from 1e+06 up
    and below 1e-04 (13429908 → 1.3429908e+07), plain otherwise (1145, 0.00123)."""
    if value != value:
        return "NaN"
    if value == 0:
        return "0"
    sign, digits, exponent = Decimal(repr(float(value))).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    exp10 = len(text) + exponent - 1
    if exp10 < -4 or exp10 >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{'-' if sign else ''}{mantissa}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"
    return f"{'-' if sign else ''}{Decimal((0, digits, exponent)):f}"


@contextmanager
def serve() -> Iterator[tuple[FakeAPI, client.ApiClient]]:
    """The fake on a free loopback port, and an official client pointed at it."""
    api = FakeAPI()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            if self.command == "PATCH" and self.headers.get("Content-Type") != "application/merge-patch+json":
                status, payload = 415, {"kind": "Status", "status": "Failure", "reason": "UnsupportedMediaType",
                                        "code": 415}  # the fake applies RFC 7386 merge patches only
            else:
                status, payload = api.handle(self.command, self.path, body)
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PATCH = _serve

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    conf = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    try:
        with client.ApiClient(conf) as api_client:
            yield api, api_client
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------ the cluster before pglab: the preflight's view
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CNPG_CRD = "clusters.postgresql.cnpg.io"


def node(name: str, labels: dict[str, str] | None = None, taints: list[tuple[str, str, str]] | None = None, *,
         unschedulable: bool = False, ready: bool = True) -> dict[str, Any]:
    """A Node as the API serves it: the kubelet's hostname label, the given labels, taints (key, value, effect),
    a cordon, the Ready condition."""
    spec: dict[str, Any] = {"podCIDR": "10.244.0.0/24"}
    if taints:
        spec["taints"] = [{"key": k, **({"value": v} if v else {}), "effect": e} for k, v, e in taints]
    if unschedulable:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                  **(labels or {})}},
            "spec": spec,
            "status": {"conditions": [{"type": "MemoryPressure", "status": "False"},
                                      {"type": "Ready", "status": "True" if ready else "False"}]}}


def storage_class(name: str, default: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if default:
        meta["annotations"] = {"storageclass.kubernetes.io/is-default-class": "true"}
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": meta,
            "provisioner": "rancher.io/local-path", "reclaimPolicy": "Delete",
            "volumeBindingMode": "WaitForFirstConsumer"}


def cnpg_crd(versions: tuple[str, ...] = ("v1",)) -> dict[str, Any]:
    """CloudNativePG's Cluster CRD, its schema left out."""
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": CNPG_CRD},
            "spec": {"group": "postgresql.cnpg.io", "scope": "Namespaced",
                     "names": {"kind": "Cluster", "listKind": "ClusterList", "plural": "clusters",
                               "singular": "cluster"},
                     "versions": [{"name": v, "served": True, "storage": True} for v in versions]}}


def operator_deployment(version: str = "1.27.1", *, image: str | None = None, labelled: bool = True,
                        namespace: str = "cnpg-system") -> dict[str, Any]:
    """The operator's Deployment as the release manifest installs it (its label, its manager container)."""
    meta: dict[str, Any] = {"name": "cnpg-controller-manager", "namespace": namespace}
    if labelled:
        meta["labels"] = {"app.kubernetes.io/name": "cloudnative-pg"}
    container = {"name": "manager", "image": image or f"ghcr.io/cloudnative-pg/cloudnative-pg:{version}",
                 "command": ["/manager"]}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {"replicas": 1, "template": {"spec": {"containers": [container]}}}}


# ------------------------------------------------------------------ node-exporter
NODE_EXPORTER_NS = "monitoring"
NODE_EXPORTER_SELECTOR = "app.kubernetes.io/name=prometheus-node-exporter"  # the plan's default labels


def node_exporter_text(counters: dict[str, list[int]], boot_time: float = 1763798400.0) -> str:
    """node-exporter's diskstats collector output for /proc/diskstats counters (DEVICES, all zero unless given):
    node_disk_info with the numbers, then the counters with sectors × 512 as bytes and milliseconds / 1000 as
    seconds, as collector/diskstats_linux.go writes them; its default filter leaves loop, zram and partitions out."""
    shown = [(ma, mi, name) for ma, mi, name in DEVICES if not name.startswith(("loop", "zram"))]
    out = ["# HELP node_disk_info Info of /sys/block/<block_device>.", "# TYPE node_disk_info gauge"]
    out += [f'node_disk_info{{device="{name}",major="{ma}",minor="{mi}",model="",path="pci-0000:00:0{4 + i}.0",'
            f'revision="",rotational="1",serial="",wwn=""}} 1' for i, (ma, mi, name) in enumerate(shown)]
    for metric, index, scale in (("reads_completed_total", 0, 1), ("reads_merged_total", 1, 1),
                                 ("read_bytes_total", 2, 512), ("read_time_seconds_total", 3, 0.001),
                                 ("writes_completed_total", 4, 1), ("writes_merged_total", 5, 1),
                                 ("written_bytes_total", 6, 512), ("write_time_seconds_total", 7, 0.001),
                                 ("io_now", 8, 1), ("io_time_seconds_total", 9, 0.001),
                                 ("io_time_weighted_seconds_total", 10, 0.001)):
        out += [f"# HELP node_disk_{metric} .", f"# TYPE node_disk_{metric} counter"]
        out += [f'node_disk_{metric}{{device="{name}"}} {_go_float(counters.get(name, [0] * 17)[index] * scale)}'
                for _, _, name in shown]
    out += ["# HELP node_load1 1m load average.", "# TYPE node_load1 gauge", "node_load1 0.42",
            "# HELP node_boot_time_seconds Node boot time, in unixtime.", "# TYPE node_boot_time_seconds gauge",
            f"node_boot_time_seconds {_go_float(boot_time)}"]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ the disk sampler's log
# The devices of the machine these tests were written on (its /proc/diskstats: 8 loop devices, the virtio disk vda,
# zram0), with a second virtio disk vdb as the database volume; 17 counters a line, as kernels since 5.5 print.
DEVICES = [(7, i, f"loop{i}") for i in range(8)] + [(254, 0, "vda"), (254, 16, "vdb"), (253, 0, "zram0")]


def diskstats_text(counters: dict[str, list[int]]) -> str:
    """/proc/diskstats as the kernel prints it ("%4d %7d %s" then the counters); a device not given is all zeros.
    Counters in the kernel's order: reads, reads merged, sectors read, ms reading, writes, writes merged, sectors
    written, ms writing, in flight, ms doing I/O, weighted ms, then discards (4), flushes (2)."""
    lines = []
    for major, minor, name in DEVICES:
        values = counters.get(name, [0] * 17)
        assert len(values) == 17
        lines.append(f"{major:4d} {minor:7d} {name} " + " ".join(map(str, values)))
    return "\n".join(lines)


def boot_id(node: str) -> str:
    """A kernel boot id of the node's own (a machine per node)."""
    return f"00000000-0000-4000-8000-{sum(map(ord, node)):012d}"


def sampler_log(node: str, blocks: list[tuple[float, dict[str, list[int]]]], kernel: str | None = None) -> str:
    """The disk sampler pod's log as its script prints it: per sample a header with the node's epoch (date
    +%s.%N, nine decimals), name and kernel boot id (a machine per node by default), the file, an end line."""
    kernel = kernel or boot_id(node)
    return "".join(f"{DISKSTATS_MARK} {ts:.9f} {node} {kernel}\n{diskstats_text(c)}\n{DISKSTATS_MARK} end\n"
                   for ts, c in blocks)
