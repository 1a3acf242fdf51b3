"""The fake API server: the knobs the tests turn and the records they read (on ``FakeAPI``), the routing table that
hands each request to its controller, and ``serve()``, a real HTTP server with the official client pointed at it."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client

from .clients import ClientPods, status_frame
from .cluster import ACCESS_REVIEWS, CNPG_CRD, CRDS, cnpg_crd, node, operator_deployment, storage_class
from .daemonsets import MONITORING, DiskSampler, NodeExporter
from .discovery import Discovery
from .jobs import Jobs
from .operator import CLUSTER, Operator
from .routing import NS, POD, Answer, Request, Route, forbidden, route, status
from .store import Store
from .texts import boot_id, results_log

JOB = r"/apis/batch/v1/namespaces/[^/]+/jobs/[^/]+"


def selects(text: str, *, prefix: bool = False) -> Callable[[Request], bool]:
    """A route guard on a list's label selector: it contains ``text`` (or starts with it)."""
    return lambda req: req.selector.startswith(text) if prefix else text in req.selector


class FakeAPI:
    """Objects by path; the operator, the Job controller and the DaemonSets' controllers reduced to what pglab waits
    for. The attributes are the knobs tests set (before or during a run) and the records they check after."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.created: list[str] = []  # every object path ever created, in order
        self.posted: list[dict[str, Any]] = []  # every object body ever created, as posted
        self.job_posts: list[tuple[int, str]] = []  # (index in requests, name) of every Job created
        self.ready_after = 2  # Cluster reads before it is healthy
        self.standbys_listed_after = 0  # Cluster reads before its standbys' pods exist (each after its join)
        self.never_ready = False
        self.unhealthy_after_jobs: set[str] = set()  # the Cluster reads unhealthy once one of these Jobs was read
        self.failing_jobs: set[str] = set()
        self.hanging_jobs: set[str] = set()  # Jobs that never end
        self.forbidden: set[str] = set()  # collection paths that answer 403
        self.forbidden_gets: set[str] = set()  # object paths whose GET answers 403
        self.pod_waiting: dict[str, list[tuple[str, str]]] = {}  # job -> (reason, message)s its pod waits with
        self.instance_pods_unschedulable: str | None = None  # the scheduler's message for every instance pod
        self.status_conflicts = 0  # Cluster status patches answered 409 before one is applied
        self.proxy_forbidden = False  # every pod proxy read answers 403
        self.terminating_reads = 0  # a namespace in phase Terminating goes after this many more reads
        self.logs: dict[str, str] = {}
        self.log_not_ready: dict[str, int] = {}  # job -> log reads answering 400 (its container still starting)
        self.log_cut: dict[str, int] = {}  # job -> log reads whose results are begun and not ended (not flushed yet)
        self.default_log: Callable[[str], str] = lambda job: results_log({"pgbench.out": f"{job} done\n"})
        self.on_job_created: Callable[[str], None] = lambda job: None
        self.reads: dict[str, int] = {}
        self.job_seconds = 0.0  # a Job also stays active this long after its creation (exporter samples need time)
        self.job_created_at: dict[str, float] = {}  # a run's Job created, or its command exec'd in a client pod
        self.execs: list[tuple[int, str, str]] = []  # (index in requests, run, pod) of every run exec'd
        self.exec_scripts: list[str] = []  # the script of every run exec'd (as execs)
        self.failing_execs: set[tuple[str, str]] = set()  # (run, pod): that pod's share of the run exits 1
        self.hanging_execs: set[tuple[str, str]] = set()  # (run, pod): that pod's share never ends unless stopped
        self.stops: list[tuple[str, float, str | None]] = []  # (pod, time, the run it stopped) of every stop
        self.witness_margin_s = 0.0  # a witness Job runs this much longer unless pglab tells it that pgbench ended
        self.witness_told: list[tuple[str, float]] = []  # (Job, time) of every witness told that pgbench ended
        self.rollout_reads = 3  # Cluster reads a rolling update lasts after a PATCH
        self.stuck_rollout = False  # a rolling update that never ends (one replica never comes back)
        self.on_patch: Callable[[dict[str, Any]], None] = lambda patch: None
        self.patches: list[dict[str, Any]] = []
        self.phases: list[str] = []  # every phase the Cluster was read in, in order
        self.scrapes: list[tuple[str, float, str]] = []  # (pod, time served, text) of every scrape answered
        self.lock = threading.Lock()
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
        self.ready_reads: list[tuple[float, int]] = []  # (time, readyInstances) of every Cluster read
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
        self.boot_id: Callable[[str], str] = boot_id  # each node's kernel boot id (as the probe prints it)
        # what the preflight reads: the cluster as it is before pglab comes (enough for the tests' plans)
        self.nodes: list[dict[str, Any]] = [node(f"node-{i}") for i in range(1, 5)]
        self.storage_classes: list[dict[str, Any]] = [storage_class("standard", default=True)]
        self.crds: dict[str, dict[str, Any]] = {CNPG_CRD: cnpg_crd()}
        self.deployments: list[dict[str, Any]] = [operator_deployment()]
        self.services: list[dict[str, Any]] = []  # Services already there (a plugin's, which the operator finds)
        self.denied: set[tuple[str, str, str]] = set()  # (verb, group, resource[/subresource]) reviews refuse
        self.access_reviews: list[dict[str, str]] = []  # the resourceAttributes of every review asked

        self.operator = Operator(self)
        self.jobs = Jobs(self)
        self.clients = ClientPods(self)
        self.sampler = DiskSampler(self)
        self.node_exporters = NodeExporter(self)
        self.discovery = Discovery(self)
        self.store = Store(self, on_create={"Cluster": self.operator.created, "Job": self.jobs.created,
                                            "Pod": self.clients.created},
                           on_read={"Cluster": self.operator.read, "Job": self.jobs.read, "Pod": self.clients.read})
        # the exporter of each instance: (pod, time served) -> its text; None answers 503 as a pod not ready would
        self.exporter: Callable[[str, float], str | None] = self.operator.default_exporter
        self.routes = self._routes()

    def _routes(self) -> list[Route]:
        """Method, path pattern (the whole path), controller; the first match wins, so a guarded or more
        specific route comes before the one that would also match."""
        d, op, jobs, ds, ne, store = (self.discovery, self.operator, self.jobs, self.sampler, self.node_exporters,
                                      self.store)
        return [
            # what the preflight reads: the cluster before pglab
            Route("GET", r"/version/*", d.version),
            Route("POST", re.escape(ACCESS_REVIEWS), d.review),
            Route("GET", r"/api/v1/nodes/*", d.nodes),
            Route("GET", r"/apis/storage\.k8s\.io/v1/storageclasses/*", d.storage_classes),
            Route("GET", r"/apis/apps/v1/deployments/*", d.deployments),
            Route("GET", re.escape(CRDS) + r"/.+", d.crd),
            Route("GET", r"/api/v1/namespaces/[^/]+/services/*", d.services),
            Route("GET", r"/apis/*", d.groups),
            # CloudNativePG: the Cluster's changes, its instance pods
            Route("PATCH", CLUSTER + "/status", op.switchover),
            Route("PATCH", CLUSTER, op.patch),
            Route("DELETE", POD, op.delete_pod, when=op.owns),
            # the pod proxy: node-exporter's pods, else an instance's exporter
            Route("GET", MONITORING + r"/pods/(?P<pod>[^/]+)/proxy/.*", ne.scrape),
            Route("GET", POD + r"/proxy/.*", op.scrape),
            # pod logs: a disk sampler's, else a Job's
            Route("GET", POD + "/log", ds.log, when=ds.owns),
            Route("GET", POD + "/log", jobs.log),
            # pod lists, by namespace and label selector
            Route("GET", MONITORING + "/pods", ne.list_pods),
            Route("GET", NS + "/pods", ds.list_pods, when=selects("pglab/component=disk-sampler")),
            Route("GET", NS + "/pods", op.list_pods, when=selects("cnpg.io/cluster=", prefix=True)),
            Route("GET", NS + "/pods", jobs.list_pods),
            # jobs/status: a subresource the Role does not grant (a path in forbidden_gets answers 403 too)
            Route("GET", JOB + "/status", lambda req: forbidden()),
            # the API server's store: create, merge-patch, delete, read (a controller fills in the status read)
            Route("POST", r".+", store.create),
            Route("PATCH", r".+", store.patch),
            Route("DELETE", r"/api/v1/namespaces/[^/]+", store.delete_namespace),
            Route("DELETE", r".+", store.delete),
            Route("GET", r".+", store.get),
        ]

    def handle(self, method: str, url: str, body: dict[str, Any] | None) -> Answer:
        req = Request.parse(method, url, body)
        with self.lock:
            self.requests.append((method, req.path))
            return route(self.routes, req)

    def primary_parameters(self) -> dict[str, str]:
        """The parameters the primary runs with once a run's Job has waited for them: a rolling update under way
        (and not stuck) is waited out, as the Job's wait loop does."""
        pods = self.operator.pods
        primary = next(name for name in pods if name.endswith("-1"))
        if self.operator.rollout is not None and not self.stuck_rollout:
            return dict(self.operator.rollout["new"]["parameters"])
        return dict(pods[primary]["parameters"])

    def pod_resources(self) -> dict[str, dict[str, Any]]:
        """Each instance pod's resources as the fake's pods have them now."""
        return {name: spec["resources"] for name, spec in self.operator.pods.items()}


@contextmanager
def serve() -> Iterator[tuple[FakeAPI, client.ApiClient]]:
    """The fake on a free loopback port, and an official client pointed at it."""
    api = FakeAPI()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            if self.command == "PATCH" and self.headers.get("Content-Type") != "application/merge-patch+json":
                # the fake applies RFC 7386 merge patches only
                answer: Answer = status(415, "UnsupportedMediaType")
            else:
                answer = api.handle(self.command, self.path, body)
            code, payload = answer
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_POST = do_DELETE = do_PATCH = _serve

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.headers.get("Upgrade", "").lower() == "websocket":
                self._exec()
            else:
                self._serve()

        def _exec(self) -> None:
            """A pod's exec over a WebSocket (RFC 6455 handshake, channel.k8s.io v4 frames), as the API server
            serves it for the client library's ``stream``."""
            req = Request.parse("GET", self.path, None)
            found = re.fullmatch(POD + "/exec", req.path)
            with api.lock:
                api.requests.append(("GET", req.path))
                ok = found is not None and (api.clients.exists(found["ns"], found["pod"])
                                            or api.jobs.exists(found["ns"], found["pod"]))
            if found is None or not ok:
                self.send_error(404)
                return
            key = self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", base64.b64encode(hashlib.sha1(key.encode()).digest()).decode())
            self.send_header("Sec-WebSocket-Protocol", "v4.channel.k8s.io")
            self.end_headers()
            self.close_connection = True

            def send(channel: int, data: bytes, opcode: int = 0x2) -> None:
                payload = bytes([channel]) + data if opcode == 0x2 else data
                n = len(payload)
                head = bytes([0x80 | opcode]) + (bytes([n]) if n < 126 else bytes([126]) + n.to_bytes(2, "big")
                                                 if n < 1 << 16 else bytes([127]) + n.to_bytes(8, "big"))
                self.wfile.write(head + payload)
                self.wfile.flush()

            try:
                pods = api.jobs if api.jobs.exists(found["ns"], found["pod"]) else api.clients
                code = pods.execute(found["pod"], req.query.get("command", []), send)
                send(3, status_frame(code))
                send(0, (1000).to_bytes(2, "big"), opcode=0x8)
            except OSError:  # the client went away
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
