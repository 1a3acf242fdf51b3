"""The HA lab: N PostgreSQL instances run by Patroni, with one etcd as the DCS, all on this host.

Where LocalLab (cluster.py) wires streaming replication by hand, here Patroni owns each instance: it bootstraps the
first one, clones the others, manages ``synchronous_standby_names`` (quorum ``ANY k`` or priority), and fails over
when the leader's lock in etcd expires. pglab starts etcd and the Patroni processes, waits for a leader and
streaming replicas, and can switch over, kill a primary and watch the election.

Layout of a lab directory (owned by pglab; the servers' parts owned by the server user when root):

    <lab>/secrets/pgpass        client credentials (0600, owner: the user running pglab)
    <lab>/server/               Patroni's pgpass files (0700, owner: the server user)
    <lab>/etcd/                 etcd's data directory
    <lab>/sock/                 unix sockets of every instance
    <lab>/n0/patroni.yml        n0's Patroni configuration (0600: it holds the passwords)
    <lab>/n0/data  <lab>/n0/wal data and WAL (bases can be moved elsewhere by the plan's paths)
    <lab>/toxiproxy/            Toxiproxy's working directory, when the plan shapes the replication links
    <lab>/logs/etcd.log  <lab>/logs/patroni-n0.log  <lab>/logs/n0.log (PostgreSQL's own log)  <lab>/logs/toxiproxy.log
    <lab>/lab.json              what runs where; its ``nodes`` have the fields a plain lab's have, and
                                ``kind: ha`` tells leftovers.stop_lab it is an HA lab

Limits and links, as the plain lab has them: with ``resources`` (or a CPU axis) each node gets a cgroup
(``pglab-<lab>-<digest>/n0`` …) and its Patroni is started inside it, so the postgres Patroni starts, restarts
or rewinds is born there: a node's limits cover Patroni too, as a Kubernetes pod's cover CloudNativePG's instance
manager. ``client`` gives pgbench a group of its own. ``network`` puts a Toxiproxy proxy in front of each node's
postgres and makes it the node's ``postgresql.connect_address``, which Patroni hands to replicas as the leader's
address: every replica → leader link crosses the current leader's proxy, also after a failover. Clients connect to
the real ports and sockets. A CPU step (``set_cpus``) writes the new quota and restarts every node through
Patroni's REST API, replicas first, the leader in place.

Timings (``TIMINGS``, overridable per lab): Patroni 4.1 raises a ``ttl`` below 20 s to 20 s and wants
``loop_wait + 2 * retry_timeout <= ttl``. The leader lock therefore lives 20 s: killing the leader node elects a
new one after at most ``ttl`` (the lock expires; the kill fell somewhere within a ``loop_wait`` after its last
refresh) plus one HA cycle (``loop_wait``) plus one DCS/PostgreSQL operation (``retry_timeout``):
``failover_budget``. ``loop_wait`` 1 s keeps that short and reacts to a crashed postgres within a second;
``retry_timeout`` 6 s tolerates an etcd fsync or a query stalled for seconds on a loaded 2-core host without
demoting the leader, and leaves 7 s of the ttl unused (1 + 2 × 6 = 13 <= 20). ``failsafe_mode`` keeps a leader
that can still reach every member running while etcd itself stalls. ``primary_start_timeout`` is Patroni's default
(300 s): a leader whose postgres crashed but whose Patroni is alive restarts it in place, see
``kill_primary_postgres``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import psycopg
import yaml
from psycopg.conninfo import make_conninfo

from pglab.errors import LabError, UserError
from pglab.plan.schema import LocalTarget
from pglab.targets.base import Endpoint, Endpoints
from pglab.targets.local import cgroups, leftovers, procs, registry
from pglab.targets.local.cluster import DBNAME, SUPERUSER, conf_value
from pglab.targets.local.lab_base import LabBase
from pglab.targets.local.leftovers import is_ha_lab as is_ha_lab  # also imported from here by cli.py
from pglab.targets.local.postgres_bin import ServerUser, find_bindir, resolve_server_user
from pglab.targets.local.toxiproxy import ToxiproxyServer, find_toxiproxy

Log = Callable[[str], None]
HOST = "127.0.0.1"
REPLICATION_USER = "replicator"
NAMESPACE = "/pglab/"
TIMINGS: dict[str, int] = {"ttl": 20, "loop_wait": 1, "retry_timeout": 6, "primary_start_timeout": 300}
# Direct connections only: a proxy named in http_proxy must never see the lab's loopback API calls.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")


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


@dataclass(frozen=True)
class Kill:
    """A fault injected: which node, which pids got SIGKILL, and when (time.monotonic())."""

    node: str
    pids: tuple[int, ...]
    at: float


@dataclass(frozen=True)
class Transition:
    """A change of leader: from whom, to whom, on which timeline, and how long it took."""

    old: str
    new: str
    timeline: int  # the new leader's, read from the WAL it writes
    seconds: float


class Proc(Protocol):
    """A lab daemon: a Popen this process started, or an ``Adopted`` one started by an earlier pglab."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | Any: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class Adopted:
    """A daemon started by another (earlier) pglab process, watched through /proc: not our child, so its exit
    status is unknown (reported as -1). ``marker`` (its config file or data directory, found in its command line)
    tells it from a process that reused the pid."""

    def __init__(self, pid: int, marker: str):
        self.pid = pid
        self.marker = marker
        self.returncode: int | None = None

    def _running(self) -> bool:
        if not procs.alive(self.pid):
            return False
        try:
            cmd = Path(f"/proc/{self.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return False
        return self.marker in cmd

    def poll(self) -> int | None:
        if self.returncode is None and not self._running():
            self.returncode = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.02)
        return -1


@dataclass
class HANode:
    name: str
    data: Path
    wal: Path
    port: int
    rest_port: int
    config: Path
    log: Path  # Patroni's output
    pg_log: Path  # PostgreSQL's log (logging_collector)
    proc: Proc | None = None

    @property
    def api_url(self) -> str:
        return f"http://{HOST}:{self.rest_port}"

    def postmaster_pid(self) -> int | None:
        return procs.postmaster_pid(self.data)







def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports on loopback (held together while chosen, so none is handed out twice)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def find_etcd() -> Path:
    found = shutil.which("etcd") or ("/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None)
    if not found:
        raise UserError("etcd, the HA lab's DCS, is not installed; run ./setup.sh install "
                        "(or apt-get install etcd-server).")
    return Path(found)


def find_patroni() -> Path:
    """The ``patroni`` entry point beside this Python (the project's virtualenv), else on PATH."""
    beside = Path(sys.executable).parent / "patroni"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("patroni")
    if not found:
        raise UserError("patroni is not installed in pglab's environment; run ./setup.sh install.")
    return Path(found)


def check_timings(timings: dict[str, int]) -> None:
    """Patroni silently rewrites values that break its rules; refuse them instead, so what is recorded holds."""
    ttl, loop_wait, retry = timings["ttl"], timings["loop_wait"], timings["retry_timeout"]
    if ttl < 20 or loop_wait < 1 or retry < 3:
        raise UserError(f"HA timings: Patroni needs ttl >= 20, loop_wait >= 1 and retry_timeout >= 3 "
                        f"(given ttl={ttl}, loop_wait={loop_wait}, retry_timeout={retry}).")
    if loop_wait + 2 * retry > ttl:
        raise UserError(f"HA timings: Patroni needs loop_wait + 2 * retry_timeout <= ttl "
                        f"({loop_wait} + 2 * {retry} > {ttl}).")


class HALab(LabBase[HANode]):
    """Patroni + etcd on this host, from a ``target.local`` spec. ``start()``, then faults, then ``teardown()``."""

    MEMBER = "node"  # a node's cgroup holds its Patroni and all Patroni starts, as a pod's holds its manager

    def __init__(self, spec: LocalTarget, base_dir: Path, log: Log = lambda _m: None,
                 timings: dict[str, int] | None = None):
        self.spec = spec
        self.base_dir = base_dir
        self.log = log
        self.timings = {**TIMINGS, **(timings or {})}
        check_timings(self.timings)
        self.bindir = find_bindir(spec.bindir)
        self.etcd_bin = find_etcd()
        self.patroni_bin = find_patroni()
        self.toxiproxy_bin = find_toxiproxy() if spec.network is not None else None
        self.server_user: ServerUser | None = resolve_server_user(spec.run_as)
        self.lab_dir: Path | None = None
        self.nodes: list[HANode] = []
        self.parameters: dict[str, Any] = {}
        self.etcd_proc: Proc | None = None
        self.restore_from: Path | None = None  # a base backup the first node starts from instead of initdb
        self.restored_system_id: int | None = None
        self.etcd_port = 0
        self.etcd_peer_port = 0
        self.killed: set[str] = set()  # nodes whose Patroni was killed (not restarted)
        self._created_dirs: list[Path] = []
        self._logs: list[IO[bytes]] = []
        self._rest_auth = ""
        self.build_seconds: float | None = None
        self.groups: dict[str, cgroups.Group] = {}  # per node, when the plan gives resources or a CPU axis
        self.client_group: cgroups.Group | None = None
        self.limits_problem: str | None = None  # why limits are not applied (limits: best-effort)
        self.cpus: float | None = spec.resources.cpus if spec.resources else None
        self._events: list[tuple[float, str, str]] = []
        self.toxiproxy: ToxiproxyServer | None = None  # when the plan shapes the replication links
        self.proxy_ports: dict[str, int] = {}  # node -> the port of the proxy in front of its postgres

    # ---------------------------------------------------------------- timings
    @property
    def failover_budget(self) -> float:
        """Upper bound of a failover after the leader node dies: lock expiry (ttl), one HA cycle (loop_wait), one
        DCS/PostgreSQL operation (retry_timeout) for the election and promotion."""
        t = self.timings
        return float(t["ttl"] + t["loop_wait"] + t["retry_timeout"])

    @property
    def name(self) -> str:
        assert self.lab_dir is not None
        return self.lab_dir.name

    # ---------------------------------------------------------------- helpers
    def _write_private(self, path: Path, text: str, server: bool) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if server:
            self._chown(path)

    def _env(self) -> dict[str, str]:
        assert self.lab_dir is not None
        drop = ("PG", "PATRONI_", "ETCD_", "ETCDCTL_")
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and k.lower() not in _PROXY_VARS}
        env.update(LC_ALL="C", LANG="C", HOME=str(self.lab_dir), TMPDIR=str(self.lab_dir / "server"))
        return env

    def _spawn(self, args: list[str], log_path: Path, group: cgroups.Group | None = None) -> subprocess.Popen[bytes]:
        """A lab daemon as the server user, in its own session, its output appended to ``log_path``.

        With ``group``, the daemon is held at the door (a shell waiting for a line on stdin) until pglab has moved
        it into the group, then it execs: whatever it forks later (Patroni's postgres, pg_basebackup, pg_rewind) is
        born in the group. The server user cannot write ``cgroup.procs`` itself (root's), so ``cgroups.wrap``,
        where the process enters the group on its own, does not fit here. If pglab dies before the release, the
        shell reads EOF and exits without running anything."""
        kwargs: dict[str, Any] = self.server_user.popen_kwargs() if self.server_user else {}
        out = open(log_path, "ab")  # noqa: SIM115 - kept open for the daemon's lifetime, closed in stop()
        self._logs.append(out)
        if group is None:
            return subprocess.Popen(args, cwd=self.lab_dir, env=self._env(), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True, **kwargs)
        held = ["sh", "-c", 'read -r _go && exec "$@"', "sh", *args]
        proc = subprocess.Popen(held, cwd=self.lab_dir, env=self._env(), stdin=subprocess.PIPE, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, **kwargs)
        assert proc.stdin is not None
        try:
            group.add(proc.pid)
        except cgroups.CgroupError:
            proc.stdin.close()  # EOF: the shell exits without running the daemon
            proc.wait(timeout=10)
            raise
        proc.stdin.write(b"go\n")
        proc.stdin.close()  # the daemon's stdin is then at EOF, as /dev/null would be
        return proc

    def _request(self, url: str, method: str = "GET", body: Any = None, timeout: float = 5) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if method != "GET":
            headers["Authorization"] = self._rest_auth
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with _OPENER.open(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        text = raw.decode(errors="replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def _node(self, name: str) -> HANode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def _tail(self, path: Path, lines: int = 3) -> str:
        try:
            text = path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " / ".join(text[-lines:])

    # ---------------------------------------------------------------- limits (cgroups)
    def _roll(self, timeout: float) -> None:
        self.rolling_restart(timeout)

    def rolling_restart(self, timeout: float = 180) -> list[str]:
        """Restart every live node's postgres through Patroni (``POST /restart``): the replicas one by one, each
        back to streaming before the next, then the leader in place. In place, not a switchover first: the leader
        keeps its lock while Patroni restarts its postgres, writes pause for the restart and resume on the same
        node — CloudNativePG's default for the primary (``primaryUpdateMethod: restart``) and what the plain lab
        does, so a CPU step costs the same kind of outage on both. Returns the nodes in the order restarted."""
        deadline = time.monotonic() + timeout
        leader = self.primary().name
        order = [n.name for n in self.nodes if n.name not in self.killed and n.name != leader] + [leader]
        for name in order:
            self.log(f"restart {name} (rolling)")
            status, reply = self._request(f"{self._node(name).api_url}/restart", "POST", {},
                                          timeout=max(1.0, deadline - time.monotonic()))
            if status != 200:
                raise LabError(f"restart of {name} refused ({status}): {reply}")
            self.wait_ready(max(1.0, deadline - time.monotonic()))
        return order

    # ---------------------------------------------------------------- replication links (Toxiproxy)
    def _start_proxies(self) -> None:
        """One Toxiproxy proxy in front of each node's postgres, when the plan shapes the network. Each node
        advertises its proxy as its ``postgresql.connect_address``, the address Patroni gives replicas for their
        ``primary_conninfo`` (and uses for pg_basebackup and pg_rewind): every replica → leader link crosses the
        leader's proxy, whichever node leads. Clients use the real ports and the unix sockets, never a proxy."""
        if self.spec.network is None:
            return
        assert self.lab_dir is not None
        self.toxiproxy = ToxiproxyServer(self.lab_dir / "toxiproxy", self.lab_dir / "logs" / "toxiproxy.log",
                                         binary=self.toxiproxy_bin)
        for node in self.nodes:
            self.proxy_ports[node.name] = self.toxiproxy.create_proxy(node.name, node.port)

    # ---------------------------------------------------------------- build
    def _prepare_dirs(self) -> None:
        spec = self.spec
        if spec.paths.lab:
            lab = self._abs(spec.paths.lab)
            if lab.exists() and any(lab.iterdir()):
                raise UserError(f"target.local.paths.lab: '{lab}' is not empty; give an empty or new directory.")
            lab.mkdir(parents=True, exist_ok=True)
        else:
            lab = Path(tempfile.mkdtemp(prefix="pglab-ha-"))
        self._created_dirs.append(lab)
        self.lab_dir = lab
        os.chmod(lab, 0o711)  # the server user must traverse it, nobody needs to list it
        (lab / "secrets").mkdir(mode=0o700)
        self._mkdir_server(lab / "server")
        self._mkdir_server(lab / "etcd")
        self._mkdir_server(lab / "sock", 0o755)
        self._mkdir_server(lab / "logs", 0o755)
        data_base = self._abs(spec.paths.data) if spec.paths.data else lab
        wal_base = self._abs(spec.paths.wal) if spec.paths.wal else lab
        for field, base in (("lab", lab), ("data", data_base), ("wal", wal_base)):
            try:
                base.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UserError(f"target.local.paths.{field}: cannot create '{base}' ({exc.strerror}).") from None
            self._check_traversable(base, f"target.local.paths.{field}")
        ports = _free_ports(2 * spec.instances + 2)
        self.etcd_port, self.etcd_peer_port = ports[-2:]
        self.nodes = []
        for i in range(spec.instances):
            name = f"n{i}"
            data, wal = data_base / name / "data", wal_base / name / "wal"
            for d in (data, wal):
                if d.exists():
                    raise UserError(f"'{d}' already exists; remove it or choose other target.local.paths.")
            for d in dict.fromkeys((lab / name, data.parent, wal.parent)):
                if not d.exists():
                    self._mkdir_server(d)
                    self._created_dirs.append(d)
            self.nodes.append(HANode(name, data, wal, ports[2 * i], ports[2 * i + 1], lab / name / "patroni.yml",
                                     lab / "logs" / f"patroni-{name}.log", lab / "logs" / f"{name}.log"))

    def _write_state(self) -> None:
        if not self.lab_dir:
            return
        state = {
            "kind": "ha",
            "pglab_pid": os.getpid(),
            "created": time.time(),
            "scope": self.name,
            # what HALab.attach needs to act on the lab from another pglab process
            "spec": self.spec.model_dump(mode="json"), "base_dir": str(self.base_dir),
            "parameters": self.parameters, "timings": self.timings,
            "etcd": {"client_port": self.etcd_port, "peer_port": self.etcd_peer_port,
                     "pid": self.etcd_proc.pid if self.etcd_proc else None},
            "nodes": [{"name": n.name, "data": str(n.data), "wal": str(n.wal), "port": n.port,
                       "rest_port": n.rest_port, "config": str(n.config),
                       "patroni_pid": n.proc.pid if n.proc else None, "pid": n.postmaster_pid()}
                      for n in self.nodes],
        }
        tmp = self.lab_dir / "lab.json.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.lab_dir / "lab.json")

    def _dcs_config(self, parameters: dict[str, Any]) -> dict[str, Any]:
        t = self.timings
        sync = self.spec.synchronous
        dcs: dict[str, Any] = {
            "ttl": t["ttl"], "loop_wait": t["loop_wait"], "retry_timeout": t["retry_timeout"],
            "primary_start_timeout": t["primary_start_timeout"],
            "maximum_lag_on_failover": 1024 * 1024,
            "failsafe_mode": True,
            "synchronous_mode": False,
            "postgresql": {
                "use_pg_rewind": True,
                "use_slots": True,
                "parameters": {
                    "wal_level": "replica", "hot_standby": True, "max_wal_senders": 10, "max_replication_slots": 10,
                    "log_checkpoints": True, "log_timezone": "UTC",  # the runner reads checkpoint times from logs
                    **parameters,
                },
            },
        }
        if sync is not None and len(self.nodes) > 1:
            dcs["synchronous_mode"] = "quorum" if sync.method == "any" else True
            dcs["synchronous_node_count"] = sync.number
        return dcs

    def _patroni_config(self, node: HANode, passwords: dict[str, str], parameters: dict[str, Any]) -> dict[str, Any]:
        assert self.lab_dir is not None
        bootstrap: dict[str, Any] = {
            "dcs": self._dcs_config(parameters),
            "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, {"waldir": str(node.wal)}],
        }
        if self.restore_from is not None and node is self.nodes[0]:
            # Patroni's custom bootstrap: the script moves the staged backup into place, Patroni starts it (backup
            # recovery from the WAL streamed with it), then sets the new lab's passwords
            bootstrap["method"] = "pglab_restore"
            bootstrap["pglab_restore"] = {"command": str(self.lab_dir / "server" / "restore.sh"), "no_params": True}
        return {
            "scope": self.name,
            "namespace": NAMESPACE,
            "name": node.name,
            "restapi": {"listen": f"{HOST}:{node.rest_port}", "connect_address": f"{HOST}:{node.rest_port}",
                        "authentication": {"username": SUPERUSER, "password": passwords["rest"]}},
            "etcd3": {"hosts": [f"{HOST}:{self.etcd_port}"], "protocol": "http"},
            "watchdog": {"mode": "off"},
            "bootstrap": bootstrap,
            "postgresql": {
                "listen": f"{HOST}:{node.port}",
                # what replicas stream from: the node's proxy when the plan shapes the links
                "connect_address": f"{HOST}:{self.proxy_ports.get(node.name, node.port)}",
                "data_dir": str(node.data),
                "bin_dir": str(self.bindir),
                "pgpass": str(self.lab_dir / "server" / f"pgpass-{node.name}"),
                "authentication": {
                    "superuser": {"username": SUPERUSER, "password": passwords["superuser"]},
                    "replication": {"username": REPLICATION_USER, "password": passwords["replication"]},
                },
                "parameters": {
                    "unix_socket_directories": str(self.lab_dir / "sock"),
                    "logging_collector": True,
                    "log_directory": str(self.lab_dir / "logs"),
                    "log_filename": node.pg_log.name,
                    "log_file_mode": "0644",
                    "log_rotation_age": 0,
                    "log_rotation_size": 0,
                },
                "pg_hba": [
                    "# written by Patroni for pglab: loopback and unix sockets only, passwords never in clear",
                    "local all all scram-sha-256",
                    f"host all all {HOST}/32 scram-sha-256",
                    f"local replication {REPLICATION_USER} scram-sha-256",
                    f"host replication {REPLICATION_USER} {HOST}/32 scram-sha-256",
                    f"local replication {SUPERUSER} scram-sha-256",  # base backups taken by pglab's scenarios
                ],
                "basebackup": [{"waldir": str(node.wal)}, {"checkpoint": "fast"}],
                "create_replica_methods": ["basebackup"],
            },
        }

    def start(self, parameters: dict[str, Any] | None = None, timeout: float = 240) -> None:
        """Build the lab: etcd, then the first node bootstraps as leader, then the others clone it; returns once
        every replica streams with the synchronous state the plan asks for."""
        started = time.monotonic()
        deadline = started + timeout
        try:
            self._prepare_dirs()
            assert self.lab_dir is not None
            registry.register(self.lab_dir, [d for d in self._created_dirs if not d.is_relative_to(self.lab_dir)])
            if parameters:
                self._normalized(parameters)  # refuse invalid ones before anything runs
            self.parameters = dict(parameters or {})
            passwords = {k: secrets.token_urlsafe(24) for k in ("superuser", "replication", "rest")}
            self._rest_auth = "Basic " + base64.b64encode(f"{SUPERUSER}:{passwords['rest']}".encode()).decode()
            self._write_private(self.client_passfile, f"*:*:*:{SUPERUSER}:{passwords['superuser']}\n", server=False)
            self._write_private(self.lab_dir / "secrets" / "rest-auth", self._rest_auth + "\n", server=False)
            if self.restore_from is not None:
                self._stage_restore(self.restore_from)
            self._make_groups()
            self._write_state()
            self._start_proxies()  # before the configurations: each names its node's proxy
            self._start_etcd(deadline)  # first: its port, if it had to move, goes into every patroni.yml
            for node in self.nodes:
                cfg = self._patroni_config(node, passwords, self.parameters)
                self._write_private(node.config, yaml.safe_dump(cfg, sort_keys=False), server=True)
            first = self.nodes[0]
            how = f"restore of {self.restore_from}" if self.restore_from is not None else "initdb"
            self.log(f"patroni {first.name}: bootstrap ({how}, data {first.data}, WAL {first.wal})")
            self._start_patroni(first)
            self._wait(lambda: self._leader_running(first.name), deadline, f"{first.name} to bootstrap as leader")
            with self.connect(first.name, dbname="postgres") as conn:  # a restored backup may hold it already
                if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DBNAME]).fetchone() is None:
                    conn.execute(f"CREATE DATABASE {DBNAME}")
            for node in self.nodes[1:]:
                self.log(f"patroni {node.name}: replica (pg_basebackup from {first.name})")
                self._start_patroni(node)
            self.wait_ready(max(1.0, deadline - time.monotonic()))
            self._shape_links()  # once every replica streams: the clones copy at loopback speed
        except BaseException:
            self.teardown()
            raise
        self.build_seconds = time.monotonic() - started
        self.log(f"HA lab {self.name} up in {self.build_seconds:.1f} s: "
                 + ", ".join(f"{m.name} {m.role}" for m in self.members()))

    def _start_etcd(self, deadline: float) -> None:
        assert self.lab_dir is not None
        for attempt in range(3):
            if attempt:  # the port was taken between choosing and binding it
                self.etcd_port, self.etcd_peer_port = _free_ports(2)
            client, peer = f"http://{HOST}:{self.etcd_port}", f"http://{HOST}:{self.etcd_peer_port}"
            log_path = self.lab_dir / "logs" / "etcd.log"
            offset = log_path.stat().st_size if log_path.exists() else 0
            self.etcd_proc = self._spawn([
                str(self.etcd_bin), "--name", "etcd0", "--data-dir", str(self.lab_dir / "etcd"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"etcd0={peer}", "--initial-cluster-state", "new",
                "--initial-cluster-token", self.name, "--logger", "zap", "--log-outputs", "stderr",
            ], log_path)
            self._write_state()
            while time.monotonic() < deadline:
                if self.etcd_proc.poll() is not None:
                    with open(log_path, "rb") as f:
                        f.seek(offset)
                        text = f.read().decode(errors="replace")
                    if "address already in use" in text:
                        break
                    raise LabError(f"etcd exited with code {self.etcd_proc.returncode}: {self._tail(log_path)}")
                with contextlib.suppress(OSError, ValueError):
                    status, body = self._request(f"{client}/health", timeout=1)
                    if status == 200 and isinstance(body, dict) and body.get("health") == "true":
                        self.log(f"etcd on {HOST}:{self.etcd_port}")
                        return
                time.sleep(0.1)
            else:
                raise LabError(f"etcd did not become healthy: {self._tail(log_path)}")
        raise LabError("etcd did not start: every port tried was taken")

    def _start_patroni(self, node: HANode) -> None:
        """Patroni in the node's group (when there is one), so that every postgres it starts is born there."""
        try:
            node.proc = self._spawn([str(self.patroni_bin), str(node.config)], node.log, self.groups.get(node.name))
        except cgroups.CgroupError as exc:  # its group was removed under the lab, or cgroups stopped working
            raise LabError(f"patroni {node.name} could not enter its cgroup: {exc}") from None
        self._write_state()

    def start_node(self, name: str) -> None:
        """Start a node's Patroni again (after ``kill_primary_node``): it rejoins as a replica (pg_rewind if needed)."""
        node = self._node(name)
        if node.proc is not None and node.proc.poll() is None:
            return
        self.killed.discard(name)
        self._start_patroni(node)

    # ---------------------------------------------------------------- a lab run by several pglab processes
    @classmethod
    def attach(cls, lab_dir: Path, log: Log = lambda _m: None) -> HALab:
        """An HALab for a lab another pglab process started (``pglab cluster create``), rebuilt from its lab.json:
        its daemons are adopted (watched through /proc, stopped by pid), new ones are started by this process."""
        lab_dir = lab_dir.resolve()
        try:
            state = json.loads((lab_dir / "lab.json").read_text())
        except (OSError, ValueError):
            raise UserError(f"'{lab_dir}' is not a pglab lab (no readable lab.json).") from None
        if state.get("kind") != "ha" or "spec" not in state:
            raise UserError(f"'{lab_dir}' is not an HA lab made by 'pglab cluster create' (or it is too old).")
        spec = LocalTarget.model_validate(state["spec"])
        for field in ("resources", "client", "network"):  # groups and proxies live in the process that built them
            if getattr(spec, field) is not None:
                raise UserError(f"'{lab_dir}' was built with target.local.{field}, which another pglab process "
                                f"cannot act on yet; remove it with: pglab lab clean {lab_dir}")
        lab = cls(spec, Path(state["base_dir"]), log, state.get("timings"))
        lab.lab_dir = lab_dir
        lab.parameters = dict(state.get("parameters") or {})
        lab._created_dirs = [lab_dir]
        lab._rest_auth = (lab_dir / "secrets" / "rest-auth").read_text().strip()
        etcd = state["etcd"]
        lab.etcd_port, lab.etcd_peer_port = int(etcd["client_port"]), int(etcd["peer_port"])
        if etcd.get("pid"):
            lab.etcd_proc = Adopted(int(etcd["pid"]), str(lab_dir / "etcd"))
        for n in state["nodes"]:
            name = str(n["name"])
            node = HANode(name, Path(n["data"]), Path(n["wal"]), int(n["port"]), int(n["rest_port"]),
                          Path(n["config"]), lab_dir / "logs" / f"patroni-{name}.log", lab_dir / "logs" / f"{name}.log")
            if n.get("patroni_pid"):
                proc = Adopted(int(n["patroni_pid"]), str(node.config))
                node.proc = proc if proc.poll() is None else None
            if node.proc is None:
                lab.killed.add(name)  # down: not expected in members() until start_node
            lab.nodes.append(node)
        return lab

    def _passwords(self) -> dict[str, str]:
        """The lab's passwords, read back from a node's patroni.yml (for a node added later)."""
        cfg = yaml.safe_load(self.nodes[0].config.read_text())
        auth = cfg["postgresql"]["authentication"]
        return {"superuser": auth["superuser"]["password"], "replication": auth["replication"]["password"],
                "rest": cfg["restapi"]["authentication"]["password"]}

    def add_node(self, timeout: float = 180) -> HANode:
        """One more replica: its Patroni clones the leader (pg_basebackup); returns once every replica streams."""
        assert self.lab_dir is not None
        taken = {n.name for n in self.nodes}
        name = next(f"n{i}" for i in range(len(taken) + 1) if f"n{i}" not in taken)
        ref = self.nodes[0]
        data, wal = ref.data.parent.parent / name / "data", ref.wal.parent.parent / name / "wal"
        for d in (data, wal):
            if d.exists():
                raise UserError(f"'{d}' already exists; remove it before adding node {name}.")
        for d in dict.fromkeys((self.lab_dir / name, data.parent, wal.parent)):
            if not d.exists():
                self._mkdir_server(d)
                self._created_dirs.append(d)
        port, rest_port = _free_ports(2)
        node = HANode(name, data, wal, port, rest_port, self.lab_dir / name / "patroni.yml",
                      self.lab_dir / "logs" / f"patroni-{name}.log", self.lab_dir / "logs" / f"{name}.log")
        if self.groups:
            self._make_group(node)
        if self.toxiproxy is not None:
            self.proxy_ports[name] = self.toxiproxy.create_proxy(name, port)
            self._shape_links([name])
        cfg = self._patroni_config(node, self._passwords(), self.parameters)
        self._write_private(node.config, yaml.safe_dump(cfg, sort_keys=False), server=True)
        self.nodes.append(node)
        self.log(f"patroni {name}: replica (pg_basebackup from the leader)")
        self._start_patroni(node)
        self.wait_ready(timeout)
        return node

    def remove_node(self, name: str, timeout: float = 30) -> None:
        """Stop a replica's Patroni (it stops its postgres), forget it in etcd (the leader drops its slot and its
        place in synchronous_standby_names) and remove its files."""
        assert self.lab_dir is not None
        node = self._node(name)
        if self.primary().name == name:
            raise UserError(f"{name} is the leader; switch over first or remove a replica.")
        if node.proc is not None and node.proc.poll() is None:
            self._stop_patronis([node], timeout)
        pid = node.postmaster_pid()
        if pid is not None:  # Patroni was gone, or did not stop it in time
            procs.stop_postmaster(pid)
        key = f"/{NAMESPACE.strip('/')}/{self.name}/members/{name}"
        req = urllib.request.Request(f"http://{HOST}:{self.etcd_port}/v3/kv/deleterange", method="POST",
                                     data=json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode(),
                                     headers={"Content-Type": "application/json"})  # no REST API credentials
        try:
            with _OPENER.open(req, timeout=10) as resp:
                resp.read()
        except (OSError, urllib.error.HTTPError) as exc:
            raise LabError(f"etcd refused to delete {key}: {exc}") from None
        self.nodes.remove(node)
        self.killed.discard(name)
        self._drop_member_slot(name)
        if self.toxiproxy is not None and self.proxy_ports.pop(name, None) is not None:
            self.toxiproxy.delete_proxy(name)
        if (group := self.groups.pop(name, None)) is not None:
            group.remove()
        for d in dict.fromkeys((self.lab_dir / name, node.data.parent, node.wal.parent)):
            if d.name == name:  # the node's own folder under the lab or a data/WAL base, never a base itself
                shutil.rmtree(d, ignore_errors=True)
        self._write_state()
        self.log(f"node {name} removed")

    def _drop_member_slot(self, name: str, timeout: float = 20) -> None:
        """Patroni 4 keeps a departed member's slot on the leader for member_slots_ttl (30 min), holding WAL for
        it: set it to 0 until the leader drops the slot, then put the previous value back."""
        leader = self.primary().name
        url = f"{self._node(leader).api_url}/config"
        status, config = self._request(url)
        previous = config.get("member_slots_ttl") if status == 200 and isinstance(config, dict) else None
        status, reply = self._request(url, "PATCH", {"member_slots_ttl": 0})
        if status != 200:
            raise LabError(f"PATCH /config refused ({status}): {reply}")
        try:
            def dropped() -> bool:
                with self.connect(leader) as conn:
                    return conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s",
                                        [name]).fetchone() is None

            self._wait(dropped, time.monotonic() + timeout, f"the leader to drop the replication slot of {name}")
        finally:
            self._request(url, "PATCH", {"member_slots_ttl": previous})

    def _stage_restore(self, backup: Path) -> None:
        """Copy a pg_basebackup (plain or tar, WAL included) where the first node's bootstrap script takes it from,
        owned by the server user, WAL apart behind a pg_wal symlink as initdb --waldir makes it."""
        try:
            self._stage_restore_files(backup)
        except (OSError, subprocess.CalledProcessError, IndexError) as exc:
            detail = exc.stderr.decode(errors="replace").strip() if isinstance(exc, subprocess.CalledProcessError) \
                else str(exc)
            raise LabError(f"cannot stage the backup {backup} for restore: {detail}") from None

    def _stage_restore_files(self, backup: Path) -> None:
        assert self.lab_dir is not None
        first = self.nodes[0]
        stage = self.lab_dir / "server" / "restore"
        data, wal = stage / "data", stage / "wal"
        stage.mkdir(mode=0o700)
        wal.mkdir(mode=0o700)
        if (backup / "base.tar").is_file():
            data.mkdir(mode=0o700)
            for tar, into in ((backup / "base.tar", data), (backup / "pg_wal.tar", wal)):
                if tar.is_file():
                    subprocess.run(["tar", "-xf", str(tar), "-C", str(into)], check=True, capture_output=True)
        else:
            shutil.copytree(backup, data, symlinks=True)
        pg_wal = data / "pg_wal"
        if pg_wal.is_symlink():  # a backup of a data directory whose WAL lives elsewhere: not followed
            pg_wal.unlink()
        elif pg_wal.is_dir():
            for entry in pg_wal.iterdir():
                if not (wal / entry.name).exists():
                    shutil.move(entry, wal / entry.name)
            shutil.rmtree(pg_wal)
        for leftover in ("patroni.dynamic.json", "postmaster.pid", "postmaster.opts", "standby.signal",
                         "recovery.signal", "backup_manifest"):
            with contextlib.suppress(FileNotFoundError):
                (data / leftover).unlink()
        pg_wal.symlink_to(first.wal)
        control = (data / "global" / "pg_control").read_bytes()
        self.restored_system_id = int.from_bytes(control[:8], "little")
        os.chmod(data, 0o700)
        if self.server_user:
            for top, dirs, files in os.walk(stage):
                for path in [top, *(os.path.join(top, x) for x in dirs + files)]:
                    os.lchown(path, self.server_user.uid, self.server_user.gid)
        script = self.lab_dir / "server" / "restore.sh"
        script.write_text(f"#!/bin/sh\nset -e\nmv '{wal}' '{first.wal}'\nmv '{data}' '{first.data}'\n")
        os.chmod(script, 0o700)
        self._chown(script)

    def _wait(self, check: Callable[[], bool], deadline: float, what: str) -> None:
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc is not None and node.name not in self.killed and node.proc.poll() is not None:
                    raise LabError(f"patroni {node.name} exited with code {node.proc.returncode} while waiting for "
                                   f"{what}: {self._tail(node.log)}")
            with contextlib.suppress(OSError, ValueError, psycopg.Error, LabError):
                if check():
                    return
            time.sleep(0.2)
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

    # ---------------------------------------------------------------- clients
    def conninfo_multi(self, **extra: str | int) -> str:
        """A multi-host libpq string over every node that lands on the primary (``target_session_attrs``)."""
        params: dict[str, str | int] = {
            "host": ",".join(HOST for _ in self.nodes),
            "port": ",".join(str(n.port) for n in self.nodes),
            "user": SUPERUSER, "dbname": DBNAME, "passfile": str(self.client_passfile),
            "target_session_attrs": "read-write", "connect_timeout": 5,
            **extra,
        }
        return make_conninfo(**{k: str(v) for k, v in params.items()})

    def connect(self, name: str, dbname: str = DBNAME, **kwargs: Any) -> psycopg.Connection[Any]:
        """Control connection to one node, through its unix socket."""
        assert self.lab_dir is not None
        return psycopg.connect(host=str(self.lab_dir / "sock"), port=self._node(name).port, user=SUPERUSER,
                               dbname=dbname, passfile=str(self.client_passfile), autocommit=True,
                               connect_timeout=5, application_name="pglab-control", **kwargs)

    def endpoints(self) -> Endpoints:
        """The current leader as primary and the other live nodes as standbys (unix sockets)."""
        assert self.lab_dir is not None
        leader, sock = self.primary().name, str(self.lab_dir / "sock")

        def ep(n: HANode, role: str) -> Endpoint:
            return Endpoint(n.name, role, sock, n.port, SUPERUSER, DBNAME, self.client_passfile)

        return Endpoints(ep(self._node(leader), "primary"),
                         [ep(n, "standby") for n in self.nodes if n.name != leader and n.name not in self.killed])

    def pids(self) -> dict[str, int]:
        """Every lab daemon now running: etcd, each Patroni, each postmaster."""
        out: dict[str, int] = {}
        if self.etcd_proc is not None and self.etcd_proc.poll() is None:
            out["etcd"] = self.etcd_proc.pid
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                out[f"patroni-{n.name}"] = n.proc.pid
            if (p := n.postmaster_pid()) is not None:
                out[f"postgres-{n.name}"] = p
        return out

    def logs(self) -> dict[str, Path]:
        """etcd's, each Patroni's and each PostgreSQL's log (kept by a runner as artifacts)."""
        assert self.lab_dir is not None
        paths = {"etcd": self.lab_dir / "logs" / "etcd.log"}
        for n in self.nodes:
            paths[f"patroni-{n.name}"] = n.log
            paths[n.name] = n.pg_log
        return {k: p for k, p in paths.items() if p.is_file()}

    # ---------------------------------------------------------------- operations and faults
    def switchover(self, candidate: str | None = None, timeout: float = 90) -> Transition:
        """Planned switchover through the leader's REST API; returns once the new leader runs and takes writes."""
        started = time.monotonic()
        old = self.primary()
        body: dict[str, Any] = {"leader": old.name}
        if candidate:
            body["candidate"] = candidate
        status, reply = self._request(f"{self._node(old.name).api_url}/switchover", "POST", body, timeout=timeout)
        if status != 200:
            raise LabError(f"switchover from {old.name} refused ({status}): {reply}")
        return self.wait_new_primary(old.name, max(1.0, timeout - (time.monotonic() - started)), since=started)

    def kill_primary_postgres(self) -> Kill:
        """SIGKILL the leader's postmaster only. Its Patroni, still holding the leader lock, sees postgres down
        within ``loop_wait`` and, ``primary_start_timeout`` (300 s) not being over, starts it again in place as
        primary (crash recovery, same timeline): no failover; writes stop for about loop_wait + recovery."""
        leader = self.primary().name
        pid = self._node(leader).postmaster_pid()
        if pid is None:
            raise LabError(f"leader {leader} has no running postmaster")
        at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        self.log(f"killed postmaster of leader {leader} (pid {pid})")
        return Kill(leader, (pid,), at)

    def kill_primary_node(self) -> Kill:
        """SIGKILL the leader's Patroni and its whole PostgreSQL together (the node dies): a real failover once the
        leader lock expires. The node stays down until ``start_node``."""
        return self.kill_node(self.primary().name)

    def kill_node(self, leader: str) -> Kill:
        """SIGKILL a node's Patroni and PostgreSQL together; it stays down until ``start_node``."""
        node = self._node(leader)
        pids: list[int] = []
        if node.proc is not None and node.proc.poll() is None:
            pids += [node.proc.pid, *procs.descendants(node.proc.pid)]
        if (pm := node.postmaster_pid()) is not None:
            pids += [pm, *procs.descendants(pm)]  # started by Patroni in its own session, reparented: not below it
        at = time.monotonic()
        procs.freeze_and_kill(pids)
        self.killed.add(leader)
        if node.proc is not None:
            node.proc.wait(timeout=10)
        end = time.monotonic() + 10  # return once the node is dead: a killed process takes a moment to exit
        while any(procs.alive(p) for p in pids) and time.monotonic() < end:
            time.sleep(0.01)
        self.log(f"killed node {leader}: patroni and postgres (pids {', '.join(map(str, pids))})")
        return Kill(leader, tuple(pids), at)

    def wait_new_primary(self, old: str, timeout: float | None = None, since: float | None = None) -> Transition:
        """Wait until a node other than ``old`` is the running leader and accepts writes. ``seconds`` counts from
        ``since`` (e.g. a Kill's ``at``), else from the call."""
        start = time.monotonic() if since is None else since
        deadline = time.monotonic() + (timeout if timeout is not None else 2 * self.failover_budget)
        found: list[tuple[str, int]] = []

        def check() -> bool:
            leaders = [m for m in self.members() if m.role == "leader" and m.state == "running" and m.name != old]
            if not leaders:
                return False
            with self.connect(leaders[0].name) as conn:
                if conn.execute("SELECT pg_is_in_recovery()").fetchone() != (False,):
                    return False
                row = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()
            # the timeline it writes on: /cluster may still show the one before the promotion
            found[:] = [(leaders[0].name, int(row[0][:8], 16) if row else 0)]
            return True

        self._wait(check, deadline, f"a new leader other than {old}")
        seconds = time.monotonic() - start
        new, timeline = found[0]
        self.log(f"new leader {new} (was {old}, timeline {timeline}) after {seconds:.1f} s")
        return Transition(old, new, timeline, seconds)

    # ---------------------------------------------------------------- settings
    def _postgres_c(self, name: str, value: Any) -> str:
        """The value as pg_settings.setting shows it, from PostgreSQL itself (``postgres -C`` on a scratch
        configuration, so it works before any node exists); an invalid name or value is the user's to fix."""
        assert self.lab_dir is not None
        scratch = self.lab_dir / "server" / "guc"
        if not (scratch / "postgresql.conf").exists():
            self._mkdir_server(scratch)
            (scratch / "postgresql.conf").write_text("")
            self._chown(scratch / "postgresql.conf")
        args = [str(self.bindir / "postgres"), "-D", str(scratch), "-C", name,
                "-c", f"{name}={conf_value(value).strip(chr(39))}"]
        kwargs: dict[str, Any] = self.server_user.popen_kwargs() if self.server_user else {}
        proc = subprocess.run(args, capture_output=True, text=True, timeout=30, env=self._env(), cwd=self.lab_dir,
                              check=False, **kwargs)
        if proc.returncode != 0:
            message = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no message)"]
            raise UserError(f"parameters.{name}: PostgreSQL rejects it ({message[0].replace('FATAL:  ', '')}); "
                            "fix the plan.")
        return str(proc.stdout).strip()

    def _normalized(self, parameters: dict[str, Any]) -> dict[str, str]:
        return {k: self._postgres_c(k, v) for k, v in parameters.items()}

    def apply(self, parameters: dict[str, Any], timeout: float = 120) -> list[str]:
        """Put ``parameters`` in force on every node through Patroni's dynamic configuration (PATCH /config);
        parameters set before and absent now are removed. Restarts the nodes (replicas first) when PostgreSQL
        asks for it. Returns the nodes restarted."""
        if parameters == self.parameters:
            return []
        want = self._normalized(parameters)
        patch: dict[str, Any] = {k: None for k in self.parameters if k not in parameters}
        patch.update(parameters)
        leader = self.primary().name
        status, reply = self._request(f"{self._node(leader).api_url}/config", "PATCH",
                                      {"postgresql": {"parameters": patch}})
        if status != 200:
            raise LabError(f"PATCH /config refused ({status}): {reply}")
        self.parameters = dict(parameters)
        deadline = time.monotonic() + timeout
        live = [n.name for n in self.nodes if n.name not in self.killed]
        pending: set[str] = set()

        def settled() -> bool:
            pending.clear()
            for name in live:
                with self.connect(name) as conn:
                    rows = conn.execute("SELECT name, setting, pending_restart FROM pg_settings WHERE name = ANY(%s)",
                                        [list(want)]).fetchall()
                for pname, setting, pend in rows:
                    if pend:
                        pending.add(name)
                    elif setting != want[pname]:
                        return False
            return True

        self._wait(settled, deadline, "the new parameters to be read by every node")
        if not pending:
            return []
        order = sorted(pending, key=lambda n: n == leader)  # replicas first, the leader last
        for name in order:
            self.log(f"restart {name} for parameters")
            status, reply = self._request(f"{self._node(name).api_url}/restart", "POST", {}, timeout=timeout)
            if status != 200:
                raise LabError(f"restart of {name} refused ({status}): {reply}")
        self._wait(lambda: settled() and not pending, deadline, "the new parameters in force after restart")
        self.wait_ready(max(1.0, deadline - time.monotonic()))
        return order

    # ---------------------------------------------------------------- teardown
    def stop(self, graceful: bool = True, timeout: float = 30) -> None:
        """Stop every Patroni, every PostgreSQL, then etcd; whatever still runs from the lab after that is killed.

        ``graceful``: SIGTERM each Patroni, which stops its postgres cleanly (replicas first, so none takes over
        from a leader being stopped; a synchronous standby waits to be released by the primary: seconds each).
        Otherwise every Patroni gets SIGKILL and each postmaster an immediate shutdown (SIGQUIT), for a lab about
        to be removed. Idempotent."""
        if graceful:
            try:
                leader: str | None = self.primary().name
            except LabError:
                leader = None
            replicas = [n for n in self.nodes if n.name != leader]
            for group in (replicas, [n for n in self.nodes if n.name == leader]):
                self._stop_patronis(group, timeout)
        else:
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is None:
                    procs.freeze_and_kill([node.proc.pid, *procs.descendants(node.proc.pid)])
                    node.proc.wait(timeout=10)
        for node in self.nodes:  # a postgres whose Patroni is gone would otherwise run on
            pid = node.postmaster_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGQUIT)  # immediate shutdown: the postmaster takes its children down
        for node in self.nodes:
            if (pid := node.postmaster_pid()) is not None:
                procs.stop_postmaster(pid, signalled=True)  # all were signalled at once above
        if self.etcd_proc is not None:
            _terminate(self.etcd_proc, 10)
        if self.toxiproxy is not None:
            self.toxiproxy.stop()
        if self.lab_dir is not None:
            leftovers.sweep([self.lab_dir, *self._outside_dirs()])
        for f in self._logs:
            f.close()
        self._logs.clear()

    def _stop_patronis(self, nodes: list[HANode], timeout: float) -> None:
        procs = [n.proc for n in nodes if n.proc is not None and n.proc.poll() is None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)  # Patroni stops its postgres (fast) before it exits
        for p in procs:
            _terminate(p, timeout)

    def _outside_dirs(self) -> list[Path]:
        assert self.lab_dir is not None
        return [d for d in self._created_dirs if not d.is_relative_to(self.lab_dir)]

    def teardown(self, keep: bool = False) -> None:
        """Stop everything and remove what the lab created (``keep``: leave it running, marked kept)."""
        if keep:
            if self.lab_dir:
                registry.mark_kept(self.lab_dir)
                self.log(f"HA lab kept running in {self.lab_dir}")
            return
        self.stop(graceful=False)  # its files go next: a clean shutdown would only cost seconds
        self._remove_groups()  # empty now: every process of the lab is gone
        for d in reversed(self._created_dirs):
            shutil.rmtree(d, ignore_errors=True)
        self._created_dirs.clear()
        if self.lab_dir:
            registry.unregister(self.lab_dir)


def _member(m: dict[str, Any]) -> Member:
    lag = m.get("lag")
    return Member(name=str(m.get("name")), role=str(m.get("role", "")), state=str(m.get("state", "")),
                  lag=lag if isinstance(lag, int) else None,
                  timeline=m.get("timeline") if isinstance(m.get("timeline"), int) else None,
                  port=m.get("port") if isinstance(m.get("port"), int) else None, api_url=str(m.get("api_url", "")))


def _terminate(proc: Proc, timeout: float) -> None:
    """SIGTERM (if not sent yet), wait, then SIGKILL the process and what it started; always reaped."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            procs.freeze_and_kill([proc.pid, *procs.descendants(proc.pid)])
            proc.wait(timeout=10)


def clean_ha_lab(lab_dir: Path, unregister_entry: bool = True) -> list[str]:
    """Stop what an HA lab left running (kept, or left behind by a pglab that was killed) and remove it (and its
    registry entry unless told not to); see :func:`leftovers.stop_ha_lab`. Returns what was stopped."""
    stopped = leftovers.stop_ha_lab(lab_dir)
    if unregister_entry:
        registry.unregister(lab_dir.resolve())
    return stopped
