"""The fake's routing table: a request goes to the first route whose method and path pattern match (and whose
guard, if any, accepts it). One table instead of one if-chain, so each controller's paths are read in one place."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlparse

Answer = tuple[int, Any]

NS = r"/api/v1/namespaces/(?P<ns>[^/]+)"  # a core namespaced collection's prefix
POD = NS + r"/pods/(?P<pod>[^/]+)"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: dict[str, Any] | None
    params: dict[str, str] = field(default_factory=dict)  # the route pattern's named groups

    @classmethod
    def parse(cls, method: str, url: str, body: dict[str, Any] | None) -> Request:
        parsed = urlparse(url)
        return cls(method, parsed.path, parse_qs(parsed.query), body)

    @property
    def selector(self) -> str:
        """The label selector of a list (a list pglab makes always has one: a missing one fails as before)."""
        return self.query["labelSelector"][0]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: str
    handler: Callable[[Request], Answer]
    when: Callable[[Request], bool] | None = None

    def match(self, req: Request) -> dict[str, str] | None:
        if req.method != self.method:
            return None
        found = re.fullmatch(self.pattern, req.path)
        if found is None:
            return None
        req.params = found.groupdict()
        if self.when is not None and not self.when(req):
            return None
        return req.params


def status(code: int, reason: str, **extra: str) -> Answer:
    """An API error as the server words it (a metav1.Status)."""
    return code, {"kind": "Status", "status": "Failure", "reason": reason, "code": code, **extra}


def forbidden(**extra: str) -> Answer:
    return status(403, "Forbidden", **extra)


def not_found() -> Answer:
    return status(404, "NotFound")


def unavailable() -> Answer:
    return status(503, "ServiceUnavailable")


def route(routes: list[Route], req: Request) -> Answer:
    for r in routes:
        if r.match(req) is not None:
            return r.handler(req)
    return not_found()
