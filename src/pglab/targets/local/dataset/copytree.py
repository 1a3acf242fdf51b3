"""Copying and syncing a cluster's directories: reflink where the filesystem can, else copy_file_range, else
read/write; a patch that writes back only the blocks that differ; fsync of whole trees.

Ownership, modes and times are kept (the files belong to the server user). Knows directories and files, not what
a cluster is: the snapshot rules (clean stop, which WAL to keep, atomic swaps) are in snapshots.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pglab import interrupts
from pglab.targets.local.dataset.errors import SnapshotError

FICLONE = 0x40049409  # _IOW(0x94, 9, int): clone a whole file (btrfs, XFS with reflink=1, bcachefs, OCFS2)
_COPY_THREADS = 4  # copies overlap the kernel's writeback; more threads than that only add seeks
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EBADF}
_SYNC_FILE_RANGE = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)  # Linux, glibc and musl
if _SYNC_FILE_RANGE is not None:
    _SYNC_FILE_RANGE.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writing the range's dirty pages back, do not wait


# ------------------------------------------------------------------ durability and state
def sync_tree(*roots: Path) -> float:
    """fsync every file and directory under ``roots``, following a data directory's pg_wal symlink.

    What ``initdb --sync-only`` does, in this process (it may be root, the files belong to the server user).
    Returns seconds taken."""
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
    error, or a recorded Ctrl-C or SIGTERM, stops what has not started and is raised."""
    with ThreadPoolExecutor(_COPY_THREADS) as pool:
        futures = [pool.submit(fn, *job) for job in jobs]
        try:
            interrupts.wait_all(futures)  # every job done, or one failed: the done ones first, so a failure is raised
            for f in sorted(futures, key=lambda f: not f.done()):  # at once, not after the jobs still running
                f.result()
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def _start_writeback(fd: int) -> None:
    """Ask the kernel to start writing ``fd``'s dirty pages now, without waiting (``sync_file_range`` with
    SYNC_FILE_RANGE_WRITE, as PostgreSQL's ``initdb --sync-only`` does before its fsyncs). Why: a copy's pages then
    go to the disk while the next files are copied, and the fsyncs at the end mostly find them written (restoring
    the cached dataset: build 0.46 s shorter, docs/benchmarks.md). A hint only: where the call is missing or
    refused, the fsync writes them all as before."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    every file and directory written before returning, so no writeback of the copy runs into the next benchmark."""

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
        self._fix_dir(d, st)

    def _fix_dir(self, d: Path, st: os.stat_result) -> None:
        os.chown(d, st.st_uid, st.st_gid)
        os.chmod(d, stat.S_IMODE(st.st_mode))
        self._dirs.append((d, st))

    def _file(self, src: Path, dst: Path, st: os.stat_result) -> None:
        fin = os.open(src, os.O_RDONLY)
        try:
            fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                how = self._copy_data(fin, fout, st.st_size)
                if self.durable and how != "reflink":
                    _start_writeback(fout)
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
    the server wrote before an immediate stop."""

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


def describe(report: CopyReport) -> dict[str, Any]:
    """A report as plain JSON data."""
    return asdict(report)
