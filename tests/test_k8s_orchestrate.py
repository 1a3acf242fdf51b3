"""Orchestration (create → wait → collect → clean up) against a fake Kubernetes API at the HTTP boundary.

The fake is a real HTTP server speaking the REST paths the official client uses (namespaces, RBAC, CNPG clusters,
Jobs, PVCs, pods and their logs); it keeps the objects, plays the operator (a Cluster turns healthy after a few
reads) and the Job controller (a Job ends after a read, its pod's log carries a results tarball). Nothing is
mocked inside pglab or the client.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client

from pglab.plan.load import parse_plan
from pglab.targets.kubernetes.orchestrate import HEALTHY, K8sError, Orchestrator, extract_results
from pglab.targets.kubernetes.render import BEGIN_MARK, END_MARK

PLAN = """
name: k
target:
  kubernetes:
    namespace: bench
    cluster_name: pg
    instances: 2
    resources: {cpu: 1, memory: 1Gi}
storage: {profiles: [randread-8k], runtime: 2s, size: 64MiB, paths: [data]}
matrix: {clients: [1, 2], jobs: [1]}
run: {duration: 2s}
"""


def results_log(files: dict[str, str], text: str = "progress: 1.0 s, 100 tps\n") -> str:
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
        self.ready_after = 2  # Cluster reads before it is healthy
        self.never_ready = False
        self.failing_jobs: set[str] = set()
        self.forbidden: set[str] = set()  # collection paths that answer 403
        self.logs: dict[str, str] = {}
        self.reads: dict[str, int] = {}
        self.lock = threading.Lock()

    def handle(self, method: str, url: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        parsed = urlparse(url)
        path = parsed.path
        with self.lock:
            self.requests.append((method, path))
            if method == "POST":
                if path in self.forbidden:
                    return 403, {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}
                assert body is not None
                key = f"{path}/{body['metadata']['name']}"
                if key in self.objects:
                    return 409, {"kind": "Status", "status": "Failure", "reason": "AlreadyExists", "code": 409}
                self.objects[key] = body
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
                return 200, self.logs.get(job, results_log({"pgbench.out": f"{job} done\n"}))
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
                ready = not self.never_ready and self.reads[key] > self.ready_after
                obj["status"] = {"readyInstances": obj["spec"]["instances"] if ready else 0,
                                 "phase": HEALTHY if ready else "Setting up primary"}
            elif obj["kind"] == "Job":
                name = obj["metadata"]["name"]
                obj["status"] = ({"active": 1} if self.reads[key] == 1 else
                                 {"failed": 1} if name in self.failing_jobs else {"succeeded": 1})
            return 200, obj


@pytest.fixture
def fake() -> Iterator[tuple[FakeAPI, client.ApiClient]]:
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
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    conf = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    with client.ApiClient(conf) as api_client:
        yield api, api_client
    server.shutdown()
    server.server_close()


def orchestrator(api_client: client.ApiClient, tmp_path: Path, text: str = PLAN, **kw: Any) -> Orchestrator:
    plan = parse_plan(text, base_dir=tmp_path)
    return Orchestrator(plan, tmp_path, api_client, poll_s=0.01, **kw)


def test_create_wait_collect_cleanup(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = fake
    api.logs["pg-fio-data"] = results_log({"randread-8k-qd1.json": '{"jobs": []}',
                                           "randread-8k-qd1_iops.1.log": "1000, 5000, 0, 8192\n"})
    outcomes = orchestrator(api_client, tmp_path).run(tmp_path / "out")
    assert [o.name for o in outcomes] == ["pg-fio-data", "pg-pgbench-init", "pg-run-0000-1", "pg-run-0001-1"]
    assert all(o.succeeded for o in outcomes)
    # the fio logs came back from the pod's log as files; the markers are gone from the kept log
    assert (tmp_path / "out/pg-fio-data/randread-8k-qd1_iops.1.log").read_text() == "1000, 5000, 0, 8192\n"
    assert outcomes[0].files == ["randread-8k-qd1.json", "randread-8k-qd1_iops.1.log"]
    assert (tmp_path / "out/pg-run-0001-1/pgbench.out").read_text() == "pg-run-0001-1 done\n"
    assert BEGIN_MARK not in (tmp_path / "out/pg-run-0001-1/pod.log").read_text()
    # the cluster was waited for before any Job started
    posts = [p for m, p in api.requests if m == "POST"]
    cluster_reads = [i for i, (m, p) in enumerate(api.requests) if m == "GET" and p.endswith("/clusters/pg")]
    first_job = api.requests.index(("POST", "/apis/batch/v1/namespaces/bench/jobs"))
    assert len(cluster_reads) == api.ready_after + 1 and cluster_reads[-1] < first_job
    assert posts[0] == "/api/v1/namespaces"
    # nothing left behind, the namespace last
    assert api.objects == {}
    deletes = [p for m, p in api.requests if m == "DELETE"]
    assert deletes[-1] == "/api/v1/namespaces/bench"
    assert "/apis/postgresql.cnpg.io/v1/namespaces/bench/clusters/pg" in deletes


def test_failed_init_stops_and_cleans_up(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = fake
    api.failing_jobs.add("pg-pgbench-init")
    api.logs["pg-pgbench-init"] = results_log({"init.log": "x"}, text="pgbench: error: connection refused\n")
    with pytest.raises(K8sError, match="Job/pg-pgbench-init failed: pgbench: error: connection refused"):
        orchestrator(api_client, tmp_path).run(tmp_path / "out")
    assert api.objects == {}
    assert ("POST", "/apis/batch/v1/namespaces/bench/jobs") in api.requests
    assert not (tmp_path / "out/pg-run-0000-1").exists()  # no run after a failed init


def test_cluster_never_ready_times_out_and_cleans_up(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = fake
    api.never_ready = True
    with pytest.raises(K8sError, match=r"Cluster/pg not ready after 0 s \(phase: Setting up primary, ready "
                                       r"instances: 0 of 2\)"):
        orchestrator(api_client, tmp_path, ready_timeout_s=0.2).run(tmp_path / "out")
    assert api.objects == {}
    assert not any(p.endswith("/jobs") for _, p in api.requests)


def test_refused_create_names_the_object_and_cleans_up(fake: tuple[FakeAPI, client.ApiClient],
                                                       tmp_path: Path) -> None:
    api, api_client = fake
    api.forbidden.add("/apis/postgresql.cnpg.io/v1/namespaces/bench/clusters")
    with pytest.raises(K8sError, match="creating Cluster/pg in bench: 403"):
        orchestrator(api_client, tmp_path).run(tmp_path / "out")
    assert api.objects == {}
    assert ("DELETE", "/apis/rbac.authorization.k8s.io/v1/namespaces/bench/roles/pg-pglab") in api.requests


def test_ctrl_c_while_waiting_cleans_up(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = fake

    def interrupt(message: str) -> None:
        if message.startswith("waiting for Cluster"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        orchestrator(api_client, tmp_path, log=interrupt).run(tmp_path / "out")
    assert api.objects == {}
    assert ("DELETE", "/apis/postgresql.cnpg.io/v1/namespaces/bench/clusters/pg") in api.requests


def test_existing_namespace_is_used_and_kept(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = fake
    api.objects["/api/v1/namespaces/bench"] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}}
    orchestrator(api_client, tmp_path).run(tmp_path / "out")
    assert list(api.objects) == ["/api/v1/namespaces/bench"]
    assert ("DELETE", "/api/v1/namespaces/bench") not in api.requests


def test_results_tarball_cannot_escape(tmp_path: Path) -> None:
    log = results_log({"../escape.txt": "x"})
    with pytest.raises(K8sError, match="cannot be read"):
        extract_results(log, tmp_path / "dest")
    assert not (tmp_path / "escape.txt").exists()
    with pytest.raises(K8sError, match="truncated"):
        extract_results(f"text\n{BEGIN_MARK}\nAAAA", tmp_path / "dest")
