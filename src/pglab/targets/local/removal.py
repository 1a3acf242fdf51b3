"""Removing a lab's directories quickly: what ``shutil.rmtree(path, ignore_errors=True)`` does, with the unlinks
issued from several threads.

A 3-node lab at scale 10 is about 5,000 files (each data directory's catalogs, the dataset's snapshot). One after
the other, their unlinks took 9–14 s on the project's 2-core machine while other work kept its disk busy (each one
waits for the filesystem's journal); issued from 16 threads, the same unlinks share journal commits and took under a
fifth of that (bench/duty_cycle.py, docs/benchmarks.md). Every name is resolved in its directory's open descriptor
(O_NOFOLLOW), as rmtree does, so a symlink planted in a lab is removed, never followed."""

from __future__ import annotations

import contextlib
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

WORKERS = 16  # the unlinks wait on the journal, not the CPU: more threads than cores
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def remove_tree(path: Path, workers: int = WORKERS) -> None:
    """Remove ``path`` and everything under it, ignoring errors (what cannot be removed stays, as with rmtree)."""
    try:
        top = os.open(path, _DIR_FLAGS)
    except OSError:  # absent, a symlink, not a directory: rmtree's own handling (nothing, or an error ignored)
        shutil.rmtree(path, ignore_errors=True)
        return
    dirs: list[tuple[int, int | None, str]] = [(top, None, "")]  # (fd, parent's fd, name): parents first
    files: list[tuple[int, str]] = []
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        i = 0
        while i < len(dirs):
            fd = dirs[i][0]
            i += 1
            with contextlib.suppress(OSError), os.scandir(fd) as entries:
                for e in entries:
                    if e.is_dir(follow_symlinks=False):
                        with contextlib.suppress(OSError):
                            dirs.append((os.open(e.name, _DIR_FLAGS, dir_fd=fd), fd, e.name))
                            continue
                    files.append((fd, e.name))  # files, symlinks (to directories too), anything else
        for _ in pool.map(_unlink, files):
            pass
        for _fd, parent, name in reversed(dirs):  # children before their parents
            if parent is not None:
                with contextlib.suppress(OSError):
                    os.rmdir(name, dir_fd=parent)
    finally:
        # closing a removed directory's last descriptor frees it (milliseconds each on a busy disk): in parallel too
        for _ in pool.map(os.close, [fd for fd, _parent, _name in dirs]):
            pass
        pool.shutdown()
    shutil.rmtree(path, ignore_errors=True)  # the top, and anything created meanwhile


def _unlink(item: tuple[int, str]) -> None:
    with contextlib.suppress(OSError):
        os.unlink(item[1], dir_fd=item[0])
