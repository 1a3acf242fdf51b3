"""The long-lived pgbench client pods pglab creates (kind Pod) and the commands it runs in them by exec.

A client pod is scheduled at its creation (index i on node-(4-i), away from the instances' node-1, node-2) and
runs, ready, from its first read. Exec is served over a real WebSocket (``server.Handler`` upgrades the request,
channel.k8s.io v4: a byte of channel before each frame's data, the exit status as a metav1.Status on channel 3).
A run's command is told by its ``PGLAB_RUN=<run>`` line and stands for the run Job of that name, with the Job
controller's knobs: it prints ``api.logs[run]`` or ``api.default_log(run)`` when it ends, after ``api.job_seconds``
(at once otherwise), exits 1 when the run is in ``api.failing_jobs``, never ends while it is in
``api.hanging_jobs`` (one pod's share alone: ``failing_execs``, ``hanging_execs``, by run and pod). pglab's stop
command (``orchestrate.STOP_SCRIPT``) ends what runs in that pod (exit 143, as a shell killed by TERM)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pglab.targets.kubernetes.orchestrate import STOP_SCRIPT

if TYPE_CHECKING:
    from .server import FakeAPI

RUN = re.compile(r"^export PGLAB_RUN=(\S+)$", re.MULTILINE)
CHUNK = 1 << 16  # bytes of output per frame


def exit_status(code: int) -> dict[str, Any]:
    """The exec's ending as the API server words it on channel 3."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: exit status {code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


class ClientPods:
    def __init__(self, api: FakeAPI) -> None:
        self.api = api
        self.running: dict[str, str] = {}  # pod -> the run exec'd in it, while it runs
        self.stopped: set[str] = set()  # pods told to stop since their run began

    def created(self, body: dict[str, Any]) -> None:
        index = int(body["metadata"].get("annotations", {}).get("pglab/load-index", "0"))
        body["spec"]["nodeName"] = f"node-{4 - index}"

    def read(self, key: str, obj: dict[str, Any]) -> None:
        obj["status"] = {"phase": "Running", "containerStatuses": [
            {"name": "main", "image": obj["spec"]["containers"][0]["image"], "imageID": "", "ready": True,
             "restartCount": 0, "state": {"running": {}}}]}

    def exists(self, namespace: str, pod: str) -> bool:
        return f"/api/v1/namespaces/{namespace}/pods/{pod}" in self.api.objects

    def execute(self, pod: str, command: list[str], send: Callable[[int, bytes], None]) -> int:
        """Run ``command`` as the pod would (see the module's docstring), its output sent as it comes; its exit
        status. Called without the API's lock (it lasts as long as the run)."""
        api = self.api
        script = command[2] if len(command) == 3 and command[:2] == ["/bin/sh", "-c"] else ""
        if script == STOP_SCRIPT:
            with api.lock:
                api.stops.append((pod, time.time(), self.running.get(pod)))
                self.stopped.add(pod)
            while pod in self.running:  # what runs there ends
                time.sleep(0.005)
            return 0
        found = RUN.search(script)
        if found is None:
            send(2, f"fake: no such command here: {command!r}\n".encode())
            return 127
        run = found.group(1)
        with api.lock:
            api.execs.append((len(api.requests) - 1, run, pod))
            api.exec_scripts.append(script)
            api.job_created_at[run] = time.time()
            self.running[pod] = run
            self.stopped.discard(pod)
        threading.Thread(target=api.on_job_created, args=(run,)).start()
        try:
            while (run in api.hanging_jobs or (run, pod) in api.hanging_execs
                   or time.time() - api.job_created_at[run] < api.job_seconds) and pod not in self.stopped:
                time.sleep(0.005)
            if pod in self.stopped:
                send(2, b"Terminated\n")
                return 143
            with api.lock:
                text = api.logs[run] if run in api.logs else api.default_log(run)
                if run in api.unhealthy_after_jobs:
                    api.operator.degraded = True
            data = text.encode()
            for i in range(0, len(data), CHUNK):
                send(1, data[i:i + CHUNK])
            return 1 if run in api.failing_jobs or (run, pod) in api.failing_execs else 0
        finally:
            self.running.pop(pod, None)


def status_frame(code: int) -> bytes:
    return json.dumps(exit_status(code)).encode()
