"""A dataset cache across invocations: the first load of a dataset kept as a stopped-cluster snapshot, reused.

Why: every ``pglab run`` on a local lab loaded its dataset again (scale 100: ~14 s; the studies pglab reproduces
use scales where a load takes hours), although the files a load leaves are the same each time for the same
PostgreSQL build and dataset. So the first load of a key is kept as a snapshot (snapshots.py) in the user's cache
folder, and a later lab with the same key restores it (a reflink where the filesystem allows, else an in-kernel
copy) and builds its standbys from it.

Layout of the folder::

    <name>/               an entry: data/, wal/ and snapshot.json (snapshots.snapshot), secret, entry.json
    <name>/entry.json     written last, atomically: an entry without it is incomplete and never used
    <name>.lock           flock: shared while a lab uses the entry, exclusive while it is filled or removed; its
                          mtime is the entry's last use (least recently used goes first)
    .<name>.tmp-<pid>     an entry being filled (or left by a pglab killed while filling: removed by the next fill)

The key (:func:`make_key`: what shapes the files, not what pglab rewrites for every lab), when an entry is used
(:meth:`DatasetCache.problem`: complete and still what it was), where the cache lives, its cap and eviction, and why
every lab from one entry shares its system identifier and password: docs/methodology.md, "The dataset cache".
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pglab.errors import UserError
from pglab.targets.local.dataset.copytree import CopyReport, _fsync_path
from pglab.targets.local.dataset.errors import SnapshotError
from pglab.targets.local.dataset.snapshots import Snapshot, control_data, snapshot

FORMAT = 1  # bump when the fast load builds different files for the same key: older entries are then never used
DEFAULT_MAX_BYTES = 20 * 2**30
MIN_FREE_BYTES = 2**30  # a fill never leaves less than this free on the cache's filesystem
# pg_control records these; a standby refuses to start (or pauses) with a smaller value than its primary had
CONTROL_SETTINGS = ("max_connections", "max_worker_processes", "max_wal_senders", "max_prepared_transactions",
                    "max_locks_per_transaction", "wal_level", "wal_log_hints", "track_commit_timestamp")
INITDB = "-E UTF8 --locale=C --auth=scram-sha-256 -U pglab --waldir"  # as cluster.py runs initdb
INIT_STEPS = "dtgvp"  # pgbench's default steps: what the fast load builds
_CONTROL_FIELDS = ("Database system identifier", "Catalog version number", "pg_control version number",
                   "Database block size", "Bytes per WAL segment", "Data page checksum version")
_OFF = ("0", "off", "false", "no")


def cache_dir() -> Path:
    if os.environ.get("PGLAB_CACHE_DIR"):
        return Path(os.environ["PGLAB_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pglab" / "datasets"


def enabled(plan_says: bool = True) -> bool:
    """The plan's ``dataset.cache``, unless ``PGLAB_CACHE=off`` turns the cache off for every plan."""
    return plan_says and os.environ.get("PGLAB_CACHE", "on").strip().lower() not in _OFF


def max_bytes() -> int:
    from pglab.units import size_bytes

    value = os.environ.get("PGLAB_CACHE_SIZE")
    if not value:
        return DEFAULT_MAX_BYTES
    try:
        return size_bytes(value.strip())
    except ValueError:
        raise UserError(f"PGLAB_CACHE_SIZE: '{value}' is not a size; give one such as 20GiB or 500MB.") from None


# ------------------------------------------------------------------ the key
@dataclass(frozen=True)
class Key:
    """What shapes the files of a loaded dataset; ``name`` is readable and unique for the fields."""

    fields: dict[str, Any]

    @property
    def name(self) -> str:
        digest = hashlib.sha256(json.dumps(self.fields, sort_keys=True).encode()).hexdigest()[:12]
        f = self.fields
        return f"pg{f['major']}-s{f['scale']}-p{f['partitions']}-{digest}"


_BUILDS: dict[tuple[str, int, int], str] = {}


def _build(postgres: Path) -> str:
    """A hash of the postgres executable: two builds of one version (another configure, a patch) differ."""
    st = postgres.stat()
    memo = (str(postgres), st.st_ino, st.st_mtime_ns)
    if memo not in _BUILDS:
        with open(postgres, "rb") as f:
            _BUILDS[memo] = hashlib.file_digest(f, "sha256").hexdigest()[:16]
    return _BUILDS[memo]


def make_key(bindir: Path, *, scale: int, partitions: int | None, owner_uid: int,
             parameters: dict[str, Any]) -> Key:
    postgres = (bindir / "postgres").resolve()
    proc = subprocess.run([str(postgres), "--version"], capture_output=True, text=True, check=False, timeout=30)
    version = proc.stdout.strip()
    if proc.returncode != 0 or not version:
        raise SnapshotError(f"{postgres} --version failed: {proc.stderr.strip()}")
    number = version.split()[-1] if version.split() else "0"
    major = number.split(".")[0].split("beta")[0].split("rc")[0].split("devel")[0] or "0"
    return Key({
        "format": FORMAT, "postgres": version, "major": major, "build": _build(postgres),
        "scale": scale, "partitions": partitions or 0, "init_steps": INIT_STEPS, "fillfactor": 100,
        "initdb": INITDB, "owner_uid": owner_uid,
        "settings": {k: _plain(parameters[k]) for k in CONTROL_SETTINGS if k in parameters},
    })


def _plain(value: Any) -> Any:
    return value if isinstance(value, bool | int | float | str) else str(value)


# ------------------------------------------------------------------ entries
@dataclass
class Entry:
    name: str
    dir: Path
    meta: dict[str, Any]  # entry.json ({} when incomplete)
    bytes: int
    last_used: float
    in_use: bool = False
    complete: bool = True
    password: str = field(default="", repr=False)

    @property
    def snapshot(self) -> Snapshot:
        return Snapshot.load(self.dir)


class Lease:
    """A shared lock on an entry for as long as a lab may restore from it: no eviction or clean removes it."""

    def __init__(self, fd: int):
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the file releases the flock
            self._fd = None


def _tree_size(root: Path) -> tuple[int, int]:
    """Files and bytes under ``root`` (symlinks not followed)."""
    files = size = 0
    for path, _dirs, names in os.walk(root):
        for n in names:
            st = os.lstat(os.path.join(path, n))
            if not os.path.islink(os.path.join(path, n)):
                files += 1
                size += st.st_size
    return files, size


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class DatasetCache:
    """The cache folder: look an entry up, fill one, list, evict and remove entries."""

    def __init__(self, root: Path | None = None, cap: int | None = None):
        self.root = root if root is not None else cache_dir()
        self.cap = cap if cap is not None else max_bytes()

    # -------------------------------------------------------------- locks
    def _ensure_root(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            where = "PGLAB_CACHE_DIR" if os.environ.get("PGLAB_CACHE_DIR") else "XDG_CACHE_HOME or HOME"
            raise SnapshotError(f"cannot create the dataset cache '{self.root}' ({exc.strerror}); set {where} to a "
                                "folder you can write to, or PGLAB_CACHE=off") from None

    def _try_lock(self, name: str, kind: int) -> int | None:
        """The entry's lock file, flocked (``kind``: LOCK_SH or LOCK_EX) without waiting; None when held."""
        fd = os.open(self.root / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    @contextlib.contextmanager
    def _global(self, timeout: float = 60) -> Any:
        """Eviction and reservations of space one process at a time (held for metadata work only, never a copy)."""
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:  # the holder does metadata work only: it is stuck
                        raise SnapshotError(f"the dataset cache '{self.root}' stayed locked for {timeout:.0f} s "
                                            "by another pglab") from None
                    time.sleep(0.1)
            yield
        finally:
            os.close(fd)

    # -------------------------------------------------------------- reading
    def _read(self, name: str) -> Entry:
        d = self.root / name
        lock = self.root / f"{name}.lock"
        try:
            meta = json.loads((d / "entry.json").read_text())
            complete = isinstance(meta, dict)
        except (OSError, ValueError):
            meta, complete = {}, False
        size = int(meta.get("bytes", 0)) if complete else _tree_size(d)[1] if d.is_dir() else 0
        try:
            used = lock.stat().st_mtime
        except OSError:
            used = meta.get("created", 0.0) if complete else 0.0
        return Entry(name, d, meta if complete else {}, size, used, complete=complete)

    def entries(self) -> list[Entry]:
        """Every entry, complete or not, least recently used first; ``in_use`` says which a lab holds."""
        if not self.root.is_dir():
            return []
        out = []
        for d in sorted(self.root.iterdir()):
            if d.name.startswith(".") or not d.is_dir():
                continue
            e = self._read(d.name)
            fd = self._try_lock(d.name, fcntl.LOCK_EX)
            if fd is None:
                e.in_use = True
            else:
                os.close(fd)
            out.append(e)
        return sorted(out, key=lambda e: e.last_used)

    def problem(self, entry: Entry, key: Key, bindir: Path) -> str | None:
        """Why ``entry`` must not be used for ``key`` (None: it may)."""
        if not entry.complete:
            return "incomplete (a fill did not finish)"
        meta = entry.meta
        if meta.get("format") != FORMAT or meta.get("key") != key.fields:
            theirs = meta.get("key", {})
            diff = sorted(k for k in set(theirs) | set(key.fields) if theirs.get(k) != key.fields.get(k))
            return f"made for another key (differs in {', '.join(diff) or 'format'})"
        try:
            snap = entry.snapshot
        except SnapshotError as exc:
            return str(exc)
        control = snap.data / "global" / "pg_control"
        try:
            if _sha256(control) != meta.get("control_sha256"):
                return "its control file is not the one recorded when it was filled"
            version = (snap.data / "PG_VERSION").read_text().strip()
        except OSError as exc:
            return f"unreadable ({exc.strerror})"
        if version != key.fields["major"]:
            return f"its data directory is PostgreSQL {version}'s"
        try:
            now = control_data(bindir, snap.data)
        except (SnapshotError, OSError, subprocess.SubprocessError) as exc:
            return f"pg_controldata cannot read it ({exc})"
        if now.get("Database cluster state") != "shut down":
            return f"not cleanly shut down (state: {now.get('Database cluster state')})"
        recorded = meta.get("control", {})
        changed = [k for k in _CONTROL_FIELDS if now.get(k) != recorded.get(k)]
        if changed:
            return f"its control file differs from the one recorded ({', '.join(changed)})"
        if (_tree_size(snap.data) if snap.wal.is_relative_to(snap.data) else
                tuple(map(sum, zip(_tree_size(snap.data), _tree_size(snap.wal), strict=True)))) != \
                (meta.get("files"), meta.get("tree_bytes")):
            return "its files are not those recorded (some missing, added or truncated)"
        return None

    # -------------------------------------------------------------- use
    def lookup(self, key: Key, bindir: Path) -> tuple[Entry, Lease] | str:
        """The entry for ``key``, leased to the caller, or why there is none to use (a miss)."""
        if not (self.root / key.name).is_dir():
            return "no entry"
        deadline = time.monotonic() + 2  # a list or an eviction holds the lock for a moment; a fill holds it long
        while (fd := self._try_lock(key.name, fcntl.LOCK_SH)) is None:
            if time.monotonic() > deadline:
                return "another pglab is filling or removing it"
            time.sleep(0.1)
        entry = self._read(key.name)
        why = self.problem(entry, key, bindir)
        if why is not None:
            os.close(fd)
            return f"entry {key.name} not used: {why}"
        try:
            entry.password = (entry.dir / "secret").read_text().strip()
        except OSError as exc:
            os.close(fd)
            return f"entry {key.name} not used: no readable secret ({exc.strerror})"
        os.utime(self.root / f"{key.name}.lock")  # the entry's last use
        return entry, Lease(fd)

    # -------------------------------------------------------------- fill
    def store(self, key: Key, data_dir: Path, wal_dir: Path, *, bindir: Path, password: str,
              log: Any = lambda _m: None) -> tuple[Entry, Lease, CopyReport] | str:
        """Snapshot the cleanly stopped cluster into a new entry for ``key`` and lease it to the caller; or say
        why not (it is being filled by another pglab, it exists already, it would not fit)."""
        self._ensure_root()
        fd = self._try_lock(key.name, fcntl.LOCK_EX)
        if fd is None:
            return "another pglab is filling or using this key"
        try:
            dest = self.root / key.name
            if (dest / "entry.json").is_file():  # filled meanwhile by another pglab: keep theirs
                return "filled meanwhile by another pglab"
            for stale in [*self.root.glob(f".{key.name}.tmp-*"), *([dest] if dest.exists() else [])]:
                shutil.rmtree(stale, ignore_errors=True)  # left by a fill that died (we hold the key's lock)
            need = sum(_tree_size(d)[1] for d in (data_dir, wal_dir))
            if need > self.cap:
                return f"the dataset ({need / 2**30:.1f} GiB) is larger than the cache's cap " \
                       f"({self.cap / 2**30:.1f} GiB, PGLAB_CACHE_SIZE)"
            with self._global():
                self.clean_leftovers()  # fills that died: their space is not in any entry's size
                evicted = self._evict(self.cap - need)
                st = os.statvfs(self.root)
                free = st.f_bavail * st.f_frsize
                if free - need < MIN_FREE_BYTES:
                    return f"{free / 2**30:.1f} GiB free on the cache's filesystem, {need / 2**30:.1f} GiB needed " \
                           f"and {MIN_FREE_BYTES / 2**30:.0f} GiB kept free"
            for name in evicted:
                log(f"dataset cache: evicted {name} (least recently used)")
            try:
                snap, copy = snapshot(data_dir, wal_dir, dest, bindir=bindir)
                (dest / "secret").touch(mode=0o600)
                (dest / "secret").write_text(password + "\n")
                _fsync_path(dest / "secret")
                control = snap.data / "global" / "pg_control"
                files, tree_bytes = map(sum, zip(_tree_size(snap.data), _tree_size(snap.wal), strict=True))
                meta = {
                    "format": FORMAT, "key": key.fields, "created": time.time(),
                    "control_sha256": _sha256(control),
                    "control": {k: v for k, v in control_data(bindir, snap.data).items() if k in _CONTROL_FIELDS},
                    "files": files, "tree_bytes": tree_bytes, "bytes": copy.bytes,
                    "dataset": {"scale": key.fields["scale"], "partitions": key.fields["partitions"]},
                }
                tmp = dest / "entry.json.tmp"
                tmp.write_text(json.dumps(meta, indent=1))
                _fsync_path(tmp)
                os.rename(tmp, dest / "entry.json")  # complete from here on
                _fsync_path(dest)
            except BaseException:
                shutil.rmtree(dest, ignore_errors=True)
                raise
            os.utime(self.root / f"{key.name}.lock")
            entry = self._read(key.name)
            entry.password = password
            fcntl.flock(fd, fcntl.LOCK_SH)  # from filling to using: the lab restores from it from now on
            lease, fd = Lease(fd), -1
            return entry, lease, copy
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                return f"no space left in '{self.root}'"
            raise
        finally:
            if fd >= 0:
                os.close(fd)

    # -------------------------------------------------------------- eviction and removal
    def _evict(self, budget: int) -> list[str]:
        """Remove least recently used entries not in use until the rest fit in ``budget`` bytes."""
        entries = self.entries()
        total = sum(e.bytes for e in entries)
        evicted = []
        for e in entries:
            if total <= budget:
                break
            if self.remove(e.name):
                total -= e.bytes
                evicted.append(e.name)
        return evicted

    def remove(self, name: str) -> bool:
        """Remove an entry unless a lab uses it or another pglab fills it; True when removed."""
        fd = self._try_lock(name, fcntl.LOCK_EX)
        if fd is None:
            return False
        trash = self.root / f".{name}.tmp-removing-{os.getpid()}"
        try:
            d = self.root / name
            if d.exists():
                os.rename(d, trash)  # gone at once for a reader; the files go after, the lock released
            (self.root / f"{name}.lock").unlink(missing_ok=True)
        finally:
            os.close(fd)
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def clean_leftovers(self) -> list[str]:
        """Temporary folders of fills that died (their key's lock is free); returns what was removed."""
        removed = []
        for p in self.root.glob(".*.tmp-*") if self.root.is_dir() else []:
            name = p.name[1:].split(".tmp-", 1)[0]
            fd = self._try_lock(name, fcntl.LOCK_EX)
            if fd is None:
                continue
            try:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p.name)
            finally:
                os.close(fd)
            if not (self.root / name).exists():
                (self.root / f"{name}.lock").unlink(missing_ok=True)
        return removed
