"""What the plain lab (``cluster.LocalLab``) and the Patroni lab (``ha.HALab``) do alike, written once.

As in Patroni's design, this base implements the lifecycle both labs share (the lab's folders, lab.json, the CPU
step, events, server pids, cgroups per member, teardown) over narrow primitives each lab supplies: its ``nodes``,
``_roll`` (the rolling restart after a CPU step: pg_ctl on the plain lab, Patroni's REST API on the HA lab),
``_state`` (what lab.json records) and ``_stop_all`` (every process of the lab gone). Both hold the same two parts
(limits.py): ``limits``, their cgroups, and ``links``, their shaped replication links.
"""

from __future__ import annotations

import abc
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
from pglab.targets.local import registry
from pglab.targets.local.limits import Groups, Links, Member
from pglab.targets.local.postgres_bin import ServerUser, find_bindir, resolve_plan_user, resolve_server_user
from pglab.targets.local.removal import remove_tree


class LabNode(Member, Protocol):
    """A member of a lab, as the shared operations see it."""

    def postmaster_pid(self) -> int | None: ...


N = TypeVar("N", bound=LabNode)


class LabBase(abc.ABC, Generic[N]):
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
        self.limits = Groups(spec, log, self.MEMBER)
        self.links = Links(spec, log)
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

    def _tail(self, path: Path, lines: int = 3) -> str:
        """A log's last lines, for an error message."""
        try:
            text = path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " / ".join(text[-lines:])

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
        if cpus == self.cpus or not self.limits.member_limits:
            return None
        started = time.monotonic()
        self.cpus = cpus
        for g in self.limits.groups.values():
            g.apply(self.limits.limits(cpus))
        self._roll(timeout)
        seconds = time.monotonic() - started
        label = "unlimited" if cpus is None else f"{cpus:g}"
        self._events.append((time.time(), "cpu-step", f"cpus={label}: rolling restart took {seconds:.1f} s"))
        self.log(f"CPU limit {label} per {self.MEMBER}: rolling restart took {seconds:.1f} s")
        return seconds

    # ------------------------------------------------------------ the Target's figures: its parts' (limits.py)
    def limits_in_force(self) -> dict[str, Any]:
        return self.limits.in_force()

    def cpu_stats(self) -> dict[str, dict[str, float]]:
        return self.limits.cpu_stats()

    def io_stats(self) -> dict[str, dict[str, float]]:
        return self.limits.io_stats()

    def io_accounting(self) -> str | None:
        return self.limits.io_accounting()

    def client_procs_files(self) -> list[Path]:
        return self.limits.client_procs_files()

    def links_in_force(self) -> dict[str, Any]:
        return self.links.in_force()

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
        assert self.lab_dir is not None
        self.limits.make(self.lab_dir, list(self.nodes), self.cpus, self.spec.resources is not None or self.cpus_axis)

    def _remove_what_was_made(self) -> None:
        """Once every process of the lab is gone: its cgroups, its directories, its registry entry."""
        self.limits.remove()
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
