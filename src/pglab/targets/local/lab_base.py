"""What the plain lab (``cluster.LocalLab``) and the Patroni lab (``ha.HALab``) do alike, written once.

As in Patroni's design, this base implements the lifecycle both labs share (the lab's folders, lab.json, the CPU
step, events, server pids, cgroups per member, teardown) over narrow primitives each lab supplies: its ``nodes``,
``_roll`` (the rolling restart after a CPU step: pg_ctl on the plain lab, Patroni's REST API on the HA lab),
``_state`` (what lab.json records) and ``_stop_all`` (every process of the lab gone). Limits and shaped links come
from GroupedLimits and ShapedLinks.
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from pglab import interrupts
from pglab.errors import LabError, UserError
from pglab.plan.schema import LocalTarget
from pglab.targets.base import Endpoints, PlanCodeUser
from pglab.targets.local import cgroups, registry
from pglab.targets.local.cgroups import cgroup_name
from pglab.targets.local.limits import GroupedLimits, ShapedLinks
from pglab.targets.local.postgres_bin import ServerUser, find_bindir, resolve_plan_user, resolve_server_user
from pglab.targets.local.removal import remove_tree
from pglab.targets.local.toxiproxy import ToxiproxyServer


class LabNode(Protocol):
    """A member of a lab, as the shared operations see it."""

    @property
    def name(self) -> str: ...
    @property
    def data(self) -> Path: ...
    @property
    def wal(self) -> Path: ...
    def postmaster_pid(self) -> int | None: ...


N = TypeVar("N", bound=LabNode)


class LabBase(GroupedLimits, ShapedLinks, abc.ABC, Generic[N]):
    """The shared half of a local lab: its state, set here once, and the operations over it."""

    MEMBER = "instance"  # how the log names one member of the lab ("CPU limit 2 per instance")
    KIND = "lab"  # how the log names the lab ("lab kept running in …")
    cpus_axis = False  # set by the runner when the plan sweeps matrix.cpus
    read_only = False  # pglab's own lab

    def __init__(self, spec: LocalTarget, base_dir: Path, log: Callable[[str], None]):
        self.spec, self.base_dir, self.log = spec, base_dir, log
        self.bindir = find_bindir(spec.bindir)
        self.server_user = resolve_server_user(spec.run_as)
        self.lab_dir: Path | None = None
        self.nodes: list[N] = []
        self.cpus = spec.resources.cpus if spec.resources else None
        self.groups: dict[str, cgroups.Group] = {}  # per member: the plan's limits, or accounting only
        self.client_group: cgroups.Group | None = None
        self.limits_problem: str | None = None  # why limits are not applied (limits: best-effort)
        self.toxiproxy: ToxiproxyServer | None = None  # when the plan shapes the replication links
        self.proxy_ports: dict[str, int] = {}  # link (node) -> the port of its proxy
        self._events: list[tuple[float, str, str]] = []
        self._created_dirs: list[Path] = []  # directories the lab made, removed last-made first when it goes

    # ------------------------------------------------------------ primitives each lab supplies
    @abc.abstractmethod
    def _roll(self, timeout: float) -> None:
        """Restart every member after a CPU step, as an operator would roll it, until all serve again."""

    @abc.abstractmethod
    def endpoints(self) -> Endpoints: ...

    @abc.abstractmethod
    def _state(self) -> dict[str, Any]:
        """The lab's own fields of lab.json (what runs where), beside the owner's pid and the time."""

    @abc.abstractmethod
    def _stop_all(self) -> None:
        """Stop every process of the lab at once (its files go next: a clean shutdown would only cost seconds)."""

    @abc.abstractmethod
    def _env(self) -> dict[str, str]:
        """The environment of the lab's programs (none of the invoking user's PG* settings)."""

    # ------------------------------------------------------------ lifecycle
    def preflight(self) -> None:
        """The binaries (etcd's and Patroni's too) and the server user were checked on construction; paths are
        checked as they are created."""

    def teardown(self, keep: bool = False) -> None:
        """Stop everything and remove what the lab created (``keep``: leave it running, marked kept)."""
        if keep:
            if self.lab_dir:
                registry.mark_kept(self.lab_dir)
                self.log(f"{self.KIND} kept running in {self.lab_dir} (remove it with: pglab lab clean "
                         f"{self.lab_dir})")
                for line in self.connect_lines():
                    self.log(line)
            return
        self._stop_all()
        self._remove_what_was_made()  # every process of the lab is gone now

    def _write_state(self) -> None:
        """lab.json, replaced at once (after every server or daemon started or stopped): what leftovers reads to
        clean a lab its pglab left behind."""
        if not self.lab_dir:
            return
        tmp = self.lab_dir / "lab.json.tmp"
        tmp.write_text(json.dumps({"pglab_pid": os.getpid(), "created": time.time(), **self._state()}, indent=1))
        tmp.replace(self.lab_dir / "lab.json")

    def _make_lab_dir(self, prefix: str, *own: str) -> tuple[Path, Path, Path]:
        """The lab's folder (the plan's ``paths.lab``, empty or new, else a new temporary one) with its secrets,
        server, sock and logs folders and the lab's ``own``; returns it and the data and WAL bases, all checked
        writable by the server user."""
        spec = self.spec
        if spec.paths.lab:
            lab = self._abs(spec.paths.lab)
            if lab.exists() and any(lab.iterdir()):
                raise UserError(f"target.local.paths.lab: '{lab}' is not empty; give an empty or new directory.")
        else:
            lab = Path(tempfile.mkdtemp(prefix=prefix))
        data_base = self._abs(spec.paths.data) if spec.paths.data else lab
        wal_base = self._abs(spec.paths.wal) if spec.paths.wal else lab
        for field, base in (("lab", lab), ("data", data_base), ("wal", wal_base)):
            try:
                base.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UserError(f"target.local.paths.{field}: cannot create '{base}' ({exc.strerror}).") from None
            if field == "lab":
                self._created_dirs.append(lab)
                self.lab_dir = lab
                os.chmod(lab, 0o711)  # the server user must traverse it, nobody needs to list it
            self._check_traversable(base, f"target.local.paths.{field}")
        (lab / "secrets").mkdir(mode=0o700)
        for name in ("server", *own):
            self._mkdir_server(lab / name)
        self._mkdir_server(lab / "sock", 0o755)
        self._mkdir_server(lab / "logs", 0o755)
        return lab, data_base, wal_base

    def _make_node_dirs(self, data: Path, wal: Path, *more: Path) -> None:
        """A member's data and WAL parents (and ``more``), made for the server user; its data and WAL must not
        exist yet."""
        for d in (data, wal):
            if d.exists():
                raise UserError(f"'{d}' already exists; remove it or choose other target.local.paths.")
        for d in dict.fromkeys((*more, data.parent, wal.parent)):
            if not d.exists():
                self._mkdir_server(d)
                self._created_dirs.append(d)

    # ------------------------------------------------------------ files (a plan's paths, the server user's files)
    def _abs(self, value: str) -> Path:
        """A plan's path, relative to the plan's folder."""
        p = Path(value).expanduser()
        return (p if p.is_absolute() else self.base_dir / p).resolve()

    def _chown(self, path: Path) -> None:
        if self.server_user:
            os.chown(path, self.server_user.uid, self.server_user.gid)

    def _mkdir_server(self, path: Path, mode: int = 0o700) -> None:
        """A folder the servers write into: it belongs to the server user."""
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, mode)
        self._chown(path)

    def _write_private(self, path: Path, text: str, server: bool) -> None:
        """A secret (0600): the invoking user's, or the server user's with ``server``."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if server:
            self._chown(path)

    def _run(self, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run a PostgreSQL program as the server user; raise LabError with its own message on failure. A safe point:
        a recorded Ctrl-C or SIGTERM kills the program (the teardown that follows stops what it started)."""
        kwargs: dict[str, Any] = self.server_user.popen_kwargs() if self.server_user else {}
        try:
            proc = interrupts.run(
                args, capture_output=True, text=True, timeout=timeout, env=self._env(),
                cwd=self.lab_dir, start_new_session=True, **kwargs,
            )
        except subprocess.TimeoutExpired:
            raise LabError(f"{Path(args[0]).name} did not finish within {timeout:.0f} s") from None
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            cause = [line for line in lines[:-3] if "No space left on device" in line][:1]  # the root cause first
            raise LabError(f"{Path(args[0]).name} failed: {' / '.join(cause + lines[-3:])}")
        return proc

    # ------------------------------------------------------------ shared operations
    @property
    def sock_dir(self) -> Path:
        assert self.lab_dir is not None
        return self.lab_dir / "sock"

    @property
    def client_passfile(self) -> Path:
        assert self.lab_dir is not None
        return self.lab_dir / "secrets" / "pgpass"

    def connect_lines(self) -> list[str]:
        """How to reach a kept lab's primary with psql: the command, and the environment that makes a bare
        ``psql`` do the same. The passfile is the invoking user's (0600): psql as another user is refused."""
        try:
            ep = self.endpoints().primary
        except Exception:  # a lab that is not answering: its folder is still said, by the caller
            return []
        psql = str(self.bindir / "psql") if (self.bindir / "psql").is_file() else "psql"
        q = shlex.quote
        return [f"connect: PGPASSFILE={q(str(ep.passfile))} {q(psql)} -h {q(ep.host)} -p {ep.port} -U {q(ep.user)} "
                f"{q(ep.dbname)}",
                f"or set: export PGHOST={q(ep.host)} PGPORT={ep.port} PGUSER={q(ep.user)} PGDATABASE={q(ep.dbname)} "
                f"PGPASSFILE={q(str(ep.passfile))}"]

    def plan_code_user(self) -> PlanCodeUser | None:
        """As root, pgbench (the plan's scripts) runs as the plan user (``pglab-run``, :func:`resolve_plan_user`),
        not the server user, who owns the data directories; with credentials it can read."""
        if self.server_user is None or self.lab_dir is None:
            return None
        user = resolve_plan_user()
        assert user is not None  # root: the server user exists only then
        return PlanCodeUser(user.name, user.uid, user.gid, self._plan_user_passfile(user))

    def _plan_user_passfile(self, user: ServerUser) -> Path:
        """The client's credentials where the plan user can read them: ``<lab>/client/pgpass``, its own file (0600)
        in a folder of root's (0711) in which it can create nothing: no link it planted is ever written through."""
        assert self.lab_dir is not None
        folder = self.lab_dir / "client"
        folder.mkdir(mode=0o711, exist_ok=True)
        os.chmod(folder, 0o711)
        passfile = folder / "pgpass"
        fd = os.open(passfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.client_passfile.read_text())
        os.chown(passfile, user.uid, user.gid)
        return passfile

    def server_pids(self) -> list[int]:
        return [p for n in self.nodes if (p := n.postmaster_pid())]

    def probe_paths(self) -> dict[str, Path]:
        return {f"{n.name}.{kind}": path for n in self.nodes for kind, path in (("data", n.data), ("wal", n.wal))}

    def storage_paths(self) -> dict[str, tuple[Path, str]]:
        """Where the storage phase runs fio: beside the first member's data and WAL directories, on their devices."""
        first = self.nodes[0]
        return {"data": (first.data.parent, "target.local.paths.data"),
                "wal": (first.wal.parent, "target.local.paths.wal")}

    def set_cpus(self, cpus: float | None, timeout: float = 180) -> float | None:
        """A step of the CPU scaling loop: the new quota on every member's group, then a rolling restart
        (:meth:`_roll`). Returns its seconds, recorded as a ``cpu-step`` event."""
        if cpus == self.cpus or not self.member_limits:
            return None
        started = time.monotonic()
        self.cpus = cpus
        for g in self.groups.values():
            g.apply(self._limits(cpus))
        self._roll(timeout)
        seconds = time.monotonic() - started
        label = "unlimited" if cpus is None else f"{cpus:g}"
        self._events.append((time.time(), "cpu-step", f"cpus={label}: rolling restart took {seconds:.1f} s"))
        self.log(f"CPU limit {label} per {self.MEMBER}: rolling restart took {seconds:.1f} s")
        return seconds

    def take_events(self) -> list[tuple[float, str, str]]:
        """Lab events since the last call (CPU steps, restarts, dataset resets), for the sweep's timeline."""
        out, self._events = self._events, []
        return out

    def _check_traversable(self, path: Path, field: str) -> None:
        if self.server_user is None:
            if not os.access(path, os.W_OK | os.X_OK):
                raise UserError(f"{field}: '{path}' is not writable; choose a directory you can write to.")
            return
        if not searchable_by(path, self.server_user.uid, self.server_user.gid):
            raise UserError(f"{field}: the server user '{self.server_user.name}' cannot reach '{path}' (a parent "
                            "directory is not searchable); choose a directory under a world-searchable path such as "
                            "/var/tmp.")

    def _make_groups(self) -> None:
        """One cgroup per member (when the plan gives resources or a CPU axis) and one for pgbench, named
        ``pglab-<lab>-<digest>/n0`` …, ``…/client``. With ``limits: best-effort`` a failure is recorded, not
        raised. Members without limits still get a group, accounting only, to count each one's I/O."""
        assert self.lab_dir is not None
        wants_members = self.spec.resources is not None or self.cpus_axis
        client = self.spec.client
        if wants_members or client is not None:
            self._make_limited_groups(wants_members)
        if not self.groups:
            self._make_accounting_groups()

    def _make_limited_groups(self, wants_members: bool) -> None:
        assert self.lab_dir is not None
        client = self.spec.client
        field = "target.local.resources"
        try:
            if wants_members:
                self.member_limits = True
                for node in self.nodes:
                    self._make_group(node)
            if client is not None:
                field = "target.local.client"
                self.client_group = cgroups.Group(f"{cgroup_name(self.lab_dir)}/client",
                                                  cgroups.Limits(cpus=client.cpus, cpuset=client.cpuset))
                self.client_group.apply()
        except cgroups.CgroupError as exc:
            self._remove_groups()
            self.member_limits = False
            if self.spec.limits == "strict":
                raise UserError(f"{field}: the limits cannot be applied here ({exc}); run pglab as root on a host "
                                "with cgroups, or set target.local.limits: best-effort.") from None
            self.limits_problem = str(exc)
            self.log(f"limits NOT applied (limits: best-effort): {exc}")

    def _make_accounting_groups(self) -> None:
        """A group per member that limits nothing and counts its I/O (and CPU), whenever cgroups allow it;
        otherwise the reason is kept (:meth:`io_accounting`) and the runs' I/O figures are the devices' only."""
        problem = cgroups.io_accounting_problem()
        if problem is None:
            try:
                for node in self.nodes:
                    self._make_group(node)
            except cgroups.CgroupError as exc:
                for g in self.groups.values():
                    g.remove()
                self.groups, problem = {}, str(exc)
        self.io_problem = problem
        if problem:
            self.log(f"I/O figures are device-wide only (no cgroup per {self.MEMBER}): {problem}")

    def _make_group(self, node: N) -> None:
        """The member's group: the plan's limits written, or (accounting only) none and its I/O counted."""
        assert self.lab_dir is not None
        devices = sorted({cgroups.device_of(d) for d in (node.data.parent, node.wal.parent)})
        limits = self._limits(self.cpus) if self.member_limits else cgroups.Limits()
        group = cgroups.Group(f"{cgroup_name(self.lab_dir)}/{node.name}", limits, devices)
        self.groups[node.name] = group
        if not self.member_limits:
            group.account_io()
            return
        group.apply()
        if not limits.io:  # no I/O rule of the plan's sets the disk's throttle up: count anyway, never fail on it
            with contextlib.suppress(cgroups.CgroupError):
                group.account_io()

    def _remove_groups(self) -> None:
        for g in [*self.groups.values(), *([self.client_group] if self.client_group else [])]:
            g.remove()
        self.groups, self.client_group = {}, None

    def _remove_what_was_made(self) -> None:
        """Once every process of the lab is gone: its cgroups, its directories, its registry entry."""
        self._remove_groups()
        for d in reversed(self._created_dirs):
            remove_tree(d)
        self._created_dirs.clear()
        if self.lab_dir:
            registry.unregister(self.lab_dir)


def searchable_by(path: Path, uid: int, gid: int) -> bool:
    """Whether ``uid`` may traverse ``path`` and every folder above it, from their mode bits (what ``test -x`` as
    that user would say, without running a program: PATH may have none, and nothing is started to ask)."""
    import pwd

    try:
        groups = {gid, *os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)}
    except (KeyError, OSError):
        groups = {gid}
    for p in (path, *path.parents):
        try:
            st = p.stat()
        except OSError:
            return False
        if uid == 0:
            continue
        bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid in groups else 0o001
        if not st.st_mode & bit:
            return False
    return True
