"""Cluster-wide reads (what the preflight asks before pglab creates anything): /version, API groups, the CRDs,
nodes, storage classes, deployments in every namespace, a namespace's Services, and SelfSubjectAccessReviews."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .routing import Answer, Request, forbidden, not_found

if TYPE_CHECKING:
    from .server import FakeAPI

VERSION = {"major": "1", "minor": "33", "emulationMajor": "1", "emulationMinor": "33",
           "minCompatibilityMajor": "1", "minCompatibilityMinor": "32", "gitVersion": "v1.33.1-fake",
           "gitCommit": "0" * 40, "gitTreeState": "clean", "buildDate": "2025-05-15T08:19:08Z",
           "goVersion": "go1.24.2", "compiler": "gc", "platform": "linux/amd64"}


class Discovery:
    """Every permission granted unless listed in ``api.denied``; a path in ``api.forbidden_gets`` (trailing slashes
    ignored) answers 403, the reviews' collection in ``api.forbidden`` too."""

    def __init__(self, api: FakeAPI) -> None:
        self.api = api

    def _refused(self, req: Request) -> bool:
        return req.path.rstrip("/") in self.api.forbidden_gets

    def review(self, req: Request) -> Answer:
        if req.path in self.api.forbidden:
            return forbidden()
        assert req.body is not None
        attrs = req.body["spec"]["resourceAttributes"]
        self.api.access_reviews.append(attrs)
        resource = attrs.get("resource", "") + (f"/{attrs['subresource']}" if attrs.get("subresource") else "")
        allowed = (attrs["verb"], attrs.get("group", ""), resource) not in self.api.denied
        return 201, {**req.body, "status": {"allowed": allowed} if allowed else {"allowed": False,
                                                                                  "reason": "no RBAC rule"}}

    def version(self, req: Request) -> Answer:
        return 200, VERSION

    def nodes(self, req: Request) -> Answer:
        return self._list(req, "NodeList", "v1", self.api.nodes)

    def storage_classes(self, req: Request) -> Answer:
        return self._list(req, "StorageClassList", "storage.k8s.io/v1", self.api.storage_classes)

    def deployments(self, req: Request) -> Answer:
        return self._list(req, "DeploymentList", "apps/v1", self.api.deployments)

    def services(self, req: Request) -> Answer:
        namespace = req.path.split("/")[4]
        return self._list(req, "ServiceList", "v1", [s for s in self.api.services
                                                      if s["metadata"]["namespace"] == namespace])

    def _list(self, req: Request, kind: str, version: str, items: list[dict[str, Any]]) -> Answer:
        if self._refused(req):
            return forbidden()
        if selector := req.query.get("labelSelector", [""])[0]:
            wanted = dict(term.split("=", 1) for term in selector.split(","))
            items = [i for i in items if wanted.items() <= (i["metadata"].get("labels") or {}).items()]
        return 200, {"kind": kind, "apiVersion": version, "metadata": {}, "items": items}

    def crd(self, req: Request) -> Answer:
        if self._refused(req):
            return forbidden()
        found = self.api.crds.get(req.path.rstrip("/").rsplit("/", 1)[1])
        return (200, found) if found else not_found()

    def groups(self, req: Request) -> Answer:
        if self._refused(req):
            return forbidden()
        groups = [{"name": c["spec"]["group"], "versions": [{"groupVersion": f"{c['spec']['group']}/{v['name']}",
                                                             "version": v["name"]} for v in c["spec"]["versions"]]}
                  for c in self.api.crds.values()]
        return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
