"""The embedded local lab: a primary plus streaming standbys built from the system's PostgreSQL.

Layout of a lab directory (owned by pglab; the servers' parts owned by the server user when root):

    <lab>/secrets/pgpass        client credentials (0600, owner: the user running pglab)
    <lab>/server/pgpass         replication credentials (0600, owner: the server user)
    <lab>/client/pgpass         as root, pgbench's credentials (0600, owner: the plan user pglab-run; the folder
                                root's, 0711)
    <lab>/sock/                 unix sockets of every instance
    <lab>/n0/data  <lab>/n0/wal primary (data and WAL bases can be moved elsewhere by the plan)
    <lab>/n1/...                standbys, built with pg_basebackup -R
    <lab>/logs/n0.log           server logs
    <lab>/lab.json              what runs where (pids, ports), so a lab left behind can be found and cleaned

This module is the lab's process lifecycle (build, start, stop, repair, restart) and its Target protocol; it is
composed with its configuration (``conf``, pgconf.py) and its dataset (``dataset``, lab_dataset.py).
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg

from pglab import interrupts
from pglab.errors import LabError, LabUnsound, UserError
from pglab.plan.schema import Dataset, LocalTarget
from pglab.targets.base import Endpoint, Endpoints
from pglab.targets.local import leftovers, procs, registry
from pglab.targets.local.cgroups import cgroup_name as cgroup_name  # tests import it from here
from pglab.targets.local.lab_base import LabBase
from pglab.targets.local.lab_dataset import LabDataset
from pglab.targets.local.pgconf import DBNAME, SUPERUSER, Configuration, Node
from pglab.targets.local.ports import free_port
from pglab.targets.local.procs import kill_tree as kill_tree  # tests import it from here

FULL_FREE_BYTES = 16 << 20  # less than one WAL segment free: the servers cannot go on writing there
TOXIPROXY_ANSWER_S = 2.0  # Toxiproxy's API answers in milliseconds; silent this long, it is frozen or hung
Log = Callable[[str], None]


class LocalLab(LabBase[Node]):
    """Implements the Target protocol on this host: streaming replication run by pglab itself (pg_ctl)."""

    def __init__(self, spec: LocalTarget, base_dir: Path, log: Log = lambda _m: None, dataset: Dataset | None = None):
        """``dataset``: load it on the primary alone while building the lab, snapshot it and make the standbys
        from the snapshot (then :meth:`reset_dataset` can put it back); without it the lab is built empty."""
        self.conf = Configuration(self)
        self.dataset = LabDataset(self, dataset)  # first: a bad PGLAB_CACHE_SIZE is said before anything is looked up
        super().__init__(spec, base_dir, log)
        self._started = False

    # ---------------------------------------------------------------- helpers
    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C", HOME=str(self.lab_dir), PGPASSFILE=str(self._server_passfile))
        return env

    def _bin(self, name: str) -> str:
        return str(self.bindir / name)

    @property
    def _server_passfile(self) -> Path:
        assert self.lab_dir is not None
        return self.lab_dir / "server" / "pgpass"

    # ---------------------------------------------------------------- limits (cgroups)
    def _roll(self, timeout: float) -> None:
        self.restart()  # standbys first, then the primary, waiting until all stream again

    def _enter_group(self, node: Node) -> None:
        group = self.limits.groups.get(node.name)
        pid = node.postmaster_pid()
        if group is not None and pid is not None:
            group.add_tree(pid)

    # ---------------------------------------------------------------- lifecycle
    all_standbys_stream = True  # every standby streams between runs: one not connected is behind, not gone

    def provision(self, parameters: dict[str, Any]) -> Endpoints:
        if not self._started:
            self.conf.wanted = dict(parameters)  # in force from the restart after the load: no second restart
            self._create()
        elif restarted := self._repair_or_stop():
            self.log(f"restarted {', '.join(restarted)} (found not running)")
            self._events.append((time.time(), "repair", f"restarted {', '.join(restarted)} (found not running)"))
        self._apply(parameters)
        return self.endpoints()

    def endpoints(self) -> Endpoints:
        return self.endpoints_of(self.nodes)

    def endpoints_of(self, nodes: list[Node]) -> Endpoints:
        def ep(n: Node) -> Endpoint:
            return Endpoint(n.name, n.role, str(self.sock_dir), n.port, SUPERUSER, DBNAME, self.client_passfile)

        return Endpoints(ep(nodes[0]), [ep(n) for n in nodes[1:]])

    def _prepare_dirs(self) -> None:
        lab, data_base, wal_base = self._make_lab_dir("pglab-lab-")
        self.nodes = []
        for i in range(self.spec.instances):
            name = f"n{i}"
            data, wal = data_base / name / "data", wal_base / name / "wal"
            self._make_node_dirs(data, wal)
            self.nodes.append(Node(name, "primary" if i == 0 else "standby", data, wal, free_port(),
                                   lab / "logs" / f"{name}.log"))

    def _write_secrets(self, password: str | None = None) -> str:
        """The superuser's password in the client's and the server user's pgpass: a new one, or the one of the
        dataset cache's entry the cluster is restored from (its clusters all have that superuser password)."""
        password = password or secrets.token_urlsafe(24)
        for path in (self.client_passfile, self._server_passfile):
            self._write_private(path, f"*:*:*:{SUPERUSER}:{password}\n", server=path == self._server_passfile)
        return password

    def _create(self) -> None:
        self._prepare_dirs()
        assert self.lab_dir is not None
        registry.register(self.lab_dir, [d for d in self._created_dirs if not d.is_relative_to(self.lab_dir)])
        self._make_groups()
        cached = self.dataset.lookup()
        password = self.dataset.password = self._write_secrets(cached.password if cached else None)
        self._write_state()
        primary = self.nodes[0]
        if cached is not None:
            self.dataset.restore_cached(primary, cached)
        else:
            self._initdb(primary, password)
        self.conf.write(primary)
        self._started = True  # from here on, teardown has something to stop
        if self.dataset.spec is not None and cached is None:
            self.dataset.load_alone(primary)
        self._start(primary, may_move=True)
        if self.dataset.spec is None:
            with self.connect(primary, dbname="postgres") as conn:
                conn.execute(f"CREATE DATABASE {DBNAME}")
        self._start_proxies()
        if self.dataset.snapshot is not None:
            self.dataset.standbys_from_snapshot()
        else:
            self._standbys_by_basebackup()
        self.conf.sync_enabled = True
        self.conf.write(primary)
        with self.connect(primary) as conn:
            conn.execute("SELECT pg_reload_conf()")
        self.wait_streaming()
        self.links.shape()

    def _initdb(self, primary: Node, password: str) -> None:
        assert self.lab_dir is not None
        self.log(f"initdb {primary.name} (data {primary.data}, WAL {primary.wal})")
        pwfile = self.lab_dir / "server" / "initdb.pw"
        self._write_private(pwfile, password + "\n", server=True)
        try:
            self._run([self._bin("initdb"), "-D", str(primary.data), "--waldir", str(primary.wal),
                       "-U", SUPERUSER, f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8",
                       "--locale=C", "--no-sync", "--no-instructions"])
        except LabError as exc:
            wal_full = str(primary.wal) in str(exc) and self.spec.paths.wal
            raise self._no_space(exc, "initdb", "target.local.paths.wal" if wal_full else "target.local.paths.data",
                                 primary.wal.parent if wal_full else primary.data.parent) from None
        finally:
            pwfile.unlink(missing_ok=True)
        with open(primary.data / "postgresql.conf", "a") as f:
            f.write("\ninclude = 'pglab.conf'\n")
        (primary.data / "pg_hba.conf").write_text(
            "# written by pglab: loopback and unix sockets only, passwords never in clear\n"
            f"local all {SUPERUSER} scram-sha-256\n"
            f"host all {SUPERUSER} 127.0.0.1/32 scram-sha-256\n"
            f"local replication {SUPERUSER} scram-sha-256\n"
            f"host replication {SUPERUSER} 127.0.0.1/32 scram-sha-256\n"
        )

    def _replication_conninfo(self, node: Node) -> str:
        """How a standby reaches the primary: through its Toxiproxy proxy when the plan shapes the links."""
        port = self.links.ports.get(node.name, self.nodes[0].port)
        return (f"host=127.0.0.1 port={port} user={SUPERUSER} passfile={self._server_passfile} "
                f"application_name={node.name}")

    def _standbys_by_basebackup(self) -> None:
        primary = self.nodes[0]
        for node in self.nodes[1:]:
            self.log(f"pg_basebackup {node.name} from {primary.name}")
            # through the node's proxy (not shaped yet), so that -R writes the proxy into primary_conninfo
            try:
                self._run([self._bin("pg_basebackup"), "-D", str(node.data), "--waldir", str(node.wal), "-R",
                           "-X", "stream", "-C", "-S", node.name, "-c", "fast", "--no-sync",
                           "-d", self._replication_conninfo(node)])
            except LabError as exc:
                raise self._no_space(exc, f"pg_basebackup of {node.name}", "target.local.paths.data",
                                     node.data.parent) from None
            self.conf.write(node)
            self._start(node, may_move=True)

    def reset_dataset(self) -> dict[str, Any]:
        return self.dataset.reset()

    def _start_proxies(self) -> None:
        """One Toxiproxy proxy per standby in front of the primary, when the plan shapes the network."""
        net = self.spec.network
        if net is None or len(self.nodes) < 2:
            return
        assert self.lab_dir is not None
        self.links.start(self.lab_dir, {n.name: self.nodes[0].port for n in self.nodes[1:]})

    def _pg_ctl(self, node: Node, *args: str, timeout: float = 120) -> None:
        """pg_ctl on ``node``; a start that fails says why in PostgreSQL's words (its FATAL line) and where its log
        is, instead of pg_ctl's "Examine the log output"."""
        try:
            before = node.log.stat().st_size
        except OSError:
            before = 0
        try:
            self._run([self._bin("pg_ctl"), "-D", str(node.data), "-w", "-t", str(int(timeout)), *args],
                      timeout=timeout + 10)
        except LabError:
            if args[-1] not in ("start", "restart"):
                raise
            fatal = self.fatal_line(node, since=before)
            if fatal is None:
                raise
            raise LabError(f"{node.name} did not {args[-1]}: PostgreSQL says \"{fatal}\" (server log: {node.log})"
                           ) from None

    def fatal_line(self, node: Node, since: int = 0) -> str | None:
        """The last FATAL or PANIC line of ``node``'s log written after byte ``since``, without its timestamp and
        pid: why a start failed (an older start's lines are not this one's cause)."""
        try:
            with node.log.open("rb") as f:
                f.seek(since)
                lines = f.read().decode(errors="replace").splitlines()[-50:]
        except OSError:
            return None
        found = [re.sub(r"^.*?\b(FATAL|PANIC):\s+", r"\1:  ", line) for line in lines
                 if re.search(r"\b(FATAL|PANIC):", line)]
        return found[-1].strip() if found else None

    def _start(self, node: Node, may_move: bool = False) -> None:
        """Start a server. On its first start (``may_move``), a port taken meanwhile by another program (the
        port was free when chosen) moves the node to another free port instead of failing."""
        for _attempt in range(5):
            try:
                self._pg_ctl(node, "-l", str(node.log), "start")
                self._enter_group(node)
                break
            except LabError as exc:
                tail = self.log_tail(node)
                if may_move and "Address already in use" in self.log_tail(node, 12):
                    taken, node.port = node.port, free_port()
                    self.log(f"port {taken} is taken by another program; {node.name} moves to port {node.port}")
                    self.conf.write(node)
                    continue
                if "PostgreSQL says" in str(exc):
                    raise
                raise LabError(f"{node.name} did not start: {exc}; server log: {tail}") from None
        else:
            raise LabError(f"{node.name} did not start: every port tried was taken")
        self._write_state()

    def _no_space(self, exc: LabError, what: str, field: str, path: Path) -> Exception:
        """A full disk during the build is the user's to fix: say which path, not a program's stack of errors."""
        if "No space left on device" in str(exc):
            given = self.spec.paths.wal if field.endswith(".wal") else self.spec.paths.data
            path = self._abs(given) if given else (self.lab_dir or path)
            return UserError(f"{field}: no space left on the device of '{path}' during {what}; free some space "
                             "there or choose another path.")
        return exc

    def log_tail(self, node: Node, lines: int = 3) -> str:
        return self._tail(node.log, lines)

    def connect(self, node: Node, dbname: str = DBNAME, **kwargs: Any) -> psycopg.Connection[Any]:
        """pglab's own session on an instance: short statements only, so bounded (docs/reliability.md)."""
        kwargs.setdefault("options", "-c lock_timeout=30s -c statement_timeout=300s")
        return psycopg.connect(
            host=str(self.sock_dir), port=node.port, user=SUPERUSER, dbname=dbname,
            passfile=str(self.client_passfile), autocommit=True, connect_timeout=10,
            application_name="pglab-control", **kwargs,
        )

    def wait_streaming(self, timeout: float = 60) -> None:
        """Wait until every standby streams from the primary with the expected sync state."""
        standbys = {n.name for n in self.nodes[1:]}
        if not standbys:
            return
        want = {"any": "quorum", "first": "sync"}[self.spec.synchronous.method] if self.spec.synchronous else "async"
        deadline = time.monotonic() + timeout
        seen: dict[str, tuple[str, str]] = {}
        while time.monotonic() < deadline:
            with self.connect(self.nodes[0]) as conn:
                rows = conn.execute("SELECT application_name, state, sync_state FROM pg_stat_replication").fetchall()
            seen = {r[0]: (r[1], r[2]) for r in rows}
            ok = all(seen.get(s, ("", ""))[0] == "streaming" for s in standbys)
            if ok and (want != "sync" or any(v[1] == "sync" for v in seen.values())):
                if want == "quorum" and not all(seen[s][1] == "quorum" for s in standbys):
                    interrupts.sleep(0.2)
                    continue
                return
            interrupts.sleep(0.2)
        raise LabError(f"standbys not streaming after {timeout:.0f} s: {seen or 'none connected'}")

    # ---------------------------------------------------------------- settings
    def _apply(self, parameters: dict[str, Any]) -> None:
        """Put the parameters in force: reload, and restart (standbys first) when PostgreSQL asks for it."""
        if parameters == self.conf.parameters:
            return
        self.conf.validate(parameters)
        self.conf.parameters = dict(parameters)
        for node in self.nodes:
            self.conf.write(node)

        def reload(node: Node) -> None:
            with self.connect(node) as conn:
                conn.execute("SELECT pg_reload_conf()")

        # side by side: each is a connection's round trips (a plan that changes synchronous_commit between points
        # reloads before nearly every run); the first failure is raised once every reload has returned
        with ThreadPoolExecutor(max_workers=len(self.nodes), thread_name_prefix="lab-reload") as pool:
            list(pool.map(reload, self.nodes))
        with self.connect(self.nodes[0]) as conn:
            pending = [r[0] for r in conn.execute("SELECT name FROM pg_settings WHERE pending_restart")]
        if pending:
            self.log(f"restart for {', '.join(sorted(pending))}")
            self.restart()

    def repair(self) -> list[str]:
        """Start again the instances found down (killed during a run): the primary first, through crash recovery,
        then the standbys, which reconnect and catch up; wait until they stream. Returns the names restarted."""
        proxies = self._repair_proxies()
        down = [n for n in self.nodes if n.postmaster_pid() is None]
        for node in down:
            self.start_instance(node.name)
        if down or proxies:
            self.wait_streaming()
        return proxies + [n.name for n in down]

    def _repair_or_stop(self) -> list[str]:
        """:meth:`repair`; a lab that cannot be repaired (a full disk, a broken data directory) stops the sweep in
        one sentence instead of failing every run left the same way."""
        if full := self._full_filesystems():
            raise LabUnsound(f"no space left for the lab's servers: {', '.join(full)}; free some there, then resume "
                             "with the same pglab run and --results")
        try:
            return self.repair()
        except LabError as exc:
            raise LabUnsound(f"{str(exc).strip()}; the lab cannot run the next point: fix what the server log says, "
                             "then resume with the same pglab run and --results") from None

    def _repair_proxies(self) -> list[str]:
        """Toxiproxy found dead: started again with every proxy on its former port (the standbys' primary_conninfo
        names it) and the plan's shaping, so the standbys reconnect through the same links. One alive that does not
        answer (frozen, hung) is ended first: pglab owns it, and nothing else would bring the links back."""
        if (old := self.links.toxiproxy) is None:
            return []
        if old.running():
            if old.answers(TOXIPROXY_ANSWER_S):
                return []
            self.log(f"ended Toxiproxy, which did not answer its API (twice {TOXIPROXY_ANSWER_S:g} s)")
            self._events.append((time.time(), "repair", "ended Toxiproxy (its API did not answer)"))
        assert self.lab_dir is not None
        old.stop()  # reaps it (a frozen one too: SIGTERM and SIGCONT, then SIGKILL after 5 s)
        self.links.start(self.lab_dir, dict.fromkeys(self.links.ports, self.nodes[0].port))
        self.links.shape()
        return ["Toxiproxy"]

    def restart(self) -> None:
        """Rolling restart: standbys first, then the primary; wait until streaming again."""
        for node in [*self.nodes[1:], self.nodes[0]]:
            try:
                self._pg_ctl(node, "-m", "fast", "-l", str(node.log), "restart")
                self._enter_group(node)
            except LabError as exc:
                if "PostgreSQL says" in str(exc):
                    raise
                raise LabError(f"{node.name} did not restart: {exc}; server log: {self.log_tail(node)}") from None
        self._write_state()
        self.wait_streaming()

    # ---------------------------------------------------------------- scenarios (scenarios/inject.py)
    def follow_endpoint(self) -> Endpoint:
        return self.endpoints().primary  # no failover here: the primary stays where it is

    def fail_primary(self, kill: str) -> tuple[str, float]:
        raise LabError("a failover needs target.local.ha: patroni")

    def wait_new_primary(self, old: str, since: float) -> str:
        raise LabError("a failover needs target.local.ha: patroni")

    def switchover(self) -> tuple[str, str]:
        raise LabError("a switchover needs target.local.ha: patroni")

    def kill_standby(self) -> str:
        """SIGKILL the last standby's postmaster (with quorum ANY k every standby is as synchronous as another)."""
        node = self.nodes[-1]
        if (pid := node.postmaster_pid()) is not None:
            kill_tree(pid)
        return node.name

    def start_instance(self, name: str) -> None:
        """Start a killed instance again (the primary through crash recovery; a standby reconnects)."""
        node = next(n for n in self.nodes if n.name == name)
        for attempt in range(20):  # the killed postmaster's backends may hold its shared memory for a moment
            try:
                self._start(node)
                return
            except LabError:
                if attempt == 19:
                    raise
                interrupts.sleep(0.5)

    def scratch_dir(self) -> Path:
        assert self.lab_dir is not None
        path = self.nodes[0].data.parent / "scratch"  # on the data device, as a backup to local disk would be
        path.mkdir(exist_ok=True)
        return path

    # ---------------------------------------------------------------- Target protocol
    def primary_name(self) -> str:
        return self.nodes[0].name  # no failover in this lab: the first node stays the primary

    def _full_filesystems(self) -> list[str]:
        """Each filesystem of the servers' data and WAL with less than FULL_FREE_BYTES free, as one of its folders
        and what is left: PostgreSQL fails there (a relation that cannot grow, a WAL segment that cannot be made,
        a PANIC), and a statvfs says why at once."""
        seen: set[int] = set()
        full = []
        for node in self.nodes:
            for path in (node.data, node.wal):
                try:
                    device, st = path.stat().st_dev, os.statvfs(path)
                except OSError:  # not made yet, or removed with its node: nothing to say about its space
                    continue
                if device in seen:
                    continue
                seen.add(device)
                if (free := st.f_bavail * st.f_frsize) < FULL_FREE_BYTES:
                    full.append(f"{path} ({free / (1 << 20):.1f} MiB free)")
        return full

    def health(self) -> str | None:
        down = [n.name for n in self.nodes if n.postmaster_pid() is None]
        problems = [f"instance(s) {', '.join(down)} not running"] if down else []
        if full := self._full_filesystems():
            problems.append(f"no space left for the lab's servers: {', '.join(full)}")
        if (toxiproxy := self.links.toxiproxy) is not None and not toxiproxy.running():
            problems.append("Toxiproxy, which carries the replication links, not running")
        elif toxiproxy is not None and not toxiproxy.answers(TOXIPROXY_ANSWER_S):
            problems.append(f"Toxiproxy, which carries the replication links, does not answer its API "
                            f"(twice {TOXIPROXY_ANSWER_S:g} s)")
        return "; ".join(problems) or None

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "local",
            "lab_dir": str(self.lab_dir),
            "bindir": str(self.bindir),
            "server_user": self.server_user.name if self.server_user else None,
            "synchronous_standby_names": self.conf.base(self.nodes[0]).get("synchronous_standby_names")
            if self.nodes else None,
            "nodes": [
                {"name": n.name, "role": n.role, "port": n.port, "data": str(n.data), "wal": str(n.wal),
                 **({"via_proxy_port": self.links.ports[n.name]} if n.name in self.links.ports else {})}
                for n in self.nodes
            ],
            "network": self.spec.network.model_dump() if self.spec.network else None,
            **({"dataset": self.dataset.info} if self.dataset.info else {}),
        }

    def _state(self) -> dict[str, Any]:
        return {"nodes": [{"name": n.name, "data": str(n.data), "wal": str(n.wal), "port": n.port,
                           "pid": n.postmaster_pid()} for n in self.nodes]}

    def stop_node(self, node: Node, discard: bool = False) -> None:
        """Stop a server: fast (a shutdown checkpoint), or at once when its files are about to be removed
        (``discard``: a checkpoint under a tenant's IOPS limit can take minutes and serves nothing)."""
        pid = node.postmaster_pid()
        if pid is None:
            return
        if discard and procs.stopped(pid):  # frozen: pg_ctl would wait its 30 s for nothing, twice
            kill_tree(pid)
            return
        for mode in ("immediate",) if discard else ("fast", "immediate"):
            try:
                self._pg_ctl(node, "-m", mode, "stop", timeout=30)
                return
            except LabError:
                continue
        kill_tree(pid)

    def server_logs(self) -> dict[str, Path]:
        """Each instance's server log (kept by the runner as artifacts before the lab is removed)."""
        return {n.name: n.log for n in self.nodes if n.log.is_file()}

    def _stop_all(self) -> None:
        """Every server stopped at once, side by side: each pg_ctl waits for its postmaster to go (0.1-0.25 s, most
        of it pg_ctl's 0.1 s polls), one after the other they were half a second of every sweep's teardown."""
        def stop(node: Node) -> None:
            try:
                self.stop_node(node, discard=True)
            except Exception as exc:  # teardown must go on with the others
                self.log(f"stopping {node.name}: {exc}")

        if len(self.nodes) > 1:
            with ThreadPoolExecutor(max_workers=len(self.nodes), thread_name_prefix="lab-stop") as pool:
                list(pool.map(stop, reversed(self.nodes)))
        else:
            for node in self.nodes:
                stop(node)
        self.links.stop()
        self.links.toxiproxy = None
        self.dataset.release()


def clean_lab(lab_dir: Path) -> list[str]:
    """Stop every server a lab directory's lab.json names, and any pgbench or fio still working on it, and remove
    the lab and its registry entry. Returns what was stopped.

    Used for labs kept with ``--keep``; labs left behind by a pglab that was killed are cleaned by the registry."""
    stopped = leftovers.stop_plain_lab(lab_dir)
    registry.unregister(lab_dir.resolve())
    return stopped
