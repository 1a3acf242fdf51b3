"""The HA lab: N PostgreSQL instances run by Patroni, with one etcd as the DCS, all on this host.

Where LocalLab (cluster.py) wires streaming replication by hand, here Patroni owns each instance: it bootstraps the
first one, clones the others, manages ``synchronous_standby_names`` (quorum ``ANY k`` or priority), and fails over
when the leader's lock in etcd expires. pglab starts etcd and the Patroni processes, waits for a leader and
streaming replicas, and can switch over, kill a primary and watch the election.

Layout of a lab directory: the plain lab's (cluster.py: secrets/, client/, sock/, n0/data and n0/wal, logs/n0.log,
lab.json, owned alike), with:

    <lab>/server/               Patroni's pgpass files (0700, owner: the server user)
    <lab>/etcd/                 etcd's data directory
    <lab>/n0/patroni.yml        n0's Patroni configuration (0600: it holds the passwords)
    <lab>/toxiproxy/            Toxiproxy's working directory, when the plan shapes the replication links
    <lab>/logs/etcd.log  <lab>/logs/patroni-n0.log  <lab>/logs/toxiproxy.log
    <lab>/lab.json              its ``nodes`` have a plain lab's fields; ``kind: ha`` tells leftovers.stop_lab it is HA

Limits, pgbench's own group, the CPU step and shaped links work as on the plain lab, each node's group holding its
Patroni and all it starts (:meth:`_start_proxies` for the links): docs/methodology.md, "Limits, the client's group,
the CPU loop and shaped links on the Patroni lab".

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
import os
import secrets
import signal
import time
from pathlib import Path
from typing import IO, Any

import yaml
from psycopg.conninfo import make_conninfo

from pglab.errors import LabError, UserError
from pglab.plan.schema import LocalTarget
from pglab.targets.base import Endpoint, Endpoints
from pglab.targets.local import leftovers, procs, registry
from pglab.targets.local.ha import config, restore
from pglab.targets.local.ha.config import TIMINGS, check_timings
from pglab.targets.local.ha.faults import Faults
from pglab.targets.local.ha.membership import Membership
from pglab.targets.local.ha.node import HOST, HANode, Log
from pglab.targets.local.ha.processes import Adopted, Etcd, Patronis, find_etcd, find_patroni
from pglab.targets.local.ha.settings import Settings
from pglab.targets.local.pgconf import DBNAME, SUPERUSER
from pglab.targets.local.ports import free_ports
from pglab.targets.local.removal import remove_tree
from pglab.targets.local.toxiproxy import find_toxiproxy


class HALab(Membership):
    """Patroni + etcd on this host, from a ``target.local`` spec. ``start()``, then faults, then ``teardown()``.

    Composed, as Patroni's ``Postgresql`` composes its handlers: on its core (the state and the cluster's
    membership, membership.py) it holds its parts, each given only what it needs, and callers talk to them:
    ``dcs`` (etcd), ``patroni`` (the Patroni processes), ``faults``, ``settings``. What is left here builds the
    lab, attaches to one, adds and removes nodes, and stops it."""

    def __init__(self, spec: LocalTarget, base_dir: Path, log: Log = lambda _m: None,
                 timings: dict[str, int] | None = None):
        self.timings = {**TIMINGS, **(timings or {})}
        check_timings(self.timings)
        super().__init__(spec, base_dir, log)
        self.dcs = Etcd(self, find_etcd())
        self.patroni = Patronis(self, find_patroni())
        self.faults = Faults(self, self.patroni)
        self.settings = Settings(self)
        self.toxiproxy_bin = find_toxiproxy() if spec.network is not None else None
        self.parameters: dict[str, Any] = {}
        self.restore_from: Path | None = None  # a base backup the first node starts from instead of initdb
        self.restored_system_id: int | None = None
        self.killed: set[str] = set()  # nodes whose Patroni was killed (not restarted)
        self._logs: list[IO[bytes]] = []
        self._rest_auth = ""
        self.build_seconds: float | None = None

    # ---------------------------------------------------------------- replication links (Toxiproxy)
    def _start_proxies(self) -> None:
        """One Toxiproxy proxy in front of each node's postgres, when the plan shapes the network. Each node
        advertises its proxy as its ``postgresql.connect_address``, the address Patroni gives replicas for their
        ``primary_conninfo`` (and uses for pg_basebackup and pg_rewind): every replica → leader link crosses the
        leader's proxy, whichever node leads. Clients use the real ports and the unix sockets, never a proxy."""
        if self.spec.network is None:
            return
        assert self.lab_dir is not None
        self.links.start(self.lab_dir, {n.name: n.port for n in self.nodes}, self.toxiproxy_bin)

    # ---------------------------------------------------------------- build
    def _prepare_dirs(self) -> None:
        lab, data_base, wal_base = self._make_lab_dir("pglab-ha-", "etcd")
        ports = free_ports(2 * self.spec.instances + 2)
        self.dcs.port, self.dcs.peer_port = ports[-2:]
        self.nodes = []
        for i in range(self.spec.instances):
            name = f"n{i}"
            data, wal = data_base / name / "data", wal_base / name / "wal"
            self._make_node_dirs(data, wal, lab / name)
            self.nodes.append(HANode(name, data, wal, ports[2 * i], ports[2 * i + 1], lab / name / "patroni.yml",
                                     lab / "logs" / f"patroni-{name}.log", lab / "logs" / f"{name}.log"))

    def _state(self) -> dict[str, Any]:
        return {
            "kind": "ha",
            "scope": self.name,
            # what HALab.attach needs to act on the lab from another pglab process
            "spec": self.spec.model_dump(mode="json"), "base_dir": str(self.base_dir),
            "parameters": self.parameters, "timings": self.timings, "etcd": self.dcs.state(),
            "nodes": [{"name": n.name, "data": str(n.data), "wal": str(n.wal), "port": n.port,
                       "rest_port": n.rest_port, "config": str(n.config),
                       "patroni_pid": n.proc.pid if n.proc else None, "pid": n.postmaster_pid()}
                      for n in self.nodes],
        }

    def _patroni_config(self, node: HANode, passwords: dict[str, str], parameters: dict[str, Any]) -> dict[str, Any]:
        assert self.lab_dir is not None
        return config.patroni_config(
            node, scope=self.name, lab_dir=self.lab_dir, etcd_port=self.dcs.port, bindir=self.bindir,
            connect_port=self.links.ports.get(node.name, node.port), passwords=passwords,
            dcs=config.dcs_config(self.timings, self.spec.synchronous, len(self.nodes), parameters),
            restore=self.restore_from is not None and node is self.nodes[0])

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
                self.settings.normalized(parameters)  # refuse invalid ones before anything runs
            self.parameters = dict(parameters or {})
            passwords = {k: secrets.token_urlsafe(24) for k in ("superuser", "replication", "rest")}
            self._rest_auth = "Basic " + base64.b64encode(f"{SUPERUSER}:{passwords['rest']}".encode()).decode()
            self._write_private(self.client_passfile, f"*:*:*:{SUPERUSER}:{passwords['superuser']}\n", server=False)
            self._write_private(self.lab_dir / "secrets" / "rest-auth", self._rest_auth + "\n", server=False)
            if self.restore_from is not None:
                self.restored_system_id = restore.stage_backup(self.restore_from, self.lab_dir, self.nodes[0],
                                                               self.server_user)
            self._make_groups()
            self._write_state()
            self._start_proxies()  # before the configurations: each names its node's proxy
            self.dcs.start(deadline)  # first: its port, if it had to move, goes into every patroni.yml
            for node in self.nodes:
                cfg = self._patroni_config(node, passwords, self.parameters)
                self._write_private(node.config, yaml.safe_dump(cfg, sort_keys=False), server=True)
            first = self.nodes[0]
            how = f"restore of {self.restore_from}" if self.restore_from is not None else "initdb"
            self.log(f"patroni {first.name}: bootstrap ({how}, data {first.data}, WAL {first.wal})")
            self.patroni.start(first)
            self._wait(lambda: self._leader_running(first.name), deadline, f"{first.name} to bootstrap as leader")
            with self.connect(first.name, dbname="postgres") as conn:  # a restored backup may hold it already
                if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DBNAME]).fetchone() is None:
                    conn.execute(f"CREATE DATABASE {DBNAME}")
            for node in self.nodes[1:]:
                self.log(f"patroni {node.name}: replica (pg_basebackup from {first.name})")
                self.patroni.start(node)
            self.wait_ready(max(1.0, deadline - time.monotonic()))
            self.links.shape()  # once every replica streams: the clones copy at loopback speed
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
        state = leftovers.read_state(lab_dir)
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
        lab.dcs.port, lab.dcs.peer_port = int(etcd["client_port"]), int(etcd["peer_port"])
        if etcd.get("pid"):
            lab.dcs.proc = Adopted(int(etcd["pid"]), str(lab_dir / "etcd"))
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
        self._make_node_dirs(data, wal, self.lab_dir / name)
        port, rest_port = free_ports(2)
        node = HANode(name, data, wal, port, rest_port, self.lab_dir / name / "patroni.yml",
                      self.lab_dir / "logs" / f"patroni-{name}.log", self.lab_dir / "logs" / f"{name}.log")
        if self.limits.groups:
            self.limits.add(node, self.cpus)
        if (toxiproxy := self.links.toxiproxy) is not None:
            self.links.ports[name] = toxiproxy.create_proxy(name, port)
            self.links.shape([name])
        cfg = self._patroni_config(node, self._passwords(), self.parameters)
        self._write_private(node.config, yaml.safe_dump(cfg, sort_keys=False), server=True)
        self.nodes.append(node)
        self.log(f"patroni {name}: replica (pg_basebackup from the leader)")
        self.patroni.start(node)
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
            self.patroni.stop([node], timeout)
        pid = node.postmaster_pid()
        if pid is not None:  # Patroni was gone, or did not stop it in time
            procs.stop_postmaster(pid)
        self.dcs.forget(name)
        self.nodes.remove(node)
        self.killed.discard(name)
        self.settings.drop_member_slot(name)
        if self.links.toxiproxy is not None and self.links.ports.pop(name, None) is not None:
            self.links.toxiproxy.delete_proxy(name)
        self.limits.drop(name)
        for d in dict.fromkeys((self.lab_dir / name, node.data.parent, node.wal.parent)):
            if d.name == name:  # the node's own folder under the lab or a data/WAL base, never a base itself
                remove_tree(d)
        self._write_state()
        self.log(f"node {name} removed")

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
        leader, sock = self.primary().name, str(self.sock_dir)

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

    # ---------------------------------------------------------------- stopping
    def _roll(self, timeout: float) -> None:
        self.settings.rolling_restart(timeout)

    def _stop_all(self) -> None:
        self.stop(graceful=False)  # its files go next: a clean shutdown would only cost seconds

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
            for group in ([n for n in self.nodes if n.name != leader], [n for n in self.nodes if n.name == leader]):
                self.patroni.stop(group, timeout)
        else:
            self.patroni.kill()
        for node in self.nodes:  # a postgres whose Patroni is gone would otherwise run on
            pid = node.postmaster_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGQUIT)  # immediate shutdown: the postmaster takes its children down
        for node in self.nodes:
            if (pid := node.postmaster_pid()) is not None:
                procs.stop_postmaster(pid, signalled=True)  # all were signalled at once above
        self.dcs.stop()
        self.links.stop()
        if self.lab_dir is not None:
            leftovers.sweep([self.lab_dir, *[d for d in self._created_dirs if not d.is_relative_to(self.lab_dir)]])
        for f in self._logs:
            f.close()
        self._logs.clear()

    def pids(self) -> dict[str, int]:
        """Every lab daemon now running: etcd, each Patroni, each postmaster."""
        out: dict[str, int] = {}
        if self.dcs.proc is not None and self.dcs.proc.poll() is None:
            out["etcd"] = self.dcs.proc.pid
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                out[f"patroni-{n.name}"] = n.proc.pid
            if (p := n.postmaster_pid()) is not None:
                out[f"postgres-{n.name}"] = p
        return out


def clean_ha_lab(lab_dir: Path) -> list[str]:
    """Stop what an HA lab left running (kept, or left behind by a pglab that was killed) and remove it and its
    registry entry; see :func:`leftovers.stop_ha_lab`. Returns what was stopped."""
    stopped = leftovers.stop_ha_lab(lab_dir)
    registry.unregister(lab_dir.resolve())
    return stopped
