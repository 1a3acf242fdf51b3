"""The API server's own part: objects kept by path (create, read, merge-patch, delete), and the namespace lifecycle
(admission refusing content in a terminating namespace, deletion taking everything inside, a terminating
namespace going after a few reads). A read or a creation of a kind a controller owns is handed to it."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .routing import Answer, Request, forbidden, not_found, status

if TYPE_CHECKING:
    from .server import FakeAPI


def copy(obj: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(obj))


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """An RFC 7386 JSON merge patch: None removes a key, objects merge, anything else replaces."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            merge(target[k], v)
        else:
            target[k] = v


class Store:
    def __init__(self, api: FakeAPI, on_create: dict[str, Callable[[dict[str, Any]], None]],
                 on_read: dict[str, Callable[[str, dict[str, Any]], None]]) -> None:
        self.api = api
        self.on_create = on_create  # kind -> its controller, told of each object created (the body as stored)
        self.on_read = on_read  # kind -> its controller, filling in the status of the copy served

    def create(self, req: Request) -> Answer:
        api, body = self.api, req.body
        if req.path in api.forbidden:
            return forbidden()
        assert body is not None
        key = f"{req.path}/{body['metadata']['name']}"
        if key in api.objects:
            return status(409, "AlreadyExists")
        ns = req.path.split("/")[4] if req.path.count("/") >= 5 else None
        if ns is not None and self._terminating(api.objects.get(f"/api/v1/namespaces/{ns}", {})):
            return forbidden(message=f"unable to create new content in namespace {ns} because it is being "
                                     "terminated")  # NamespaceLifecycle admission
        api.objects[key] = body
        api.created.append(key)
        api.posted.append(copy(body))
        if (controller := self.on_create.get(body["kind"])) is not None:
            controller(body)
        return 201, body

    def get(self, req: Request) -> Answer:
        api = self.api
        if req.path in api.forbidden_gets:
            return forbidden()
        key = req.path.removesuffix("/status")
        obj = api.objects.get(key)
        if obj is not None and obj["kind"] == "Namespace" and self._terminating(obj):
            api.terminating_reads -= 1  # its pods shutting down; then it is gone
            if api.terminating_reads < 0:
                del api.objects[key]
                obj = None
        if obj is None:
            return not_found()
        api.reads[key] = api.reads.get(key, 0) + 1
        obj = copy(obj)
        if (controller := self.on_read.get(obj["kind"])) is not None:
            controller(key, obj)
        return 200, obj

    def patch(self, req: Request) -> Answer:
        """A merge patch of an object no controller watches for changes."""
        obj = self.api.objects.get(req.path)
        if obj is None:
            return not_found()
        assert req.body is not None
        self.api.patches.append(req.body)
        merge(obj, req.body)
        threading.Thread(target=self.api.on_patch, args=(req.body,)).start()
        return 200, obj

    def delete(self, req: Request) -> Answer:
        if self.api.objects.pop(req.path, None) is None:
            return not_found()
        return 200, {"kind": "Status", "status": "Success"}

    def delete_namespace(self, req: Request) -> Answer:
        """A namespace goes with everything inside it."""
        answer = self.delete(req)
        if answer[0] == 200:
            for key in [k for k in self.api.objects if k.startswith(req.path + "/")]:
                del self.api.objects[key]
        return answer

    @staticmethod
    def _terminating(namespace: dict[str, Any]) -> bool:
        return namespace.get("status", {}).get("phase") == "Terminating"
