"""The Job controller reduced to what pglab waits for: a Job is active at its first read (and for
``api.job_seconds`` after its creation), then succeeded or failed; its pod waits (Pending) with the reasons given, and
its log carries a results tarball (or, for a volume probe, what the mounts of its claims are on)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pglab.targets.kubernetes.scripts import END_MARK, RESULTS_DIR, VOLUME_MARK, WITNESS_STOP

from .routing import Answer, Request, status

if TYPE_CHECKING:
    from .server import FakeAPI


class Jobs:
    def __init__(self, api: FakeAPI) -> None:
        self.api = api

    def created(self, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        self.api.job_posts.append((len(self.api.requests) - 1, name))
        self.api.job_created_at[name] = time.time()
        threading.Thread(target=self.api.on_job_created, args=(name,)).start()

    def running(self, name: str) -> bool:
        """Whether Job ``name`` still runs, its first read aside: for ``api.job_seconds`` after its creation, for
        ever when hanging, and a witness ``api.witness_margin_s`` longer unless pglab tells it that pgbench ended."""
        api = self.api
        age = time.time() - api.job_created_at.get(name, 0.0)
        untold = "-witness-" in name and name not in {j for j, _ in api.witness_told}
        return age < api.job_seconds + (api.witness_margin_s if untold else 0.0) or name in api.hanging_jobs

    def read(self, key: str, obj: dict[str, Any]) -> None:
        api, name = self.api, obj["metadata"]["name"]
        if name in api.unhealthy_after_jobs:
            api.operator.degraded = True
        obj["status"] = ({"active": 1} if api.reads[key] == 1 or self.running(name) else
                         {"failed": 1} if name in api.failing_jobs else {"succeeded": 1})

    def exists(self, namespace: str, pod: str) -> bool:
        return f"/apis/batch/v1/namespaces/{namespace}/jobs/{pod.removesuffix('-pod')}" in self.api.objects

    def execute(self, pod: str, command: list[str], send: Callable[[int, bytes], None]) -> int:
        """A command exec'd in a Job's pod: only pglab's word to a witness that pgbench ended (recorded)."""
        if command != ["/bin/sh", "-c", f"touch {RESULTS_DIR}/{WITNESS_STOP}"]:
            send(2, f"fake: no such command here: {command!r}\n".encode())
            return 127
        with self.api.lock:
            self.api.witness_told.append((pod.removesuffix("-pod"), time.time()))
        return 0

    def list_pods(self, req: Request) -> Answer:
        """A Job's pod (``job-name=`` selector), pending as the kubelet or the scheduler reports it when the Job is
        in ``api.pod_waiting`` (the reasons take turns)."""
        job = req.selector.removeprefix("job-name=")
        pods: list[dict[str, Any]] = [{"metadata": {"name": f"{job}-pod", "namespace": req.params["ns"]},
                                       "status": {"phase": "Running" if self.running(job) else "Succeeded"}}]
        waiting = self.api.pod_waiting.get(job)
        if waiting:
            waiting.append(waiting.pop(0))
            reason, message = waiting[-1]
            pods[0]["status"] = {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]
            } if reason == "Unschedulable" else {"phase": "Pending", "containerStatuses": [
                {"name": "main", "image": "example/none:1", "imageID": "", "ready": False,
                 "restartCount": 0, "state": {"waiting": {"reason": reason, "message": message}}}]}
        return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods}

    def log(self, req: Request) -> Answer:
        api = self.api
        job = req.params["pod"].removesuffix("-pod")
        if api.log_not_ready.get(job, 0) > 0:
            api.log_not_ready[job] -= 1
            return status(400, "BadRequest", message=f'container "main" in pod "{job}-pod" is waiting to start: '
                                                     "ContainerCreating")
        if job in api.logs:
            text = api.logs[job]
        elif (probe := self._volume_probe(req.params["ns"], job)) is not None:
            text = probe
        else:
            text = api.default_log(job)
        if api.log_cut.get(job, 0) > 0:  # its results' end not in the log file yet
            api.log_cut[job] -= 1
            text = text[:text.index(END_MARK)]
        return 200, text

    def _volume_probe(self, namespace: str, job: str) -> str | None:
        """A volume probe Job's log, as its script prints it for the claims it mounts; None for other Jobs."""
        body = self.api.objects.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{job}")
        if body is None or body["metadata"]["labels"].get("pglab/component") != "volume-probe":
            return None
        claims = [v["persistentVolumeClaim"]["claimName"] for v in body["spec"]["template"]["spec"]["volumes"]]
        node = body["metadata"]["annotations"]["pglab/node"]
        return "".join(f"{VOLUME_MARK} {c} {' '.join(self.api.volume_mount(c))} {self.api.boot_id(node)}\n"
                       for c in claims)
