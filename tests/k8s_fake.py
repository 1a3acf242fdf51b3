"""A fake Kubernetes API server at the HTTP boundary, shared by the orchestration and the `pglab run` tests.

It is a real HTTP server speaking the REST paths the official client uses (namespaces, RBAC, CNPG clusters, Jobs,
PVCs, ConfigMaps, pods and their logs, /version); it keeps the objects, plays the operator (a Cluster turns healthy
after a few reads) and the Job controller (a Job ends after a read, its pod's log carries a results tarball).
Nothing is mocked inside pglab or the client.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from kubernetes import client

from pglab.targets.kubernetes.orchestrate import HEALTHY
from pglab.targets.kubernetes.render import BEGIN_MARK, END_MARK


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
        self.ready_after = 2  # Cluster reads before it is healthy
        self.never_ready = False
        self.unhealthy_after_jobs: set[str] = set()  # the Cluster reads unhealthy once one of these Jobs was read
        self.failing_jobs: set[str] = set()
        self.hanging_jobs: set[str] = set()  # Jobs that never end
        self.forbidden: set[str] = set()  # collection paths that answer 403
        self.logs: dict[str, str] = {}
        self.default_log: Callable[[str], str] = lambda job: results_log({"pgbench.out": f"{job} done\n"})
        self.on_job_created: Callable[[str], None] = lambda job: None
        self.reads: dict[str, int] = {}
        self.lock = threading.Lock()
        self._degraded = False

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
            if method == "POST":
                if path in self.forbidden:
                    return 403, {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}
                assert body is not None
                key = f"{path}/{body['metadata']['name']}"
                if key in self.objects:
                    return 409, {"kind": "Status", "status": "Failure", "reason": "AlreadyExists", "code": 409}
                self.objects[key] = body
                self.created.append(key)
                if body["kind"] == "Job":
                    threading.Thread(target=self.on_job_created, args=(body["metadata"]["name"],)).start()
                return 201, body
            if method == "DELETE":
                if self.objects.pop(path, None) is None:
                    return 404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}
                if path.startswith("/api/v1/namespaces/") and path.count("/") == 4:  # a namespace: all inside
                    for key in [k for k in self.objects if k.startswith(path + "/")]:
                        del self.objects[key]
                return 200, {"kind": "Status", "status": "Success"}
            if path.endswith("/log"):
                job = path.split("/")[-2].removesuffix("-pod")
                return 200, self.logs[job] if job in self.logs else self.default_log(job)
            if path.endswith("/pods"):
                job = parse_qs(parsed.query)["labelSelector"][0].removeprefix("job-name=")
                pods = [{"metadata": {"name": f"{job}-pod", "namespace": path.split("/")[4]}}]
                return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods}
            key = path.removesuffix("/status")
            obj = self.objects.get(key)
            if obj is None:
                return 404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}
            self.reads[key] = self.reads.get(key, 0) + 1
            obj = json.loads(json.dumps(obj))
            if obj["kind"] == "Cluster":
                ready = not self.never_ready and not self._degraded and self.reads[key] > self.ready_after
                obj["status"] = {"readyInstances": obj["spec"]["instances"] if ready else 0,
                                 "phase": HEALTHY if ready else "Setting up primary",
                                 "currentPrimary": f"{obj['metadata']['name']}-1"}
            elif obj["kind"] == "Job":
                name = obj["metadata"]["name"]
                if name in self.unhealthy_after_jobs:
                    self._degraded = True
                obj["status"] = ({"active": 1} if self.reads[key] == 1 or name in self.hanging_jobs else
                                 {"failed": 1} if name in self.failing_jobs else {"succeeded": 1})
            return 200, obj


@contextmanager
def serve() -> Iterator[tuple[FakeAPI, client.ApiClient]]:
    """The fake on a free loopback port, and an official client pointed at it."""
    api = FakeAPI()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            status, payload = api.handle(self.command, self.path, body)
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _serve

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
