"""CloudNativePG's operator reduced to what pglab waits for: a Cluster turns healthy after a few reads; a merge
PATCH of its resources or parameters starts a rolling update that recreates the instance pods one by one, primary
last, over a few reads; deleting the primary pod starts a failover that names and promotes another instance over a
few reads; a status patch naming a target primary is a switchover; fencing stops instances. Also each instance's
metrics exporter behind the pod proxy."""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from pglab.targets.kubernetes.orchestrate import FENCED, HEALTHY, SWITCHOVER

from .routing import Answer, Request, forbidden, not_found, status, unavailable
from .store import copy, merge
from .texts import CAUGHT_UP, exporter_text

if TYPE_CHECKING:
    from .server import FakeAPI

CLUSTER = r"/apis/postgresql\.cnpg\.io/v1/namespaces/[^/]+/clusters/[^/]+"


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    """What an instance pod takes from the Cluster: resources, and the parameters it runs with."""
    spec = obj.get("spec", {})
    return copy({"resources": spec.get("resources", {}),
                 "parameters": spec.get("postgresql", {}).get("parameters", {})})


class Operator:
    def __init__(self, api: FakeAPI) -> None:
        self.api = api
        self.pods: dict[str, dict[str, Any]] = {}  # instance pod name -> its resources and parameters
        self.wal = False  # the Cluster has a WAL volume: its pods mount a second claim
        self.generation: dict[str, int] = {}  # instance pod -> times it was recreated (its uid changes)
        self.degraded = False  # a Job in api.unhealthy_after_jobs was read: the Cluster reads unhealthy
        self.rollout: dict[str, Any] | None = None  # {"lag", "left", "reads", "new": pod spec}
        self.failover: dict[str, Any] | None = None  # {"old": pod, "left": reads, "to": target (a switchover)}
        self.restarting = 0  # Cluster reads an unfenced standby still reads not ready

    def created(self, body: dict[str, Any]) -> None:
        body["metadata"]["resourceVersion"] = "1"
        spec = pod_spec(body)
        name = body["metadata"]["name"]
        self.pods = {f"{name}-{i}": spec for i in range(1, body["spec"]["instances"] + 1)}
        self.api.primary = f"{name}-1"
        self.wal = "walStorage" in body["spec"]

    def read(self, key: str, obj: dict[str, Any]) -> None:
        """The Cluster's status at this read."""
        api = self.api
        ready = not api.never_ready and not self.degraded and api.reads[key] > api.ready_after
        coming = not ready and not api.never_ready and not self.degraded and api.reads[key] > 1  # the primary up
        n = obj["spec"]["instances"]
        obj["status"] = {"readyInstances": n if ready else 1 if coming else 0,
                         "phase": HEALTHY if ready else "Creating a new replica" if coming else "Setting up primary",
                         "currentPrimary": api.primary, "targetPrimary": api.primary}
        if ready and self.failover is not None:
            obj["status"].update(self._failing_over(n))
        fenced = json.loads(obj["metadata"].get("annotations", {}).get(FENCED, "[]"))
        api.fenced_reads.append(fenced)
        if fenced:  # the operator stopped their postgres: their pods are not ready
            obj["status"]["readyInstances"] -= len(fenced)
        elif self.restarting > 0:  # fence lifted: postgres starting again, not ready yet
            self.restarting -= 1
            obj["status"]["readyInstances"] -= 1
        api.ready_reads.append((time.time(), obj["status"]["readyInstances"]))
        if ready and self.rollout is not None:
            obj["status"].update(self._roll(obj["metadata"]["name"], n))
        api.phases.append(obj["status"]["phase"])

    def patch(self, req: Request) -> Answer:
        """A JSON merge patch (RFC 7386, what the client sends for custom objects); a Cluster whose resources or
        parameters change starts a rolling update."""
        api = self.api
        obj = api.objects.get(req.path)
        if obj is None:
            return not_found()
        body = req.body
        assert body is not None
        api.patches.append(body)
        if FENCED in obj.get("metadata", {}).get("annotations", {}) and body.get("metadata", {}).get(
                "annotations", {}).get(FENCED, "") is None:
            self.restarting = api.unfence_reads  # the fence lifted: its postgres starts again
        old = pod_spec(obj)
        merge(obj, body)
        if obj["kind"] == "Cluster" and pod_spec(obj) != old:
            # the operator notices at its next reconcile: one more read still says healthy, the pods unchanged
            self.rollout = {"lag": 1, "left": api.rollout_reads, "reads": api.rollout_reads, "new": pod_spec(obj)}
        threading.Thread(target=api.on_patch, args=(body,)).start()
        return 200, obj

    def switchover(self, req: Request) -> Answer:
        """The status subresource: a switchover request, as kubectl cnpg promote sends it."""
        api = self.api
        obj = api.objects.get(req.path.removesuffix("/status"))
        if obj is None:
            return not_found()
        body = req.body
        assert body is not None
        api.status_patches.append(body)
        meta = obj.setdefault("metadata", {})
        if api.status_conflicts > 0:  # the operator writes the status after pglab read it
            api.status_conflicts -= 1
            meta["resourceVersion"] = str(int(meta.get("resourceVersion", "1")) + 1)
        sent = body.get("metadata", {}).get("resourceVersion")
        if sent is not None and sent != meta.get("resourceVersion", "1"):  # the optimistic lock
            return status(409, "Conflict")
        meta["resourceVersion"] = str(int(meta.get("resourceVersion", "1")) + 1)
        self.failover = {"old": api.primary, "left": api.promote_after, "to": body["status"]["targetPrimary"]}
        return 200, obj

    # -------------------------------------------------------------- the failover
    def _failing_over(self, n: int) -> dict[str, Any]:
        """One read into a failover, as CloudNativePG reports it: "Failing over" with targetPrimary "pending"
        (the old primary shut down), then the new primary named as target, then promoted (currentPrimary), the
        old pod rejoining as a replica, then healthy again. A switchover names its target from the start, in phase
        "Switchover in progress"."""
        f, never = self.failover, self.api.never_promote
        assert f is not None
        if not never:
            f["left"] -= 1
        new = f.get("to") or next(p for p in self.pods if p != f["old"])
        if f.get("to") and (f["left"] > 0 or never):
            return {"phase": SWITCHOVER, "readyInstances": n, "currentPrimary": f["old"], "targetPrimary": new}
        if f["left"] > 1 or never:
            return {"phase": "Failing over", "readyInstances": n - 1, "currentPrimary": f["old"],
                    "targetPrimary": "pending"}
        if f["left"] == 1:
            return {"phase": "Failing over", "readyInstances": n - 1, "currentPrimary": f["old"],
                    "targetPrimary": new}
        if f["left"] == 0:  # promoted; the old pod restarts and rejoins as a replica
            self.api.primary = new
            return {"phase": "Waiting for the instances to become active", "readyInstances": n - 1,
                    "currentPrimary": new, "targetPrimary": new}
        self.failover = None
        return {}

    # -------------------------------------------------------------- the rolling update
    def _roll(self, cluster: str, n: int) -> dict[str, Any]:
        """One read into the rolling update: replicas recreated from the highest serial down, the primary last."""
        r, stuck = self.rollout, self.api.stuck_rollout
        assert r is not None
        if r["lag"] > 0:
            r["lag"] -= 1
            return {}
        if r["left"] <= 0:
            for name in self.pods:
                if self.pods[name] != r["new"]:
                    self._recreated(name)
                self.pods[name] = r["new"]
            self.rollout = None
            return {}
        done_reads = r["reads"] - r["left"]
        if not stuck:
            r["left"] -= 1
        updated = n if r["left"] <= 0 else min(n - 1, (done_reads * n) // r["reads"]) if not stuck else n - 1
        for i in range(n, n - updated, -1):  # serials n, n-1, …: the primary (1) last
            if self.pods[f"{cluster}-{i}"] != r["new"]:
                self._recreated(f"{cluster}-{i}")
            self.pods[f"{cluster}-{i}"] = r["new"]
        return {"phase": "Upgrading cluster", "readyInstances": n - 1}

    # -------------------------------------------------------------- the instance pods
    def owns(self, req: Request) -> bool:
        return req.params["pod"] in self.pods

    def delete_pod(self, req: Request) -> Answer:
        """An instance pod deleted: killed for good once its Cluster is gone, else recreated (the primary's
        deletion starting a failover)."""
        api, pod = self.api, req.params["pod"]
        if not any(k.endswith(f"/clusters/{pod.rsplit('-', 1)[0]}") for k in api.objects):  # its Cluster torn down:
            # killed, not recreated
            self.pods.pop(pod)
            api.killed_at_cleanup.append((pod, req.query))
            return 200, {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": pod}}
        self._recreated(pod)
        api.deleted_pods.append((pod, time.time()))
        api.pod_delete_queries.append(req.query)
        if pod == api.primary and self.failover is None:
            self.failover = {"old": pod, "left": api.promote_after}
        return 200, {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": pod}}

    def list_pods(self, req: Request) -> Answer:
        """The instance pods of the Cluster the selector names (``cnpg.io/cluster=<name>``, first)."""
        cluster = req.selector.removeprefix("cnpg.io/cluster=").split(",")[0]
        api = self.api
        reads = max((n for key, n in api.reads.items() if key.endswith(f"/clusters/{cluster}")), default=0)
        joined = reads > api.standbys_listed_after  # before that, the standbys' join Jobs run: no pod of theirs
        return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                     "items": [self._instance_pod(n, req.params["ns"]) for n in self.pods
                               if n.rsplit("-", 1)[0] == cluster and (joined or n == api.primary)]}

    def _instance_pod(self, name: str, namespace: str) -> dict[str, Any]:
        spec = self.pods[name]
        labels = {"cnpg.io/cluster": name.rsplit("-", 1)[0], "cnpg.io/podRole": "instance",
                  "cnpg.io/instanceName": name}
        volumes = [{"name": "pgdata", "persistentVolumeClaim": {"claimName": name}},  # as CloudNativePG names them
                   {"name": "scratch-data", "emptyDir": {}}]
        if self.wal:
            volumes.append({"name": "pg-wal", "persistentVolumeClaim": {"claimName": f"{name}-wal"}})
        uid = f"00000000-0000-4000-8000-{self.generation.get(name, 0):04d}{sum(map(ord, name)):08d}"
        pod: dict[str, Any] = {
            "metadata": {"name": name, "namespace": namespace, "labels": labels, "uid": uid},
            "spec": {"nodeName": f"node-{name.rsplit('-', 1)[1]}", "volumes": volumes,
                     "containers": [{"name": "postgres", "resources": spec["resources"]}]}}
        if (message := self.api.instance_pods_unschedulable) is not None:  # no node fits: Pending, on no node
            del pod["spec"]["nodeName"]
            pod["status"] = {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}
        return pod

    def _recreated(self, pod: str) -> None:
        """An instance pod replaced by a new one of the same name (a new uid)."""
        self.generation[pod] = self.generation.get(pod, 0) + 1

    def nodes(self) -> list[str]:
        """The nodes the instances run on (instance n on node-n)."""
        return sorted({f"node-{n.rsplit('-', 1)[1]}" for n in self.pods})

    # -------------------------------------------------------------- each instance's exporter
    def scrape(self, req: Request) -> Answer:
        """GET pods/NAME:9187/proxy/metrics: the exporter's text; 503 when it serves none (a pod not ready)."""
        api = self.api
        if api.proxy_forbidden:  # no pods/proxy in the identity
            return forbidden()
        pod = unquote(req.params["pod"]).split(":")[0]
        served_at = time.time()
        text = api.exporter(pod, served_at)
        if text is None:
            return unavailable()
        api.scrapes.append((pod, served_at, text))
        return 200, text

    def default_exporter(self, pod: str, t: float) -> str | None:
        """The primary's exporter with every standby caught up; a standby's."""
        if pod == self.api.primary:
            return exporter_text(pod, standbys={p: CAUGHT_UP for p in self.pods if p != pod})
        return exporter_text(pod, primary=False)

