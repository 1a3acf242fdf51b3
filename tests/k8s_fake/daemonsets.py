"""The DaemonSets' controllers: pglab's disk sampler (one pod on each instance's node while its DaemonSet exists,
its log ``api.diskstats_log(node)``) and node-exporter in namespace ``monitoring`` (a pod on each instance node once
``api.node_exporter`` is set, its metrics behind the pod proxy)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING
from urllib.parse import unquote

from .routing import Answer, Request, forbidden, unavailable
from .texts import NODE_EXPORTER_NS, NODE_EXPORTER_SELECTOR

if TYPE_CHECKING:
    from .server import FakeAPI

MONITORING = f"/api/v1/namespaces/{NODE_EXPORTER_NS}"


class DiskSampler:
    def __init__(self, api: FakeAPI) -> None:
        self.api = api

    def owns(self, req: Request) -> bool:
        return req.params["pod"] in self.pods()

    def pods(self) -> dict[str, str]:
        """pod name -> node, one pod per instance node while a disk-sampler DaemonSet exists."""
        sets = [k for k, o in self.api.objects.items() if o["kind"] == "DaemonSet"]
        if not sets or self.api.no_sampler_pods:
            return {}
        ds = sets[0].rsplit("/", 1)[1]
        return {f"{ds}-{node}": node for node in self.api.operator.nodes()}

    def list_pods(self, req: Request) -> Answer:
        items = [{"metadata": {"name": pod, "namespace": req.params["ns"]},
                  "spec": {"nodeName": node, "containers": [{"name": "main"}]}} for pod, node in self.pods().items()]
        return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}

    def log(self, req: Request) -> Answer:
        pod = req.params["pod"]
        node = self.pods()[pod]
        self.api.log_queries.append((pod, req.query))
        if node in self.api.sampler_log_forbidden:
            return forbidden()
        return 200, self.api.diskstats_log(node)


class NodeExporter:
    def __init__(self, api: FakeAPI) -> None:
        self.api = api

    def scrape(self, req: Request) -> Answer:
        target = unquote(req.params["pod"]).split(":")  # [scheme:]name:port
        self.api.node_exporter_schemes.add(target[0] if len(target) == 3 else "http")
        node = target[-2].removeprefix("node-exporter-")
        text = self.api.node_exporter(node, time.time()) if self.api.node_exporter is not None else None
        if text is None:
            return unavailable()
        return 200, text

    def list_pods(self, req: Request) -> Answer:
        nodes = [n for n in self.api.operator.nodes() if n not in self.api.no_node_exporter_on]
        items = [{"metadata": {"name": f"node-exporter-{node}", "namespace": NODE_EXPORTER_NS},
                  "spec": {"nodeName": node, "containers": [{"name": "node-exporter"}]}}
                 for node in nodes if self.api.node_exporter is not None and req.selector == NODE_EXPORTER_SELECTOR]
        return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
