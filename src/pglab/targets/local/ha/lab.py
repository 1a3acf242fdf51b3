"""The HA lab: N PostgreSQL instances run by Patroni, with one etcd as the DCS, all on this host.

Where LocalLab (cluster.py) wires streaming replication by hand, here Patroni owns each instance: it bootstraps the
first one, clones the others, manages ``synchronous_standby_names`` (quorum ``ANY k`` or priority), and fails over
when the leader's lock in etcd expires. pglab starts etcd and the Patroni processes, waits for a leader and
streaming replicas, and can switch over, kill a primary and watch the election.

Layout of a lab directory (owned by pglab; the servers' parts owned by the server user when root):

    <lab>/secrets/pgpass        client credentials (0600, owner: the user running pglab)
    <lab>/server/               Patroni's pgpass files (0700, owner: the server user)
    <lab>/client/pgpass         as root, pgbench's credentials (0600, owner: the plan user pglab-run; the folder
                                root's, 0711)
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
import json
import os
import secrets
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

import yaml
from psycopg.conninfo import make_conninfo

from pglab.errors import LabError, UserError
from pglab.plan.schema import LocalTarget
from pglab.targets.base import Endpoint, Endpoints
from pglab.targets.local import cgroups, leftovers, procs, registry
from pglab.targets.local.cluster import DBNAME, SUPERUSER
from pglab.targets.local.ha import config, restore
from pglab.targets.local.ha.config import NAMESPACE, TIMINGS, check_timings
from pglab.targets.local.ha.faults import Faults
from pglab.targets.local.ha.membership import OPENER
from pglab.targets.local.ha.node import HOST, HANode, Log, Proc
from pglab.targets.local.ha.processes import Adopted, find_etcd, find_patroni, free_ports
from pglab.targets.local.ha.settings import Settings
from pglab.targets.local.postgres_bin import ServerUser, find_bindir, resolve_server_user
from pglab.targets.local.removal import remove_tree
from pglab.targets.local.toxiproxy import ToxiproxyServer, find_toxiproxy


class HALab(Faults, Settings):
    """Patroni + etcd on this host, from a ``target.local`` spec. ``start()``, then faults, then ``teardown()``.

    Composed of its parts: membership (REST API reads), processes (etcd and Patroni), faults, settings; what is
    left here builds the lab, attaches to one, adds and removes nodes, and tears it down."""

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

    # ---------------------------------------------------------------- helpers
    def _write_private(self, path: Path, text: str, server: bool) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if server:
            self._chown(path)

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
        ports = free_ports(2 * spec.instances + 2)
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
        return config.dcs_config(self.timings, self.spec.synchronous, len(self.nodes), parameters)

    def _patroni_config(self, node: HANode, passwords: dict[str, str], parameters: dict[str, Any]) -> dict[str, Any]:
        assert self.lab_dir is not None
        return config.patroni_config(
            node, scope=self.name, lab_dir=self.lab_dir, etcd_port=self.etcd_port, bindir=self.bindir,
            connect_port=self.proxy_ports.get(node.name, node.port), passwords=passwords,
            dcs=self._dcs_config(parameters), restore=self.restore_from is not None and node is self.nodes[0])

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
        port, rest_port = free_ports(2)
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
            with OPENER.open(req, timeout=10) as resp:
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
                remove_tree(d)
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
        assert self.lab_dir is not None
        self.restored_system_id = restore.stage_backup(backup, self.lab_dir, self.nodes[0], self.server_user)

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

    def endpoints(self) -> Endpoints:
        """The current leader as primary and the other live nodes as standbys (unix sockets)."""
        assert self.lab_dir is not None
        leader, sock = self.primary().name, str(self.lab_dir / "sock")

        def ep(n: HANode, role: str) -> Endpoint:
            return Endpoint(n.name, role, sock, n.port, SUPERUSER, DBNAME, self.client_passfile)

        return Endpoints(ep(self._node(leader), "primary"),
                         [ep(n, "standby") for n in self.nodes if n.name != leader and n.name not in self.killed])

    def logs(self) -> dict[str, Path]:
        """etcd's, each Patroni's and each PostgreSQL's log (kept by a runner as artifacts)."""
        assert self.lab_dir is not None
        paths = {"etcd": self.lab_dir / "logs" / "etcd.log"}
        for n in self.nodes:
            paths[f"patroni-{n.name}"] = n.log
            paths[n.name] = n.pg_log
        return {k: p for k, p in paths.items() if p.is_file()}

    # ---------------------------------------------------------------- teardown
    def teardown(self, keep: bool = False) -> None:
        """Stop everything and remove what the lab created (``keep``: leave it running, marked kept)."""
        if keep:
            if self.lab_dir:
                registry.mark_kept(self.lab_dir)
                self.log(f"HA lab kept running in {self.lab_dir} (remove it with: pglab lab clean {self.lab_dir})")
                for line in self.connect_lines():
                    self.log(line)
            return
        self.stop(graceful=False)  # its files go next: a clean shutdown would only cost seconds
        self._remove_what_was_made()  # every process of the lab is gone now


def clean_ha_lab(lab_dir: Path, unregister_entry: bool = True) -> list[str]:
    """Stop what an HA lab left running (kept, or left behind by a pglab that was killed) and remove it (and its
    registry entry unless told not to); see :func:`leftovers.stop_ha_lab`. Returns what was stopped."""
    stopped = leftovers.stop_ha_lab(lab_dir)
    if unregister_entry:
        registry.unregister(lab_dir.resolve())
    return stopped
