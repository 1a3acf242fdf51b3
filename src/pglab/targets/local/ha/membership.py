"""The core of the Patroni lab, which every part of it reads through: the lab's state (set by ``HALab``), and who
its members are, as Patroni's REST API tells (``GET /cluster``) and the leader's own view confirms: members, the
leader, and waiting for a leader and streaming (synchronous) standbys."""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import psycopg

from pglab import interrupts
from pglab.errors import LabError
from pglab.targets.local.ha.node import HANode
from pglab.targets.local.lab_base import LabBase
from pglab.targets.local.pgconf import DBNAME, SUPERUSER

_PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
# Direct connections only: a proxy named in http_proxy must never see the lab's loopback API calls.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Member:
    """One instance as Patroni's ``/cluster`` reports it."""

    name: str
    role: str  # leader | quorum_standby | sync_standby | replica
    state: str  # running (leader) | streaming | starting | stopped | …
    lag: int | None  # bytes behind the leader; None for the leader or when unknown
    timeline: int | None
    port: int | None
    api_url: str


def request(url: str, method: str = "GET", body: Any = None, timeout: float = 5, auth: str = "") -> tuple[int, Any]:
    """One REST call (Patroni's or etcd's); ``auth`` (the Authorization header) goes with every call but a GET."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if method != "GET":
        headers["Authorization"] = auth
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with OPENER.open(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def _member(m: dict[str, Any]) -> Member:
    lag = m.get("lag")
    return Member(name=str(m.get("name")), role=str(m.get("role", "")), state=str(m.get("state", "")),
                  lag=lag if isinstance(lag, int) else None,
                  timeline=m.get("timeline") if isinstance(m.get("timeline"), int) else None,
                  port=m.get("port") if isinstance(m.get("port"), int) else None, api_url=str(m.get("api_url", "")))


class Membership(LabBase[HANode]):
    """The state every part of the lab shares (``HALab`` sets it), and the cluster read through any live node's REST
    API and the leader's connections. The parts (etcd, Patroni, faults, settings) are given this core, not the lab."""

    MEMBER = "node"  # a node's cgroup holds its Patroni and all Patroni starts, as a pod's holds its manager
    KIND = "HA lab"
    timings: dict[str, int]
    parameters: dict[str, Any]
    killed: set[str]  # nodes whose Patroni was killed (not restarted)
    _rest_auth: str
    _logs: list[IO[bytes]]  # the daemons' log files, open while they run

    @property
    def name(self) -> str:
        assert self.lab_dir is not None
        return self.lab_dir.name

    @property
    def failover_budget(self) -> float:
        """Upper bound of a failover after the leader node dies: lock expiry (ttl), one HA cycle (loop_wait), one
        DCS/PostgreSQL operation (retry_timeout) for the election and promotion."""
        t = self.timings
        return float(t["ttl"] + t["loop_wait"] + t["retry_timeout"])

    def _env(self) -> dict[str, str]:
        assert self.lab_dir is not None
        drop = ("PG", "PATRONI_", "ETCD_", "ETCDCTL_")
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and k.lower() not in _PROXY_VARS}
        env.update(LC_ALL="C", LANG="C", HOME=str(self.lab_dir), TMPDIR=str(self.lab_dir / "server"))
        return env

    def _node(self, name: str) -> HANode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def _request(self, url: str, method: str = "GET", body: Any = None, timeout: float = 5) -> tuple[int, Any]:
        return request(url, method, body, timeout, self._rest_auth)

    def _wait(self, check: Callable[[], bool], deadline: float, what: str) -> None:
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc is not None and node.name not in self.killed and node.proc.poll() is not None:
                    raise LabError(f"patroni {node.name} exited with code {node.proc.returncode} while waiting for "
                                   f"{what}: {self._tail(node.log)}")
            with contextlib.suppress(OSError, ValueError, psycopg.Error, LabError):
                if check():
                    return
            interrupts.sleep(0.2)  # a safe point: a recorded Ctrl-C or SIGTERM ends the wait
        raise LabError(f"timed out waiting for {what}; cluster: {self._describe_members()}")

    def _describe_members(self) -> str:
        try:
            return ", ".join(f"{m.name} {m.role}/{m.state}" for m in self.members()) or "no members"
        except LabError as exc:
            return str(exc)

    def _leader_running(self, name: str) -> bool:
        return any(m.name == name and m.role == "leader" and m.state == "running" for m in self.members())

    # ---------------------------------------------------------------- state
    def members(self) -> list[Member]:
        """The cluster as Patroni sees it (``GET /cluster`` on the first live node that answers)."""
        alive = [n for n in self.nodes if n.name not in self.killed]
        for node in alive:
            try:
                status, body = self._request(f"{node.api_url}/cluster", timeout=2)
            except (OSError, ValueError):
                continue
            if status == 200 and isinstance(body, dict):
                return [_member(m) for m in body.get("members", [])]
        raise LabError("no Patroni REST API answers /cluster")

    def primary(self) -> Member:
        leaders = [m for m in self.members() if m.role == "leader"]
        if not leaders:
            raise LabError(f"no leader: {self._describe_members()}")
        return leaders[0]

    def _ready(self) -> bool:
        members = {m.name: m for m in self.members()}
        expected = [n.name for n in self.nodes if n.name not in self.killed]
        leaders = [m for m in members.values() if m.role == "leader" and m.state == "running"]
        if len(leaders) != 1 or set(members) - {n.name for n in self.nodes} or set(expected) - set(members):
            return False
        replicas = [members[n] for n in expected if n != leaders[0].name]
        if not all(r.state == "streaming" for r in replicas):
            return False
        sync = self.spec.synchronous
        if sync is not None and replicas:
            role = "quorum_standby" if sync.method == "any" else "sync_standby"
            want = len(replicas) if sync.method == "any" else min(sync.number, len(replicas))
            if sum(r.role == role for r in replicas) < want:
                return False
        return self._streaming_on(leaders[0].name, replicas)

    def _streaming_on(self, leader: str, replicas: list[Member]) -> bool:
        """The leader's own view agrees: every replica in pg_stat_replication, streaming, and synchronous as the
        plan says. /cluster can give a replica its sync role before the new leader's synchronous_standby_names
        names it (seen right after a switchover): commits would not wait for it yet, and a run started then would
        measure asynchronous commits."""
        with self.connect(leader) as conn:
            rows = conn.execute("SELECT application_name, state, sync_state FROM pg_stat_replication").fetchall()
        seen = {r[0]: (r[1], r[2]) for r in rows}
        if not all(seen.get(r.name, ("", ""))[0] == "streaming" for r in replicas):
            return False
        sync = self.spec.synchronous
        if sync is None or not replicas:
            return True
        if sync.method == "any":
            return all(seen[r.name][1] == "quorum" for r in replicas)
        return sum(seen[r.name][1] == "sync" for r in replicas) >= min(sync.number, len(replicas))

    def wait_ready(self, timeout: float = 120) -> list[Member]:
        """Wait for one running leader and every live replica streaming, synchronous as the plan says."""
        self._wait(self._ready, time.monotonic() + timeout, "a leader and streaming replicas")
        self._write_state()
        return self.members()

    def connect(self, name: str, dbname: str = DBNAME, **kwargs: Any) -> psycopg.Connection[Any]:
        """Control connection to one node, through its unix socket."""
        return psycopg.connect(host=str(self.sock_dir), port=self._node(name).port, user=SUPERUSER,
                               dbname=dbname, passfile=str(self.client_passfile), autocommit=True,
                               connect_timeout=5, application_name="pglab-control", **kwargs)
