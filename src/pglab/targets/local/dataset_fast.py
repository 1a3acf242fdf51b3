"""Fast dataset reuse: load once on a lone primary, snapshot the stopped cluster, restore the snapshot between runs.

Why: ``pgbench -i`` on the lab as it runs (wal_level=replica, standbys streaming) writes every row twice, in the
table and in the WAL, and the standbys replay it all; re-loading before every run that asks for a fresh dataset
costs that again each time. Here the dataset is loaded once with the settings that skip the WAL of a table created
in the loading transaction (wal_level=minimal), the stopped cluster is copied aside, and a reset puts it back: a
reflink copy (metadata only) where the filesystem supports it, else the old cluster patched where it stands (only
the blocks a run changed are written back), else a full in-kernel copy.

The pieces, in the order the lab uses them:

- :func:`fast_load_settings` — server settings and loading strategy for the first load on a primary alone;
- :func:`fast_load` — loads the pgbench dataset with them (pgbench's own steps, or partitions in parallel);
- :func:`sync_tree` — makes the data and WAL directories durable (required when the load ran with fsync=off);
- :func:`snapshot` — copies a cleanly stopped cluster aside (refuses one that is not "shut down");
- :func:`restore` / :func:`make_standby` — puts the snapshot back as a primary or as a standby, atomically;
- :func:`reflink_supported`, :func:`filesystem_type` — which copy a pair of directories allows.

Server start and stop stay with the lab (cluster.py); nothing here starts a server.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import stat
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from pglab.plan.schema import Dataset
from pglab.targets.base import Endpoint

ACCOUNTS_PER_SCALE = 100_000  # pgbench's naccounts
TELLERS_PER_SCALE = 10
FICLONE = 0x40049409  # _IOW(0x94, 9, int): clone a whole file (btrfs, XFS with reflink=1, bcachefs, OCFS2)
_SEGMENT = re.compile(r"^[0-9A-F]{24}$")
_COPY_THREADS = 4  # copies overlap the kernel's writeback; more threads than that only add seeks
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EBADF}


class SnapshotError(Exception):
    """A snapshot cannot be taken or restored; the message says which directory and why."""


# ------------------------------------------------------------------ the first load
@dataclass(frozen=True)
class FastLoad:
    """How to load the first dataset on a primary alone.

    ``parameters`` go on top of the lab's settings for the load only (wal_level needs a restart, so start the
    primary with them); afterwards the lab's own settings are written back and the server restarted once, so that
    the snapshot's last checkpoint carries wal_level=replica, which standbys need.
    """

    parameters: dict[str, Any]
    pgbench_args: list[str]  # pgbench -i, steps dt: drops and creates the tables and partitions as pgbench does
    parallel: int  # connections loading, vacuuming and indexing tables (partitions) at once
    synced_by_server: bool  # False when fsync=off: sync_tree() after the clean stop is what makes it durable
    notes: list[str] = field(default_factory=list)


def fast_load_settings(bindir: Path, dataset: Dataset, *, cores: int | None = None,
                       memory_bytes: int | None = None, fsync: bool = False) -> FastLoad:
    """Settings for the fastest safe first load of ``dataset`` on a primary with no standby.

    Safe because nothing else depends on the server while it loads: a crash in that window loses only the load,
    which is started again from initdb. It is made durable by a clean stop and :func:`sync_tree` before the
    snapshot. ``fsync=False`` (the default) skips the per-commit flush of the new files: the kernel writes them
    back while the vacuum and index build run, instead of the load waiting for the disk.
    """
    cores = cores or os.cpu_count() or 1
    memory_bytes = memory_bytes or _memory_bytes()
    mwm_mb = max(64, min(2048, memory_bytes // 16 // 2**20))  # a 16th of the memory, at most 2 GB
    params: dict[str, Any] = {
        "wal_level": "minimal",  # tables created or truncated in the loading transaction are not WAL-logged
        "max_wal_senders": 0,  # required by wal_level=minimal
        "archive_mode": "off",
        "synchronous_commit": "off",
        "fsync": fsync,
        "full_page_writes": fsync,  # torn pages only matter after a crash, and a crash restarts the load
        "autovacuum": False,  # the load vacuums and analyzes itself; a worker would compete for the 2 cores
        "checkpoint_timeout": "1d",  # no checkpoint in the middle of the load: one, at the clean stop
        "max_wal_size": "64GB",
        "maintenance_work_mem": f"{mwm_mb}MB",  # the primary key sort in memory, not in temp files
        "max_parallel_maintenance_workers": max(1, cores - 1),  # the leader builds too: one process per core
        "synchronous_standby_names": "",
    }
    partitions = dataset.partitions or 0
    parallel = max(1, min(partitions, cores))
    pgbench = [str(bindir / "pgbench"), "-i", "-s", str(dataset.scale), "-q", "--init-steps=dt"]
    if partitions:
        pgbench.append(f"--partitions={partitions}")
    notes = ["pgbench creates the tables (steps dt); rows by binary COPY ... FREEZE into each table truncated in the "
             "same transaction (no WAL, frozen and all-visible as written, so the vacuum has nothing to write)"]
    if parallel > 1:
        notes.append(f"{partitions} partitions loaded, vacuumed and indexed {parallel} at a time")
    return FastLoad(params, pgbench, parallel, synced_by_server=bool(fsync), notes=notes)


def _memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return 4 * 2**30


@dataclass
class LoadReport:
    seconds: float
    steps: dict[str, float]  # step name → seconds
    parallel: int


def fast_load(endpoint: Endpoint, dataset: Dataset, load: FastLoad, out_dir: Path) -> LoadReport:
    """Load the pgbench dataset as ``load`` says, on a server already running with ``load.parameters``.

    The result is the dataset ``pgbench -i`` builds: pgbench itself creates the tables and partitions; then the
    same rows, vacuumed and analyzed, the same primary keys (constraint and index names). Only the way differs:
    binary COPY (no text to format and parse), FREEZE, partitions side by side.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    steps: dict[str, float] = {}
    t0 = time.monotonic()
    _run_pgbench(load.pgbench_args, endpoint, out_dir / "pgbench-init.out")
    steps["create tables (pgbench dt)"] = time.monotonic() - t0
    _load_rows(endpoint, dataset, load.parallel, steps)
    return LoadReport(time.monotonic() - t0, steps, load.parallel)


def _run_pgbench(args: list[str], endpoint: Endpoint, out: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | endpoint.env()
    with open(out, "w") as f:
        proc = subprocess.run(args, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                              check=False, cwd=out.parent)
    if proc.returncode != 0:
        tail = out.read_text().strip().splitlines()[-2:]
        raise SnapshotError(f"pgbench -i failed: {' / '.join(tail) or f'exit code {proc.returncode}'}")


def partition_ranges(scale: int, partitions: int) -> list[tuple[int, int]]:
    """The aid range of each range partition, as pgbench computes its partition bounds."""
    total = ACCOUNTS_PER_SCALE * scale
    size = (total + partitions - 1) // partitions
    return [(p * size + 1, min((p + 1) * size, total)) for p in range(partitions)]


_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # signature, flags 0, no header extension
_ACCOUNT_ROW = np.dtype([("fields", ">i2"), ("aid_len", ">i4"), ("aid", ">i4"), ("bid_len", ">i4"), ("bid", ">i4"),
                         ("abalance_len", ">i4"), ("abalance", ">i4"), ("filler_len", ">i4")])


def account_rows(first: int, last: int, chunk: int = 1 << 20) -> Iterator[bytes]:
    """pgbench_accounts rows ``first``..``last`` in COPY's binary format, as pgbench generates them: bid from aid,
    abalance 0, filler empty (char(84) pads it to blanks)."""
    yield _COPY_HEADER
    for lo in range(first, last + 1, chunk):
        aid = np.arange(lo, min(last, lo + chunk - 1) + 1, dtype=np.int64)
        rows = np.zeros(len(aid), _ACCOUNT_ROW)
        rows["fields"] = 4
        rows["aid_len"] = rows["bid_len"] = rows["abalance_len"] = 4
        rows["aid"] = aid
        rows["bid"] = (aid - 1) // ACCOUNTS_PER_SCALE + 1
        yield rows.tobytes()
    yield b"\xff\xff"


def _load_rows(endpoint: Endpoint, dataset: Dataset, parallel: int, steps: dict[str, float]) -> None:
    """pgbench's g, v and p steps, a table (a partition) per connection at a time.

    Each table is truncated in the transaction that fills it: with wal_level=minimal its rows skip the WAL, and
    COPY FREEZE writes them frozen and all-visible, as pgbench's own client-side COPY does for an unpartitioned
    table. Primary keys are built on the partitions first; the partitioned table's key then attaches them.
    """
    scale, partitions = dataset.scale, dataset.partitions or 0
    conninfo = endpoint.conninfo(application_name="pglab-load")
    tables = ([(f"pgbench_accounts_{p}", lo, hi) for p, (lo, hi) in enumerate(partition_ranges(scale, partitions), 1)]
              if partitions else [("pgbench_accounts", 1, ACCOUNTS_PER_SCALE * scale)])

    def each(work: Callable[[psycopg.Connection[Any], str, int, int], object], session: list[str]) -> None:
        jobs = list(tables)
        lock = threading.Lock()
        failed = threading.Event()

        def worker() -> None:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                for s in session:
                    conn.execute(s)
                while not failed.is_set():
                    with lock:
                        if not jobs:
                            return
                        table, lo, hi = jobs.pop(0)
                    try:
                        work(conn, table, lo, hi)
                    except BaseException:
                        failed.set()
                        raise

        with ThreadPoolExecutor(parallel) as pool:
            for f in [pool.submit(worker) for _ in range(min(parallel, len(tables)))]:
                f.result()

    def copy(conn: psycopg.Connection[Any], table: str, lo: int, hi: int) -> None:
        with conn.transaction():
            conn.execute(f"TRUNCATE {table}")
            with conn.cursor().copy(f"COPY {table} FROM STDIN (FORMAT binary, FREEZE)") as cp:
                for chunk in account_rows(lo, hi):
                    cp.write(chunk)

    t = time.monotonic()
    with psycopg.connect(conninfo, autocommit=True) as conn, conn.transaction():
        conn.execute("TRUNCATE pgbench_branches, pgbench_tellers, pgbench_history")
        conn.execute(f"INSERT INTO pgbench_branches(bid, bbalance) SELECT bid, 0 FROM generate_series(1, {scale}) bid")
        conn.execute(f"INSERT INTO pgbench_tellers(tid, bid, tbalance) SELECT tid, (tid - 1) / {TELLERS_PER_SCALE} + 1,"
                     f" 0 FROM generate_series(1, {TELLERS_PER_SCALE * scale}) tid")
    each(copy, [])
    steps["rows (binary COPY FREEZE)"] = time.monotonic() - t
    t = time.monotonic()
    # partitions: VACUUM side by side, then one ANALYZE of the partitioned table, which analyzes each partition
    # too (as pgbench's "vacuum analyze pgbench_accounts" does): analyzing them here as well would do it twice
    each(lambda conn, table, _lo, _hi: conn.execute(f"VACUUM {table}" if partitions else f"VACUUM ANALYZE {table}"),
         [])
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for table in ("pgbench_branches", "pgbench_tellers", "pgbench_history"):
            conn.execute(f"VACUUM ANALYZE {table}")
        if partitions:
            conn.execute("ANALYZE pgbench_accounts")
    steps["vacuum analyze"] = time.monotonic() - t
    t = time.monotonic()
    session: list[str] = []
    if parallel > 1:  # one core per partition: no parallel workers on top, and the memory shared out
        with psycopg.connect(conninfo, autocommit=True) as conn:
            mwm = conn.execute("SHOW maintenance_work_mem").fetchone()
        session = [f"SET maintenance_work_mem = '{_split_memory(str(mwm[0]) if mwm else '64MB', parallel)}'",
                   "SET max_parallel_maintenance_workers = 0"]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("ALTER TABLE pgbench_branches ADD PRIMARY KEY (bid)")
        conn.execute("ALTER TABLE pgbench_tellers ADD PRIMARY KEY (tid)")
    each(lambda conn, table, _lo, _hi: conn.execute(f"ALTER TABLE {table} ADD PRIMARY KEY (aid)"), session)
    if partitions:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("ALTER TABLE pgbench_accounts ADD PRIMARY KEY (aid)")  # attaches the partitions' keys
    steps["primary keys"] = time.monotonic() - t


def _split_memory(value: str, parts: int) -> str:
    m = re.fullmatch(r"(\d+)\s*(kB|MB|GB|TB)?", value.strip())
    if not m:
        return value
    kb = int(m.group(1)) * {"kB": 1, "MB": 1024, "GB": 1024**2, "TB": 1024**3, None: 1}[m.group(2)]
    return f"{max(1024, kb // parts)}kB"


# ------------------------------------------------------------------ durability and state
def sync_tree(*roots: Path) -> float:
    """fsync every file and directory under ``roots``, following a data directory's pg_wal symlink.

    What ``initdb --sync-only`` does, in this process (it may be root, the files belong to the server user).
    Returns seconds taken.
    """
    t0 = time.monotonic()
    files: list[Path] = []
    dirs: list[Path] = []
    for root in roots:
        for path, is_dir in _walk(root):
            (dirs if is_dir else files).append(path)
    _all(_fsync_path, [(f,) for f in files])
    for d in dirs:
        _fsync_path(d)
    return time.monotonic() - t0


def _walk(root: Path) -> Iterator[tuple[Path, bool]]:
    """Every regular file and directory under root; the pg_wal symlink is followed, other symlinks are not."""
    stack = [root]
    while stack:
        d = stack.pop()
        yield d, True
        with os.scandir(d) as it:
            for e in it:
                p = Path(e.path)
                if e.is_symlink():
                    if e.name == "pg_wal" and p.is_dir():
                        stack.append(p.resolve())
                elif e.is_dir():
                    stack.append(p)
                elif e.is_file():
                    yield p, False


def _all(fn: Callable[..., None], jobs: list[tuple[Any, ...]]) -> None:
    """``fn(*job)`` for every job on a few threads (the work is in the kernel, the GIL is released); the first
    error stops what has not started and is raised."""
    with ThreadPoolExecutor(_COPY_THREADS) as pool:
        futures = [pool.submit(fn, *job) for job in jobs]
        try:
            for f in futures:
                f.result()
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


# ------------------------------------------------------------------ copying trees
@dataclass
class CopyReport:
    """What a snapshot or restore did: how the bytes were copied, how many, how long."""

    method: str  # "reflink", "copy_file_range" or "read/write": the method that copied most bytes
    methods: dict[str, int]  # bytes per method
    files: int
    bytes: int
    seconds: float  # wall time, copy and fsync included
    sync_seconds: float  # of which: the final fsync of files and directories
    filesystems: dict[str, str]  # path → filesystem type, from /proc/mounts
    skipped_wal_segments: int = 0
    compared_bytes: int = 0  # "patch": bytes of the old cluster compared with the snapshot
    rewritten_bytes: int = 0  # "patch": bytes written back because they differed (or were missing)
    removed: int = 0  # "patch": files and directories the snapshot does not have


class _Copier:
    """Copies trees file by file: reflink if the filesystem can, else copy_file_range, else read/write.

    Ownership, modes and modification times are kept (the files belong to the server user). ``durable`` fsyncs
    every file and directory written before returning, so no writeback of the copy runs into the next benchmark.
    """

    def __init__(self, method: str = "auto", durable: bool = True):
        if method not in ("auto", "reflink", "copy"):
            raise ValueError(f"method must be auto, reflink or copy, not {method!r}")
        self.method = method
        self.durable = durable
        self.bytes_by: Counter[str] = Counter()
        self.files = 0
        self._lock = threading.Lock()
        self._written: list[Path] = []
        self._dirs: list[tuple[Path, os.stat_result]] = []

    def tree(self, src: Path, dst: Path, *, skip: Callable[[Path], bool] = lambda _p: False,
             symlinks: dict[str, str] | None = None) -> None:
        """Copy directory ``src`` to a new ``dst``. ``symlinks`` names top-level entries (pg_wal) to write as
        symlinks to the given targets instead of copying what src has there."""
        symlinks = symlinks or {}
        jobs: list[tuple[Path, Path, os.stat_result]] = []
        top = src.lstat()
        self._mkdir(dst, top)
        stack = [(src, dst)]
        while stack:
            s_dir, d_dir = stack.pop()
            with os.scandir(s_dir) as it:
                entries = sorted(it, key=lambda e: e.name)
            for e in entries:
                s, d = Path(e.path), d_dir / e.name
                if s_dir == src and e.name in symlinks:
                    continue
                if skip(s):
                    continue
                st = e.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    self._mkdir(d, st)
                    stack.append((s, d))
                elif stat.S_ISREG(st.st_mode):
                    jobs.append((s, d, st))
                elif stat.S_ISLNK(st.st_mode):
                    os.symlink(os.readlink(s), d)
                    os.lchown(d, st.st_uid, st.st_gid)
                else:
                    raise SnapshotError(f"'{s}': not a file, directory or symlink; cannot copy it")
        for name, target in symlinks.items():
            link = dst / name
            os.symlink(target, link)
            os.lchown(link, top.st_uid, top.st_gid)
        jobs.sort(key=lambda j: -j[2].st_size)  # the largest first: the pool ends together
        _all(self._file, jobs)

    def _mkdir(self, d: Path, st: os.stat_result) -> None:
        d.mkdir(mode=0o700)
        os.chown(d, st.st_uid, st.st_gid)
        os.chmod(d, stat.S_IMODE(st.st_mode))
        self._dirs.append((d, st))

    def _file(self, src: Path, dst: Path, st: os.stat_result) -> None:
        fin = os.open(src, os.O_RDONLY)
        try:
            fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                how = self._copy_data(fin, fout, st.st_size)
                os.fchown(fout, st.st_uid, st.st_gid)
                os.fchmod(fout, stat.S_IMODE(st.st_mode))
                os.utime(fout, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(fout)
        finally:
            os.close(fin)
        with self._lock:
            self.bytes_by[how] += st.st_size
            self.files += 1
            self._written.append(dst)

    def _copy_data(self, fin: int, fout: int, size: int) -> str:
        if self.method in ("auto", "reflink"):
            try:
                fcntl.ioctl(fout, FICLONE, fin)
                return "reflink"
            except OSError as exc:
                if self.method == "reflink" or exc.errno not in _UNSUPPORTED:
                    raise SnapshotError(f"reflink copy refused by the filesystem: {exc.strerror}") from None
        done = 0
        try:
            while done < size:
                n = os.copy_file_range(fin, fout, min(size - done, 1 << 30), done, done)
                if n == 0:
                    break
                done += n
            if done >= size:
                return "copy_file_range"
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
        while True:  # the rest, by hand (another filesystem type, a kernel without copy_file_range)
            chunk = os.pread(fin, 1 << 20, done)
            if not chunk:
                return "read/write"
            os.pwrite(fout, chunk, done)
            done += len(chunk)

    def finish(self) -> float:
        """Directory times as in the source; fsync everything written. Returns the fsync seconds."""
        for d, st in reversed(self._dirs):  # children first: setting a time on a parent is not undone by a child
            os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
        if not self.durable:
            return 0.0
        t0 = time.monotonic()
        _all(_fsync_path, [(p,) for p in self._written])
        for d, _st in self._dirs:
            _fsync_path(d)
        return time.monotonic() - t0

    def report(self, seconds: float, sync_seconds: float, paths: list[Path], skipped: int = 0) -> CopyReport:
        main = self.bytes_by.most_common(1)[0][0] if self.bytes_by else "none"
        return CopyReport(main, dict(self.bytes_by), self.files, sum(self.bytes_by.values()), seconds,
                          sync_seconds, {str(p): filesystem_type(p) for p in paths}, skipped)


class _Patcher(_Copier):
    """Turns the old copy of a cluster into the snapshot where it stands, writing only what differs.

    Why: without reflinks a full copy writes the whole dataset again, and the disk must absorb it before the next
    run; a benchmark run changes a small part of the blocks. Every byte is compared (no trust in sizes or times),
    so the result is the snapshot byte for byte: extra files removed, missing ones copied, differing 8 KiB blocks
    written back, sizes, owners, modes and times set. Every file is fsynced at the end, which also flushes what
    the server wrote before an immediate stop.
    """

    CHUNK = 4 << 20
    BLOCK = 8192

    def __init__(self, durable: bool = True):
        super().__init__("copy", durable)
        self.compared = 0
        self.rewritten = 0
        self.removed = 0

    def sync(self, src: Path, dst: Path, symlinks: dict[str, str]) -> None:
        """Make directory ``dst`` what ``src`` is; ``symlinks`` as in :meth:`_Copier.tree`."""
        patch: list[tuple[Path, Path, os.stat_result]] = []
        copy: list[tuple[Path, Path, os.stat_result]] = []
        top = src.lstat()
        self._fix_dir(dst, top)
        stack = [(src, dst)]
        while stack:
            s_dir, d_dir = stack.pop()
            with os.scandir(s_dir) as it:
                s_ents = {e.name: e for e in it}
            with os.scandir(d_dir) as it:
                d_ents = {e.name: e.stat(follow_symlinks=False) for e in it}
            for name in d_ents.keys() - s_ents.keys():
                if not (s_dir == src and name in symlinks):
                    self._remove(d_dir / name)
            for name, e in sorted(s_ents.items()):
                s, d, st, old = Path(e.path), d_dir / name, e.stat(follow_symlinks=False), d_ents.get(name)
                if s_dir == src and name in symlinks:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    if old is not None and stat.S_ISDIR(old.st_mode):
                        self._fix_dir(d, st)
                    else:
                        if old is not None:
                            self._remove(d)
                        self._mkdir(d, st)
                    stack.append((s, d))
                elif stat.S_ISREG(st.st_mode):
                    if old is not None and stat.S_ISREG(old.st_mode):
                        patch.append((s, d, st))
                    else:
                        if old is not None:
                            self._remove(d)
                        copy.append((s, d, st))
                elif stat.S_ISLNK(st.st_mode):
                    if old is None or not stat.S_ISLNK(old.st_mode) or os.readlink(d) != os.readlink(s):
                        if old is not None:
                            self._remove(d)
                        os.symlink(os.readlink(s), d)
                    os.lchown(d, st.st_uid, st.st_gid)
                else:
                    raise SnapshotError(f"'{s}': not a file, directory or symlink; cannot copy it")
        for name, target in symlinks.items():
            link = dst / name
            if not (link.is_symlink() and os.readlink(link) == target):
                if os.path.lexists(link):
                    self._remove(link)
                os.symlink(target, link)
            os.lchown(link, top.st_uid, top.st_gid)
        patch.sort(key=lambda j: -j[2].st_size)
        copy.sort(key=lambda j: -j[2].st_size)
        _all(self._patch, patch)
        _all(self._file, copy)
        with self._lock:
            self.rewritten += sum(j[2].st_size for j in copy)

    def _fix_dir(self, d: Path, st: os.stat_result) -> None:
        os.chown(d, st.st_uid, st.st_gid)
        os.chmod(d, stat.S_IMODE(st.st_mode))
        self._dirs.append((d, st))

    def _remove(self, p: Path) -> None:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
        with self._lock:
            self.removed += 1

    def _patch(self, src: Path, dst: Path, st: os.stat_result) -> None:
        fin = os.open(src, os.O_RDONLY)
        try:
            fout = os.open(dst, os.O_RDWR)
            try:
                size, have = st.st_size, os.fstat(fout).st_size
                written = 0
                if have > size:
                    os.ftruncate(fout, size)
                    have = size
                off = 0
                while off < have:
                    want = os.pread(fin, min(self.CHUNK, have - off), off)
                    got = os.pread(fout, len(want), off)
                    if want != got:
                        written += self._write_differences(fout, want, got, off)
                    off += len(want)
                if have < size:
                    written += size - have
                    self._copy_tail(fin, fout, have, size)
                os.fchown(fout, st.st_uid, st.st_gid)
                os.fchmod(fout, stat.S_IMODE(st.st_mode))
                os.utime(fout, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(fout)
        finally:
            os.close(fin)
        with self._lock:
            self.compared += have
            self.rewritten += written
            self.bytes_by["patch"] += size
            self.files += 1
            self._written.append(dst)

    def _write_differences(self, fd: int, want: bytes, got: bytes, off: int) -> int:
        """Write back the 8 KiB blocks of ``want`` that differ from ``got``, runs of them in one write."""
        if len(want) != len(got) or len(want) % self.BLOCK:
            os.pwrite(fd, want, off)
            return len(want)
        a = np.frombuffer(want, dtype=np.uint64).reshape(-1, self.BLOCK // 8)
        b = np.frombuffer(got, dtype=np.uint64).reshape(-1, self.BLOCK // 8)
        blocks = np.flatnonzero((a != b).any(axis=1)).tolist()
        written = 0
        i = 0
        while i < len(blocks):
            j = i
            while j + 1 < len(blocks) and blocks[j + 1] == blocks[j] + 1:
                j += 1
            lo, hi = blocks[i] * self.BLOCK, (blocks[j] + 1) * self.BLOCK
            os.pwrite(fd, want[lo:hi], off + lo)
            written += hi - lo
            i = j + 1
        return written

    def _copy_tail(self, fin: int, fout: int, start: int, size: int) -> None:
        done = start
        with contextlib.suppress(OSError):
            while done < size:
                n = os.copy_file_range(fin, fout, size - done, done, done)
                if n == 0:
                    break
                done += n
        while done < size:
            chunk = os.pread(fin, min(1 << 20, size - done), done)
            if not chunk:
                raise SnapshotError(f"'{fin}': the snapshot file is shorter than it was")
            os.pwrite(fout, chunk, done)
            done += len(chunk)


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding ``path`` (ext4, xfs, btrfs, tmpfs …), from /proc/mounts."""
    path = path.resolve()
    while not path.exists():
        path = path.parent
    best, kind = "", "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) < 3:
                continue
            mnt = parts[1].replace("\\040", " ")
            if (path == Path(mnt) or path.is_relative_to(mnt)) and len(mnt) >= len(best):
                best, kind = mnt, parts[2]
    return kind


def reflink_supported(src_dir: Path, dst_dir: Path) -> bool:
    """Whether a file in ``src_dir`` can be reflinked into ``dst_dir`` (tried on a small file, then removed)."""
    a = src_dir / f".pglab-reflink-probe-{os.getpid()}"
    b = dst_dir / f".pglab-reflink-probe-{os.getpid()}.copy"
    try:
        a.write_bytes(b"x" * 4096)
        fin = os.open(a, os.O_RDONLY)
        try:
            fout = os.open(b, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                fcntl.ioctl(fout, FICLONE, fin)
                return True
            except OSError:
                return False
            finally:
                os.close(fout)
        finally:
            os.close(fin)
    finally:
        a.unlink(missing_ok=True)
        b.unlink(missing_ok=True)


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
    ``wal_dest`` on the WAL's) for reflink copies.
    """
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
    copy a standby of the primary restored from the same snapshot.
    """
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


def describe(report: CopyReport) -> dict[str, Any]:
    """A report as plain JSON data."""
    return asdict(report)
