"""Snapshots of a stopped cluster: taken aside, restored in place of a primary, or made into a standby.

A restore is a reflink copy (metadata only) where the filesystem supports it, else the old cluster patched where
it stands (only the blocks a run changed are written back), else a full in-kernel copy; always atomic. Server
start and stop stay with the lab (cluster.py); nothing here starts a server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pglab.targets.local.dataset.copytree import (
    CopyReport,
    _Copier,
    _fsync_path,
    _Patcher,
    reflink_supported,
)
from pglab.targets.local.dataset.errors import SnapshotError

_SEGMENT = re.compile(r"^[0-9A-F]{24}$")


def control_data(bindir: Path, data_dir: Path) -> dict[str, str]:
    """pg_controldata's fields (``Database cluster state``, ``Latest checkpoint's REDO WAL file`` …)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | {"LC_ALL": "C", "LANG": "C"}
    proc = subprocess.run([str(bindir / "pg_controldata"), "-D", str(data_dir)], capture_output=True, text=True,
                          env=env, check=False, timeout=60)
    if proc.returncode != 0:
        raise SnapshotError(f"pg_controldata {data_dir}: {proc.stderr.strip() or proc.stdout.strip()}")
    out: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def server_running(data_dir: Path) -> int | None:
    """The pid of a live postmaster using ``data_dir``, or None (a stale postmaster.pid does not count)."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return None if state == "Z" else pid


# ------------------------------------------------------------------ snapshot and restore
@dataclass
class Snapshot:
    """A stopped cluster copied aside: ``<dir>/data``, its WAL (``<dir>/wal``, or ``<dir>/data/pg_wal`` when the
    cluster has no separate WAL directory) and ``<dir>/snapshot.json``."""

    dir: Path
    data: Path
    wal: Path
    meta: dict[str, Any]

    @classmethod
    def load(cls, snap_dir: Path) -> Snapshot:
        try:
            meta = json.loads((snap_dir / "snapshot.json").read_text())
        except (OSError, ValueError):
            raise SnapshotError(f"'{snap_dir}' is not a complete snapshot (no readable snapshot.json)") from None
        return cls(snap_dir, snap_dir / "data", Path(meta["wal"]), meta)


def _wal_keep(control: dict[str, str]) -> set[str]:
    """The WAL segments a cleanly stopped cluster needs: the one holding its shutdown checkpoint, and the next in
    case the record crosses into it. Every other segment is older (not needed after a clean stop) or recycled
    ahead of use (PostgreSQL creates them again); a copy without them is what pg_basebackup gives too."""
    redo = control["Latest checkpoint's REDO WAL file"]
    seg_bytes = int(control.get("Bytes per WAL segment", 16 * 2**20))
    per_log = 0x100000000 // seg_bytes
    log, seg = int(redo[8:16], 16), int(redo[16:], 16)
    log2, seg2 = (log, seg + 1) if seg + 1 < per_log else (log + 1, 0)
    return {redo[8:], f"{log2:08X}{seg2:08X}"}


def snapshot(data_dir: Path, wal_dir: Path | None, dest: Path, *, bindir: Path, wal_dest: Path | None = None,
             method: str = "auto") -> tuple[Snapshot, CopyReport]:
    """Copy the cleanly stopped cluster in ``data_dir`` (WAL in ``wal_dir`` when initdb --waldir put it there).

    Refuses a running server or one whose control file does not say "shut down" (a copy of it would need crash
    recovery at every restore). ``dest`` must not exist: it is built under a temporary name and renamed, so a
    snapshot directory with a snapshot.json is always complete. Keep it on the data directory's filesystem (and
    ``wal_dest`` on the WAL's) for reflink copies."""
    data_dir, dest = data_dir.resolve(), dest.absolute()
    link = data_dir / "pg_wal"
    if wal_dir is None and link.is_symlink():
        wal_dir = link.resolve()
    wal_dir = wal_dir.resolve() if wal_dir else None
    if wal_dir is not None and (not link.is_symlink() or link.resolve() != wal_dir):
        raise SnapshotError(f"'{link}' is not a symlink to '{wal_dir}'")
    if (pid := server_running(data_dir)) is not None:
        raise SnapshotError(f"a server (pid {pid}) is running on '{data_dir}'; stop it cleanly first")
    control = control_data(bindir, data_dir)
    state = control.get("Database cluster state", "?")
    if state != "shut down":
        raise SnapshotError(f"'{data_dir}' was not shut down cleanly (state: {state}); start it and stop it with "
                            "pg_ctl stop -m fast first")
    if dest.exists():
        raise SnapshotError(f"'{dest}' already exists")
    keep = _wal_keep(control)
    skipped = 0

    def skip_wal(p: Path) -> bool:
        nonlocal skipped
        name = p.name
        if p.parent.name == "archive_status":
            name = name.split(".", 1)[0]
        if _SEGMENT.match(name) and name[8:] not in keep:
            skipped += p.parent.name != "archive_status"
            return True
        return False

    t0 = time.monotonic()
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    wal_out = (wal_dest.absolute() if wal_dest else dest / "wal")
    wal_tmp = wal_out.with_name(f".{wal_out.name}.tmp-{os.getpid()}") if wal_dest else tmp / "wal"
    copier = _Copier(method)
    try:
        tmp.mkdir(mode=0o700)
        if wal_dest and wal_out.exists():
            raise SnapshotError(f"'{wal_out}' already exists")
        # the snapshot's data has no pg_wal link: a server started on it by mistake fails instead of changing it
        copier.tree(data_dir, tmp / "data", skip=lambda p: p == link)
        copier.tree(wal_dir or link, wal_tmp if wal_dir else tmp / "data" / "pg_wal", skip=skip_wal)
        sync_s = copier.finish()
        meta = {
            "created": time.time(),
            "source": {"data": str(data_dir), "wal": str(wal_dir) if wal_dir else None},
            "wal": str(wal_out) if wal_dir is not None else str(dest / "data" / "pg_wal"),
            "separate_wal": wal_dir is not None,
            "control": {k: control.get(k) for k in (
                "Database system identifier", "Database cluster state", "Latest checkpoint location",
                "Latest checkpoint's REDO WAL file", "Latest checkpoint's TimeLineID", "wal_level setting",
                "pg_control last modified")},
            "method": copier.bytes_by.most_common(1)[0][0] if copier.bytes_by else "none",
            "bytes": sum(copier.bytes_by.values()),
        }
        (tmp / "snapshot.json").write_text(json.dumps(meta, indent=1))
        _fsync_path(tmp / "snapshot.json")
        if wal_dest:
            os.rename(wal_tmp, wal_out)
            _fsync_path(wal_out.parent)
        os.rename(tmp, dest)  # the snapshot exists from here on, complete
        _fsync_path(dest.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if wal_dest:
            shutil.rmtree(wal_tmp, ignore_errors=True)
        raise
    report = copier.report(time.monotonic() - t0, sync_s, [data_dir, dest] + ([wal_dir] if wal_dir else []),
                           skipped)
    return Snapshot.load(dest), report


def restore(snap: Snapshot | Path, data_dir: Path, wal_dir: Path | None, *, method: str = "auto",
            durable: bool = True, standby: dict[str, str] | None = None) -> CopyReport:
    """Put the snapshot in place of ``data_dir`` (and ``wal_dir``), the server being stopped.

    ``method``: "reflink" (a copy that shares the snapshot's blocks: metadata only), "copy" (every byte copied,
    in the kernel), "patch" (the old cluster turned into the snapshot where it stands, writing only the blocks
    that differ), or "auto": reflink when the filesystem can, else patch when the old directories are there,
    else copy. The report's ``method`` says which ran.

    Atomic: a copy is built beside each directory under a temporary name; a patch works on the old directories
    after renaming them aside. Either is made durable, then renamed into place, the data directory last. So at
    any moment ``data_dir`` is the old cluster, absent (a restore that failed or was killed: run it again), or
    the complete snapshot — never a mix. data/pg_wal points to ``wal_dir``, as initdb --waldir made it.
    ``standby`` (primary_conninfo, primary_slot_name …) writes standby.signal and those settings, making the
    copy a standby of the primary restored from the same snapshot."""
    snap = snap if isinstance(snap, Snapshot) else Snapshot.load(snap)
    data_dir = data_dir.absolute()
    wal_dir = wal_dir.absolute() if wal_dir else None
    if method not in ("auto", "reflink", "copy", "patch"):
        raise ValueError(f"method must be auto, reflink, copy or patch, not {method!r}")
    if bool(wal_dir) != bool(snap.meta.get("separate_wal")):
        raise SnapshotError("the snapshot and the target disagree on where the WAL is (a separate --waldir or not)")
    if (pid := server_running(data_dir)) is not None:
        raise SnapshotError(f"a server (pid {pid}) is running on '{data_dir}'; stop it first")
    t0 = time.monotonic()
    _clean_leftovers(data_dir, wal_dir)
    old_there = data_dir.is_dir() and (wal_dir is None or wal_dir.is_dir())
    if method == "auto":
        reflink = reflink_supported(snap.dir, data_dir.parent) and (
            wal_dir is None or reflink_supported(snap.wal.parent, wal_dir.parent))
        method = "reflink" if reflink else "patch" if old_there else "copy"
    if method == "patch" and old_there:
        return _restore_patch(snap, data_dir, wal_dir, durable, standby, t0)
    tag = f"pglab-restore-{os.getpid()}"
    data_tmp, data_old = _beside(data_dir, tag, "new"), _beside(data_dir, tag, "old")
    wal_tmp = _beside(wal_dir, tag, "new") if wal_dir else None
    wal_old = _beside(wal_dir, tag, "old") if wal_dir else None
    copier = _Copier("reflink" if method == "reflink" else "copy", durable)
    try:
        copier.tree(snap.data, data_tmp, symlinks={"pg_wal": str(wal_dir)} if wal_dir else None)
        if wal_dir and wal_tmp:
            copier.tree(snap.wal, wal_tmp)
        if standby is not None:
            _write_standby(data_tmp, standby, snap.data.lstat())
        sync_s = copier.finish()
    except BaseException:
        shutil.rmtree(data_tmp, ignore_errors=True)
        if wal_tmp:
            shutil.rmtree(wal_tmp, ignore_errors=True)
        raise
    # the swap: data out of the way first, so no moment has the old data directory with the new WAL
    if data_dir.exists():
        os.rename(data_dir, data_old)
        _fsync_path(data_dir.parent)
    if wal_dir and wal_tmp and wal_old:
        if wal_dir.exists():
            os.rename(wal_dir, wal_old)
        os.rename(wal_tmp, wal_dir)
        _fsync_path(wal_dir.parent)
    os.rename(data_tmp, data_dir)
    _fsync_path(data_dir.parent)
    shutil.rmtree(data_old, ignore_errors=True)
    if wal_old:
        shutil.rmtree(wal_old, ignore_errors=True)
    paths = [snap.dir, data_dir] + ([wal_dir] if wal_dir else [])
    return copier.report(time.monotonic() - t0, sync_s, paths)


def _restore_patch(snap: Snapshot, data_dir: Path, wal_dir: Path | None, durable: bool,
                   standby: dict[str, str] | None, t0: float) -> CopyReport:
    tag = f"pglab-restore-{os.getpid()}"
    work_data = _beside(data_dir, tag, "new")
    work_wal = _beside(wal_dir, tag, "new") if wal_dir else None
    os.rename(data_dir, work_data)  # from here until the last rename, data_dir is absent: never half patched
    _fsync_path(data_dir.parent)
    patcher = _Patcher(durable)
    try:
        if wal_dir and work_wal:
            os.rename(wal_dir, work_wal)
        patcher.sync(snap.data, work_data, {"pg_wal": str(wal_dir)} if wal_dir else {})
        if wal_dir and work_wal:
            patcher.sync(snap.wal, work_wal, {})
        if standby is not None:
            _write_standby(work_data, standby, snap.data.lstat())
        sync_s = patcher.finish()
        if wal_dir and work_wal:
            os.rename(work_wal, wal_dir)
            _fsync_path(wal_dir.parent)
        os.rename(work_data, data_dir)
        _fsync_path(data_dir.parent)
    except BaseException:
        shutil.rmtree(work_data, ignore_errors=True)
        if work_wal:
            shutil.rmtree(work_wal, ignore_errors=True)
        raise
    paths = [snap.dir, data_dir] + ([wal_dir] if wal_dir else [])
    report = patcher.report(time.monotonic() - t0, sync_s, paths)
    report.method = "patch"
    report.compared_bytes, report.rewritten_bytes, report.removed = (
        patcher.compared, patcher.rewritten, patcher.removed)
    return report


def make_standby(snap: Snapshot | Path, data_dir: Path, wal_dir: Path | None, *, primary_conninfo: str,
                 slot: str | None = None, method: str = "auto") -> CopyReport:
    """A standby of the primary restored from the same snapshot: the snapshot plus standby.signal, and
    primary_conninfo (and primary_slot_name) in postgresql.auto.conf. The standby starts from the snapshot's
    shutdown checkpoint and streams the rest; the primary's WAL from that point must still be there (create the
    slot right after starting the primary, before its first checkpoint)."""
    settings = {"primary_conninfo": primary_conninfo}
    if slot:
        settings["primary_slot_name"] = slot
    return restore(snap, data_dir, wal_dir, method=method, standby=settings)


def _write_standby(data: Path, settings: dict[str, str], owner: os.stat_result) -> None:
    auto = data / "postgresql.auto.conf"
    lines = [ln for ln in (auto.read_text().splitlines() if auto.exists() else [])
             if ln.split("=", 1)[0].strip() not in settings]
    lines += [f"{k} = '" + v.replace("\\", "\\\\").replace("'", "''") + "'" for k, v in settings.items()]
    for path, text in ((auto, "\n".join(lines) + "\n"), (data / "standby.signal", "")):
        path.write_text(text)
        os.chown(path, owner.st_uid, owner.st_gid)
        os.chmod(path, 0o600)
        _fsync_path(path)


def _beside(path: Path, tag: str, kind: str) -> Path:
    return path.with_name(f".{path.name}.{tag}-{kind}")


def _clean_leftovers(data_dir: Path, wal_dir: Path | None) -> None:
    """Temporary and old copies left by a restore that was killed (any pid) are removed before starting again."""
    for d in [data_dir, *([wal_dir] if wal_dir else [])]:
        for p in d.parent.glob(f".{d.name}.pglab-restore-*"):
            shutil.rmtree(p, ignore_errors=True)

