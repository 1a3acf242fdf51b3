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
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import secrets
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from pglab import interrupts
from pglab.errors import LabError, LabUnsound, UserError
from pglab.plan.schema import Dataset, LocalTarget
from pglab.targets.base import Endpoint, Endpoints
from pglab.targets.local import cgroups, leftovers, procs, registry
from pglab.targets.local import dataset as datasets  # the fast load, copies and snapshots
from pglab.targets.local.cgroups import cgroup_name as cgroup_name  # tests import it from here
from pglab.targets.local.dataset import cache
from pglab.targets.local.lab_base import LabBase
from pglab.targets.local.postgres_bin import ServerUser, find_bindir, resolve_server_user
from pglab.targets.local.procs import kill_tree

SUPERUSER = "pglab"
DBNAME = "pglab"
FULL_FREE_BYTES = 16 << 20  # less than one WAL segment free: the servers cannot go on writing there
TOXIPROXY_ANSWER_S = 2.0  # Toxiproxy's API answers in milliseconds; silent this long, it is frozen or hung
Log = Callable[[str], None]


def conf_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int | float):
        return str(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "''") + "'"  # postgresql.conf escapes both


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Node:
    name: str
    role: str
    data: Path
    wal: Path
    port: int
    log: Path

    def postmaster_pid(self) -> int | None:
        return procs.postmaster_pid(self.data)  # a killed postmaster may linger unreaped as a zombie: not counted


class LocalLab(LabBase[Node]):
    """Implements the Target protocol on this host: streaming replication run by pglab itself (pg_ctl)."""

    def __init__(self, spec: LocalTarget, base_dir: Path, log: Log = lambda _m: None, dataset: Dataset | None = None):
        """``dataset``: load it on the primary alone while building the lab, snapshot it and make the standbys
        from the snapshot (then :meth:`reset_dataset` can put it back); without it the lab is built empty."""
        self.spec = spec
        self.dataset = dataset
        self.snapshot: datasets.Snapshot | None = None
        self.dataset_info: dict[str, Any] = {}
        self.log = log
        if dataset is not None and cache.enabled(dataset.cache):
            cache.max_bytes()  # a bad PGLAB_CACHE_SIZE stops the run here, before anything is made
        self.bindir = find_bindir(spec.bindir)
        self.server_user: ServerUser | None = resolve_server_user(spec.run_as)
        self.base_dir = base_dir
        self.lab_dir: Path | None = None
        self.nodes: list[Node] = []
        self.parameters: dict[str, Any] = {}
        self._created_dirs: list[Path] = []
        self._started = False
        self._sync_enabled = False  # set once the standbys stream, or the build itself would wait on them
        self.groups: dict[str, cgroups.Group] = {}  # per instance, when the plan gives resources
        self.client_group: cgroups.Group | None = None
        self.limits_problem: str | None = None  # why limits are not applied (limits: best-effort)
        self.cpus: float | None = spec.resources.cpus if spec.resources else None
        self._events: list[tuple[float, str, str]] = []
        self._wanted: dict[str, Any] = {}  # the parameters of the first provision
        self._accepted: set[str] = set()  # parameter sets postgres -C accepted (asked once each)
        self.toxiproxy: Any = None  # ToxiproxyServer when the plan shapes the replication links
        self._cache: cache.DatasetCache | None = None  # the dataset cache, when the dataset may come from it
        self._cache_key: cache.Key | None = None
        self._cache_lease: cache.Lease | None = None  # held while the lab may restore from the cache's entry
        self._cache_info: dict[str, Any] = {}
        self._password = ""
        self.proxy_ports: dict[str, int] = {}

    # ---------------------------------------------------------------- helpers
    def _server_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C", HOME=str(self.lab_dir), PGPASSFILE=str(self._server_passfile))
        return env

    def _run(self, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run a PostgreSQL program as the server user; raise LabError with its own message on failure. A safe point:
        a recorded Ctrl-C or SIGTERM kills the program (the teardown that follows stops what it started)."""
        kwargs: dict[str, Any] = self.server_user.popen_kwargs() if self.server_user else {}
        try:
            proc = interrupts.run(
                args, capture_output=True, text=True, timeout=timeout, env=self._server_env(),
                cwd=self.lab_dir, start_new_session=True, **kwargs,
            )
        except subprocess.TimeoutExpired:
            raise LabError(f"{Path(args[0]).name} did not finish within {timeout:.0f} s") from None
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            cause = [line for line in lines[:-3] if "No space left on device" in line][:1]  # the root cause first
            raise LabError(f"{Path(args[0]).name} failed: {' / '.join(cause + lines[-3:])}")
        return proc

    def _bin(self, name: str) -> str:
        return str(self.bindir / name)

    @property
    def _server_passfile(self) -> Path:
        assert self.lab_dir is not None
        return self.lab_dir / "server" / "pgpass"

    @property
    def sock_dir(self) -> Path:
        assert self.lab_dir is not None
        return self.lab_dir / "sock"

    # ---------------------------------------------------------------- limits (cgroups)
    def _roll(self, timeout: float) -> None:
        self.restart()  # standbys first, then the primary, waiting until all stream again

    def _enter_group(self, node: Node) -> None:
        group = self.groups.get(node.name)
        pid = node.postmaster_pid()
        if group is not None and pid is not None:
            group.add_tree(pid)

    # ---------------------------------------------------------------- lifecycle
    read_only = False  # pglab's own lab
    all_standbys_stream = True  # every standby streams between runs: one not connected is behind, not gone

    def preflight(self) -> None:
        """Binaries and the server user were checked on construction; paths are checked as they are created."""

    def provision(self, parameters: dict[str, Any]) -> Endpoints:
        if not self._started:
            self._wanted = dict(parameters)  # in force from the restart after the load: no second restart
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
        spec = self.spec
        if spec.paths.lab:
            lab = self._abs(spec.paths.lab)
            if lab.exists() and any(lab.iterdir()):
                raise UserError(f"target.local.paths.lab: '{lab}' is not empty; give an empty or new directory.")
            try:
                lab.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UserError(f"target.local.paths.lab: cannot create '{lab}' ({exc.strerror}).") from None
            self._created_dirs.append(lab)
        else:
            lab = Path(tempfile.mkdtemp(prefix="pglab-lab-"))
            self._created_dirs.append(lab)
        self.lab_dir = lab
        os.chmod(lab, 0o711)  # the server user must traverse it, nobody needs to list it
        self._check_traversable(lab, "target.local.paths.lab")
        (lab / "secrets").mkdir(mode=0o700)
        self._mkdir_server(lab / "server")
        self._mkdir_server(lab / "sock", 0o755)
        self._mkdir_server(lab / "logs", 0o755)

        data_base = self._abs(spec.paths.data) if spec.paths.data else lab
        wal_base = self._abs(spec.paths.wal) if spec.paths.wal else lab
        for field, base in (("data", data_base), ("wal", wal_base)):
            if base == lab:
                continue
            try:
                base.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UserError(f"target.local.paths.{field}: cannot create '{base}' ({exc.strerror}).") from None
            self._check_traversable(base, f"target.local.paths.{field}")
        self.nodes = []
        for i in range(spec.instances):
            name = f"n{i}"
            data = data_base / name / "data" if data_base != lab else lab / name / "data"
            wal = wal_base / name / "wal" if wal_base != lab else lab / name / "wal"
            for d in (data, wal):
                if d.exists():
                    raise UserError(f"'{d}' already exists; remove it or choose other target.local.paths.")
            for d in {data.parent, wal.parent}:
                if not d.exists():
                    self._mkdir_server(d)
                    self._created_dirs.append(d)
            port = free_port()
            self.nodes.append(Node(name, "primary" if i == 0 else "standby", data, wal, port,
                                   lab / "logs" / f"{name}.log"))

    def _write_secrets(self, password: str | None = None) -> str:
        """The superuser's password in the client's and the server user's pgpass: a new one, or the one of the
        dataset cache's entry the cluster is restored from (its clusters all have that superuser password)."""
        password = password or secrets.token_urlsafe(24)
        line = f"*:*:*:{SUPERUSER}:{password}\n"
        for path in (self.client_passfile, self._server_passfile):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(line)
        self._chown(self._server_passfile)
        return password

    def _create(self) -> None:
        self._prepare_dirs()
        assert self.lab_dir is not None
        registry.register(self.lab_dir, [d for d in self._created_dirs if not d.is_relative_to(self.lab_dir)])
        self._make_groups()
        cached = self._cache_lookup()
        password = self._password = self._write_secrets(cached.password if cached else None)
        self._write_state()
        primary = self.nodes[0]
        if cached is not None:
            self._restore_cached(primary, cached)
        else:
            self._initdb(primary, password)
        self._write_conf(primary)
        self._started = True  # from here on, teardown has something to stop
        if self.dataset is not None and cached is None:
            self._load_alone(primary)
        self._start(primary, may_move=True)
        if self.dataset is None:
            with self.connect(primary, dbname="postgres") as conn:
                conn.execute(f"CREATE DATABASE {DBNAME}")
        self._start_proxies()
        if self.snapshot is not None:
            self._standbys_from_snapshot()
        else:
            self._standbys_by_basebackup()
        self._sync_enabled = True
        self._write_conf(primary)
        with self.connect(primary) as conn:
            conn.execute("SELECT pg_reload_conf()")
        self.wait_streaming()
        self._shape_links()

    def _initdb(self, primary: Node, password: str) -> None:
        assert self.lab_dir is not None
        self.log(f"initdb {primary.name} (data {primary.data}, WAL {primary.wal})")
        pwfile = self.lab_dir / "server" / "initdb.pw"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        self._chown(pwfile)
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
        port = self.proxy_ports.get(node.name, self.nodes[0].port)
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
            self._write_conf(node)
            self._start(node, may_move=True)

    # ---------------------------------------------------------------- dataset: load once, snapshot, reset
    def _load_alone(self, primary: Node) -> None:
        """Load the dataset on the primary before any standby exists, with the settings that skip the WAL of the
        new tables; then restart it with the lab's settings (so the last checkpoint says wal_level=replica), stop it
        cleanly, make it durable and snapshot it. The standbys are then copies of the snapshot, not replays."""
        assert self.dataset is not None and self.lab_dir is not None
        ds = self.dataset
        r = self.spec.resources
        cores = max(1, min(os.cpu_count() or 1, math.ceil(self.cpus))) if self.cpus else None
        load = datasets.fast_load_settings(self.bindir, ds, cores=cores,
                                               memory_bytes=r.memory.bytes if r and r.memory else None)
        started = time.monotonic()
        self.parameters = dict(load.parameters)
        self._write_conf(primary)
        self._start(primary, may_move=True)
        with self.connect(primary, dbname="postgres") as conn:
            conn.execute(f"CREATE DATABASE {DBNAME}")
        self.log(f"loading the dataset on {primary.name} alone (scale {ds.scale}"
                 + (f", {ds.partitions} partitions" if ds.partitions else "") + ", wal_level=minimal)")
        out = self.lab_dir / "dataset"
        out.mkdir(exist_ok=True)
        try:
            report = datasets.fast_load(self.endpoints_of([primary]).primary, ds, load, out)
        except datasets.SnapshotError as exc:
            raise LabError(f"loading the dataset: {exc}; server log: {self.log_tail(primary)}") from None
        except psycopg.Error as exc:
            if "No space left on device" in str(exc):
                raise UserError(f"target.local.paths.data: no space left on the device of '{primary.data.parent}' "
                                f"while loading the dataset (scale {ds.scale}); free some space there, choose "
                                "another path or a smaller dataset.scale.") from None
            raise LabError(f"loading the dataset: {str(exc).strip()}; server log: {self.log_tail(primary)}") from None
        self._validate(self._wanted)
        self.parameters = dict(self._wanted)
        self._write_conf(primary)
        self._pg_ctl(primary, "-m", "fast", "-l", str(primary.log), "restart")
        self._pg_ctl(primary, "-m", "fast", "stop")
        t = time.monotonic()
        sync_s = datasets.sync_tree(primary.data, primary.wal) if not load.synced_by_server else 0.0
        if len(self.nodes) == 1 and ds.reset != "snapshot" and self._cache is None:  # no standby, no reset, no cache
            self.dataset_info = {"load_s": round(report.seconds, 2), "parallel": report.parallel,
                                 "sync_s": round(sync_s, 2), "total_s": round(time.monotonic() - started, 2)}
            self.log(f"dataset loaded in {report.seconds:.1f} s (no snapshot: a single instance without resets)")
            return
        try:
            stored = self._cache_store(primary)
            self.snapshot, copy = stored or datasets.snapshot(
                primary.data, primary.wal, primary.data.parent / "snapshot", bindir=self.bindir,
                wal_dest=primary.wal.parent / "snapshot-wal")
            if stored:
                self.snapshot = self._snapshot_for_resets(primary, self.snapshot)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise UserError(f"target.local.paths.data: no space left on the device of '{primary.data.parent}' "
                                "for the dataset's snapshot; free some space there or choose another path.") from None
            raise
        self.dataset_info = {
            "load_s": round(report.seconds, 2), "load_steps_s": {k: round(v, 2) for k, v in report.steps.items()},
            "parallel": report.parallel, "sync_s": round(sync_s, 2),
            "snapshot_s": round(time.monotonic() - t, 2), "snapshot_method": copy.method,
            "snapshot_bytes": copy.bytes, "total_s": round(time.monotonic() - started, 2),
            **({"cache": self._cache_info} if self._cache_info else {}),
        }
        self.log(f"dataset loaded in {report.seconds:.1f} s, snapshot taken in {time.monotonic() - t:.1f} s "
                 f"({copy.method}, {copy.bytes / 2**20:.0f} MiB)")

    # ---------------------------------------------------------------- dataset cache (dataset/cache.py)
    def _cache_lookup(self) -> cache.Entry | None:
        """The dataset cache's entry for this lab's dataset, leased until teardown; None on a miss (said why)."""
        ds = self.dataset
        if ds is None or not cache.enabled(ds.cache):
            return None
        t = time.monotonic()
        try:
            self._cache = cache.DatasetCache()
            self._cache_key = cache.make_key(
                self.bindir, scale=ds.scale, partitions=ds.partitions,
                owner_uid=self.server_user.uid if self.server_user else os.getuid(), parameters=self._wanted)
            found = self._cache.lookup(self._cache_key, self.bindir)
        except datasets.SnapshotError as exc:
            self.log(f"dataset cache not used: {exc}")
            self._cache = None
            return None
        if isinstance(found, str):
            self._cache_info = {"hit": False, "key": self._cache_key.name, "dir": str(self._cache.root),
                                "miss": found, "lookup_s": round(time.monotonic() - t, 3)}
            self.log(f"dataset cache: no entry to use for {self._cache_key.name} ({found}); loading")
            return None
        entry, self._cache_lease = found
        self._cache_info = {"lookup_s": round(time.monotonic() - t, 3)}  # the key, and the entry checked
        return entry

    def _restore_cached(self, primary: Node, entry: cache.Entry) -> None:
        """The primary is the cache's entry (instead of initdb and a load); the lab's snapshot is the entry."""
        assert self._cache is not None and self._cache_key is not None
        t = time.monotonic()
        try:
            self.snapshot = entry.snapshot
            copy = datasets.restore(self.snapshot, primary.data, primary.wal)
        except datasets.SnapshotError as exc:
            raise LabError(f"restoring the dataset from the cache ({entry.dir}): {exc}") from None
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise UserError(f"target.local.paths.data: no space left on the device of '{primary.data.parent}' "
                                "for the cached dataset; free some space there or choose another path.") from None
            raise
        seconds = time.monotonic() - t
        try:
            self.snapshot = self._snapshot_for_resets(primary, self.snapshot)
        except (datasets.SnapshotError, OSError) as exc:
            raise LabError(f"a snapshot beside {primary.name}: {exc}") from None
        self._validate(self._wanted)
        self.parameters = dict(self._wanted)
        self._cache_info |= {"hit": True, "key": self._cache_key.name, "dir": str(self._cache.root),
                            "created": entry.meta.get("created"), "restore_s": round(seconds, 2),
                            "method": copy.method, "bytes": copy.bytes}
        self.dataset_info = {"cache": self._cache_info, "snapshot_method": copy.method,
                             "snapshot_bytes": entry.bytes,
                             "total_s": round(seconds + self._cache_info["lookup_s"], 2)}
        self.log(f"dataset from cache {self._cache_key.name} ({copy.method} {seconds:.1f} s, "
                 f"{copy.bytes / 2**20:.0f} MiB; dataset.cache: false or PGLAB_CACHE=off to load it instead)")

    def _snapshot_for_resets(self, primary: Node, entry: datasets.Snapshot) -> datasets.Snapshot:
        """What the standbys and resets copy from: the cache's entry; or, when the lab's filesystems have reflinks
        that the entry cannot give them (the cache on another filesystem), a reflink snapshot beside the stopped
        primary, which costs metadata only and keeps standbys and resets at reflink speed."""
        assert self._cache is not None and self.dataset is not None
        if len(self.nodes) == 1 and self.dataset.reset != "snapshot":
            return entry  # no standby to make, no reset to serve
        data_dir, wal_dir = primary.data.parent, primary.wal.parent
        if all(datasets.reflink_supported(self._cache.root, d) for d in (data_dir, wal_dir)):
            return entry
        if not all(datasets.reflink_supported(d, d) for d in (data_dir, wal_dir)):
            return entry
        snap, copy = datasets.snapshot(primary.data, primary.wal, data_dir / "snapshot", bindir=self.bindir,
                                       wal_dest=wal_dir / "snapshot-wal")
        self._cache_info["lab_snapshot"] = copy.method
        self.log(f"a snapshot beside {primary.name} by {copy.method} for standbys and resets (the cache's "
                 "filesystem cannot reflink into the lab's)")
        return snap

    def _cache_store(self, primary: Node) -> tuple[datasets.Snapshot, datasets.CopyReport] | None:
        """Snapshot the freshly loaded primary into the cache (the lab's snapshot is then the entry); None when it
        cannot be stored there (said why), and the lab takes its own snapshot."""
        if self._cache is None or self._cache_key is None:
            return None
        try:
            stored = self._cache.store(self._cache_key, primary.data, primary.wal, bindir=self.bindir,
                                       password=self._password, log=self.log)
        except (datasets.SnapshotError, OSError) as exc:
            stored = str(exc)
        if isinstance(stored, str):
            self._cache_info["stored"] = False
            self._cache_info["not_stored"] = stored
            self.log(f"dataset cache: {self._cache_key.name} not stored ({stored})")
            return None
        entry, self._cache_lease, copy = stored
        self._cache_info["stored"] = True
        self.log(f"dataset cache: stored as {entry.name} in {self._cache.root}")
        return entry.snapshot, copy

    def _standbys_from_snapshot(self, quiet: bool = False) -> dict[str, str]:
        """Each standby is the snapshot plus standby.signal, streaming from the primary through its slot (created
        before the primary's first checkpoint, so the WAL since the snapshot is kept). Returns each standby's copy
        method (reflink, patch, copy)."""
        assert self.snapshot is not None
        primary = self.nodes[0]
        with self.connect(primary) as conn:
            for node in self.nodes[1:]:
                conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", (node.name,))
        methods = {}
        for node in self.nodes[1:]:
            if not quiet:
                self.log(f"{node.name}: standby from the snapshot")
            try:
                methods[node.name] = datasets.make_standby(
                    self.snapshot, node.data, node.wal, primary_conninfo=self._replication_conninfo(node),
                    slot=node.name).method
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise UserError(f"target.local.paths.data: no space left on the device of '{node.data.parent}' "
                                    f"for {node.name}; free some space there or choose another path.") from None
                raise
            self._write_conf(node)  # the snapshot holds the primary's pglab.conf
            self._start(node, may_move=True)
        return methods

    def reset_dataset(self) -> dict[str, Any]:
        """Put every instance back to the snapshot: stop them all (immediately: their state is discarded), restore
        the primary, recreate the slots, restore the standbys, start and wait until they stream."""
        if self.snapshot is None:
            raise LabError("dataset.reset is 'snapshot' but the lab has no snapshot (the dataset was not loaded by "
                           "the lab)")
        started = time.monotonic()
        for node in self.nodes:
            if node.postmaster_pid() is not None:
                self._pg_ctl(node, "-m", "immediate", "stop", timeout=60)
        primary = self.nodes[0]
        copy = datasets.restore(self.snapshot, primary.data, primary.wal)
        methods = {primary.name: copy.method}
        self._write_conf(primary)
        self._start(primary)
        methods.update(self._standbys_from_snapshot(quiet=True))
        self.wait_streaming()
        seconds = time.monotonic() - started
        self._events.append((time.time(), "dataset-reset", f"snapshot restored in {seconds:.1f} s "
                             f"({', '.join(sorted(set(methods.values())))})"))
        return {"seconds": round(seconds, 3), "method": methods}

    def _start_proxies(self) -> None:
        """One Toxiproxy proxy per standby in front of the primary, when the plan shapes the network."""
        net = self.spec.network
        if net is None or len(self.nodes) < 2:
            return
        from pglab.targets.local.toxiproxy import ToxiproxyServer

        assert self.lab_dir is not None
        workdir = self.lab_dir / "toxiproxy"
        workdir.mkdir(exist_ok=True)
        self.toxiproxy = ToxiproxyServer(workdir, self.lab_dir / "logs" / "toxiproxy.log")
        for node in self.nodes[1:]:
            self.proxy_ports[node.name] = self.toxiproxy.create_proxy(node.name, self.nodes[0].port)

    def _base_conf(self, node: Node) -> dict[str, Any]:
        standby_names = ", ".join(n.name for n in self.nodes[1:])
        sync = self.spec.synchronous
        conf: dict[str, Any] = {
            "listen_addresses": "127.0.0.1",
            "port": node.port,
            "unix_socket_directories": str(self.sock_dir),
            "wal_level": "replica",
            "max_wal_senders": 10,
            "max_replication_slots": 10,
            "hot_standby": True,
            "cluster_name": node.name,
            "log_checkpoints": True,
            "log_timezone": "UTC",  # the runner reads checkpoint times from the log
        }
        if sync is not None and standby_names and self._sync_enabled:
            conf["synchronous_standby_names"] = f"{sync.method.upper()} {sync.number} ({standby_names})"
        return conf

    def _write_conf(self, node: Node) -> None:
        conf = {**self._base_conf(node), **self.parameters}
        path = node.data / "pglab.conf"
        path.write_text("# written by pglab for every run; do not edit\n"
                        + "".join(f"{k} = {conf_value(v)}\n" for k, v in conf.items()))
        self._chown(path)

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
                    self._write_conf(node)
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
        try:
            text = node.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " / ".join(text[-lines:])

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
        if parameters == self.parameters:
            return
        self._validate(parameters)
        self.parameters = dict(parameters)
        for node in self.nodes:
            self._write_conf(node)
        for node in self.nodes:
            with self.connect(node) as conn:
                conn.execute("SELECT pg_reload_conf()")
        with self.connect(self.nodes[0]) as conn:
            pending = [r[0] for r in conn.execute("SELECT name FROM pg_settings WHERE pending_restart")]
        if pending:
            self.log(f"restart for {', '.join(sorted(pending))}")
            self.restart()

    def _validate(self, parameters: dict[str, Any]) -> None:
        """Ask PostgreSQL itself (postgres -C) whether names and values are valid, before writing them; a set it
        accepted once is not asked again (an interleaved sweep comes back to the same sets run after run)."""
        if not parameters:
            return
        key = repr(sorted((str(k), conf_value(v)) for k, v in parameters.items()))
        if key in self._accepted:
            return
        args = [self._bin("postgres"), "-D", str(self.nodes[0].data), "-C", next(iter(parameters))]
        for name, value in parameters.items():
            args += ["-c", f"{name}={conf_value(value).strip(chr(39))}"]
        try:
            self._run(args, timeout=30)
        except LabError as exc:
            message = str(exc).removeprefix("postgres failed: ").replace("FATAL:  ", "")
            message = re.sub(r"^\S+ \S+ \S+ \[\d+\] ", "", message)
            rejected = next((n for n in parameters if f'"{n}"' in message), None)
            field = f"parameters.{rejected}" if rejected else "parameters"
            raise UserError(f"{field}: PostgreSQL rejects it ({message}); fix the plan.") from None
        self._accepted.add(key)

    def repair(self) -> list[str]:
        """Start again the instances found down (killed during a run): the primary first, through crash recovery,
        then the standbys, which reconnect and catch up; wait until they stream. Returns the names restarted."""
        proxies = self._repair_proxies()
        down = [n for n in self.nodes if n.postmaster_pid() is None]
        for node in down:
            for attempt in range(20):
                try:
                    self._start(node)
                    break
                except LabError:  # a killed postmaster's backends may still hold its shared memory for a moment
                    if attempt == 19:
                        raise
                    interrupts.sleep(0.5)
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
        if self.toxiproxy is None:
            return []
        if self.toxiproxy.running():
            if self.toxiproxy.answers(TOXIPROXY_ANSWER_S):
                return []
            self.log(f"ended Toxiproxy, which did not answer its API (twice {TOXIPROXY_ANSWER_S:g} s)")
            self._events.append((time.time(), "repair", "ended Toxiproxy (its API did not answer)"))
        from pglab.targets.local.toxiproxy import ToxiproxyServer

        assert self.lab_dir is not None
        self.toxiproxy.stop()  # reaps it (a frozen one too: SIGTERM and SIGCONT, then SIGKILL after 5 s)
        self.toxiproxy = ToxiproxyServer(self.lab_dir / "toxiproxy", self.lab_dir / "logs" / "toxiproxy.log")
        for name, port in self.proxy_ports.items():
            self.toxiproxy.create_proxy(name, self.nodes[0].port, listen_port=port)
        self._shape_links()
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
        node = next(n for n in self.nodes if n.name == name)
        for attempt in range(20):  # the killed postmaster's children may hold its shared memory for a moment
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

    def probe_paths(self) -> dict[str, Path]:
        out: dict[str, Path] = {}
        for n in self.nodes:
            out[f"{n.name}.data"] = n.data
            out[f"{n.name}.wal"] = n.wal
        return out

    def storage_paths(self) -> dict[str, tuple[Path, str]]:
        """Where the storage phase runs fio: beside the primary's data and WAL directories, on their devices."""
        primary = self.nodes[0]
        return {"data": (primary.data.parent, "target.local.paths.data"),
                "wal": (primary.wal.parent, "target.local.paths.wal")}

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
        if self.toxiproxy is not None and not self.toxiproxy.running():
            problems.append("Toxiproxy, which carries the replication links, not running")
        elif self.toxiproxy is not None and not self.toxiproxy.answers(TOXIPROXY_ANSWER_S):
            problems.append(f"Toxiproxy, which carries the replication links, does not answer its API "
                            f"(twice {TOXIPROXY_ANSWER_S:g} s)")
        return "; ".join(problems) or None

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "local",
            "lab_dir": str(self.lab_dir),
            "bindir": str(self.bindir),
            "server_user": self.server_user.name if self.server_user else None,
            "synchronous_standby_names": self._base_conf(self.nodes[0]).get("synchronous_standby_names")
            if self.nodes else None,
            "nodes": [
                {"name": n.name, "role": n.role, "port": n.port, "data": str(n.data), "wal": str(n.wal),
                 **({"via_proxy_port": self.proxy_ports[n.name]} if n.name in self.proxy_ports else {})}
                for n in self.nodes
            ],
            "network": self.spec.network.model_dump() if self.spec.network else None,
            **({"dataset": self.dataset_info} if self.dataset_info else {}),
        }

    def _write_state(self) -> None:
        if not self.lab_dir:
            return
        state = {
            "pglab_pid": os.getpid(),
            "created": time.time(),
            "nodes": [{"name": n.name, "data": str(n.data), "wal": str(n.wal), "port": n.port,
                       "pid": n.postmaster_pid()} for n in self.nodes],
        }
        tmp = self.lab_dir / "lab.json.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.lab_dir / "lab.json")

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

    def teardown(self, keep: bool = False) -> None:
        if keep:
            if self.lab_dir:
                registry.mark_kept(self.lab_dir)
                self.log(f"lab kept running in {self.lab_dir} (remove it with: pglab lab clean {self.lab_dir})")
                for line in self.connect_lines():
                    self.log(line)
            return
        for node in reversed(self.nodes):
            try:
                self.stop_node(node, discard=True)
            except Exception as exc:  # teardown must go on with the others
                self.log(f"stopping {node.name}: {exc}")
        if self.toxiproxy is not None:
            self.toxiproxy.stop()
            self.toxiproxy = None
        self._remove_what_was_made()
        if self._cache_lease is not None:
            self._cache_lease.release()


def clean_lab(lab_dir: Path, unregister_entry: bool = True) -> list[str]:
    """Stop every server a lab directory's lab.json names, and any pgbench or fio still working on it, and remove
    the lab (and its registry entry unless told not to). Returns what was stopped.

    Used for labs kept with ``--keep``; labs left behind by a pglab that was killed are cleaned by the registry.
    """
    stopped = leftovers.stop_plain_lab(lab_dir)
    if unregister_entry:
        registry.unregister(lab_dir.resolve())
    return stopped
