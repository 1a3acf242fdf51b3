"""Finding the system's PostgreSQL binaries and the unprivileged user that runs the servers."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from pglab.errors import UserError

NEEDED = ("initdb", "pg_ctl", "postgres", "pg_basebackup", "pgbench")
INSTALL_HINT = "install PostgreSQL (./setup.sh install, or apt-get install postgresql postgresql-contrib)"


def find_client_bindir(explicit: str | None = None) -> Path:
    """Where pgbench is, for a server pglab does not build (the server binaries are not needed)."""
    return find_bindir(explicit, needed=("pgbench",))


def find_bindir(explicit: str | None = None, needed: tuple[str, ...] = NEEDED) -> Path:
    """The plan's bindir, else $PGLAB_PG_BINDIR, else the newest /usr/lib/postgresql/*/bin, else PATH."""
    candidates: list[Path] = []
    if explicit:
        candidates = [Path(explicit)]
    elif os.environ.get("PGLAB_PG_BINDIR"):
        candidates = [Path(os.environ["PGLAB_PG_BINDIR"])]
    else:
        root = Path("/usr/lib/postgresql")
        if root.is_dir():
            versions = sorted(
                (p for p in root.iterdir() if re.fullmatch(r"\d+(\.\d+)?", p.name)),
                key=lambda p: float(p.name),
                reverse=True,
            )
            candidates = [v / "bin" for v in versions]
        which = shutil.which(needed[0])
        if which:
            candidates.append(Path(which).resolve().parent)
    for c in candidates:
        if all((c / b).is_file() and os.access(c / b, os.X_OK) for b in needed):
            if explicit and os.geteuid() == 0:
                _check_root_only(c, needed)
            return c
    where = str(candidates[0]) if explicit or os.environ.get("PGLAB_PG_BINDIR") else "this machine"
    missing = [b for b in needed if not candidates or not (candidates[0] / b).exists()]
    raise UserError(f"PostgreSQL binaries ({', '.join(missing or needed)}) not found in {where}; {INSTALL_HINT}.")


def _check_root_only(bindir: Path, needed: tuple[str, ...]) -> None:
    """As root, pglab runs ``pgbench -i`` and the ``--version`` probes from a plan's bindir: a binary, or a folder
    above it, that someone other than root can change would run their code as root (plans are code). A
    world-writable folder with the sticky bit (/tmp) is fine: others cannot replace root's entries in it."""
    for binary in needed:
        real = (bindir / binary).resolve()
        for p in (real, *real.parents):
            st = p.stat()
            sticky = stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_ISVTX)
            if st.st_uid != 0 or (st.st_mode & 0o022 and not sticky):
                who = f"belongs to uid {st.st_uid}" if st.st_uid != 0 else "is writable by others"
                raise UserError(f"bindir {bindir}: pglab runs as root and {p} {who}, so its owner could run code "
                                f"as root; leave bindir out (the system's PostgreSQL) or name one only root can "
                                f"change.")


@dataclass(frozen=True)
class ServerUser:
    """Who the servers run as. None of this applies when pglab itself is not root."""

    name: str
    uid: int
    gid: int

    def popen_kwargs(self) -> dict[str, object]:
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


def resolve_server_user(run_as: str | None) -> ServerUser | None:
    """PostgreSQL refuses to run as root: as root, run the servers as ``run_as`` (default ``postgres``)."""
    if os.geteuid() != 0:
        if run_as:
            me = pwd.getpwuid(os.geteuid()).pw_name
            if run_as != me:
                raise UserError(f"target.local.run_as: pglab runs as '{me}', not root, so it cannot run the "
                                f"servers as '{run_as}'; remove run_as or run pglab as root.")
        return None
    name = run_as or os.environ.get("PGLAB_RUN_AS") or "postgres"
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise UserError(f"target.local.run_as: user '{name}' does not exist; PostgreSQL cannot run as root, "
                        f"so create an unprivileged user (useradd --system {name}) or name one.") from None
    if pw.pw_uid == 0:
        raise UserError("target.local.run_as: PostgreSQL cannot run as root; name an unprivileged user.")
    return ServerUser(name, pw.pw_uid, pw.pw_gid)


PLAN_USER = "pglab-run"  # ./setup.sh creates it: a system user with no home, no shell, no file of the lab's


def resolve_plan_user() -> ServerUser | None:
    """As root, who runs the plan's code (pgbench, and what its scripts ``\\shell``): ``$PGLAB_PLAN_USER``, else
    ``pglab-run``; an unprivileged user that owns nothing of value, where the server user owns the data directories
    (the lab's, and a system PostgreSQL's). None when pglab is not root: the plan's code runs as pglab's user."""
    if os.geteuid() != 0:
        return None
    given = os.environ.get("PGLAB_PLAN_USER")
    name = given or PLAN_USER
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        if given:
            raise UserError(f"PGLAB_PLAN_USER: user '{name}' does not exist; name an unprivileged user, or unset it "
                            f"for {PLAN_USER}.") from None
        raise UserError(f"pglab runs as root, so it runs the plan's code (pgbench, a script's \\shell) as the "
                        f"unprivileged user '{PLAN_USER}', which this host lacks; run ./setup.sh install, or useradd "
                        f"--system --no-create-home --shell /usr/sbin/nologin {PLAN_USER}.") from None
    if pw.pw_uid == 0:
        raise UserError("PGLAB_PLAN_USER: the plan's code must not run as root; name an unprivileged user.")
    return ServerUser(name, pw.pw_uid, pw.pw_gid)
