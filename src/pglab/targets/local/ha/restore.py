"""A lab restored from a base backup (``pglab cluster restore``): the backup is staged where the first node's
custom bootstrap (``pglab_restore`` in its patroni.yml) moves it into place."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from pglab import interrupts
from pglab.errors import LabError
from pglab.targets.local.ha.node import HANode
from pglab.targets.local.postgres_bin import ServerUser


def stage_backup(backup: Path, lab_dir: Path, first: HANode, server_user: ServerUser | None) -> int:
    """Copy a pg_basebackup (plain or tar, WAL included) where the first node's bootstrap script takes it from,
    owned by the server user, WAL apart behind a pg_wal symlink as initdb --waldir makes it. Returns the backup's
    system identifier."""
    try:
        return _stage_files(backup, lab_dir, first, server_user)
    except (OSError, subprocess.CalledProcessError, IndexError) as exc:
        detail = exc.stderr.decode(errors="replace").strip() if isinstance(exc, subprocess.CalledProcessError) \
            else str(exc)
        raise LabError(f"cannot stage the backup {backup} for restore: {detail}") from None


def _stage_files(backup: Path, lab_dir: Path, first: HANode, server_user: ServerUser | None) -> int:
    stage = lab_dir / "server" / "restore"
    data, wal = stage / "data", stage / "wal"
    stage.mkdir(mode=0o700)
    wal.mkdir(mode=0o700)
    if (backup / "base.tar").is_file():
        data.mkdir(mode=0o700)
        for tar, into in ((backup / "base.tar", data), (backup / "pg_wal.tar", wal)):
            if tar.is_file():  # a large backup takes a while: a recorded Ctrl-C or SIGTERM ends tar
                args = ["tar", "-xf", str(tar), "-C", str(into)]
                done = interrupts.run(args, capture_output=True)
                if done.returncode != 0:
                    raise subprocess.CalledProcessError(done.returncode, args, done.stdout, done.stderr)
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
    system_id = int.from_bytes(control[:8], "little")
    os.chmod(data, 0o700)
    if server_user:
        for top, dirs, files in os.walk(stage):
            for path in [top, *(os.path.join(top, x) for x in dirs + files)]:
                os.lchown(path, server_user.uid, server_user.gid)
    script = lab_dir / "server" / "restore.sh"
    script.write_text(f"#!/bin/sh\nset -e\nmv '{wal}' '{first.wal}'\nmv '{data}' '{first.data}'\n")
    os.chmod(script, 0o700)
    if server_user:
        os.chown(script, server_user.uid, server_user.gid)
    return system_id
