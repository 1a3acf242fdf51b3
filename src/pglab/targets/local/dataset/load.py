"""The fast first load: the pgbench dataset loaded on a primary alone, with the settings that skip the WAL.

Why: ``pgbench -i`` on the lab as it runs (wal_level=replica, standbys streaming) writes every row twice, in the
table and in the WAL, and the standbys replay it all. Here the dataset is loaded once, with wal_level=minimal, by
binary COPY ... FREEZE into tables truncated in the loading transaction, partitions side by side. Nothing here
starts or stops a server, copies a directory or takes a snapshot.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from pglab import interrupts
from pglab.plan.schema import Dataset
from pglab.targets.base import Endpoint
from pglab.targets.local.dataset.errors import SnapshotError

ACCOUNTS_PER_SCALE = 100_000  # pgbench's naccounts
TELLERS_PER_SCALE = 10
FLUSH_WAIT = 120.0  # s: at most this long for the early flush after the keys (the disk writes ~1 GB/s here)


# ------------------------------------------------------------------ the first load
@dataclass(frozen=True)
class FastLoad:
    """How to load the first dataset on a primary alone.

    ``parameters`` go on top of the lab's settings for the load only (wal_level needs a restart, so start the
    primary with them); afterwards the lab's own settings are written back and the server restarted once, so that
    the snapshot's last checkpoint carries wal_level=replica, which standbys need."""

    parameters: dict[str, Any]
    pgbench_args: list[str]  # pgbench -i, steps dt: drops and creates the tables and partitions as pgbench does
    parallel: int  # connections loading, vacuuming and indexing tables (partitions) at once
    synced_by_server: bool  # False when fsync=off: sync_tree() after the clean stop is what makes it durable
    notes: list[str] = field(default_factory=list)
    # fsync each loaded table's files from a thread once its COPY has committed (during the index build), where this
    # process can open them
    flush_early: bool = True


def fast_load_settings(bindir: Path, dataset: Dataset, *, cores: int | None = None,
                       memory_bytes: int | None = None, fsync: bool = False) -> FastLoad:
    """Settings for the fastest safe first load of ``dataset`` on a primary with no standby.

    Safe because nothing else depends on the server while it loads: a crash in that window loses only the load,
    which is started again from initdb. It is made durable by a clean stop and :func:`sync_tree` before the
    snapshot. ``fsync=False`` (the default) skips the per-commit flush of the new files: the kernel writes them
    back while the vacuum and index build run, instead of the load waiting for the disk."""
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
    notes.append("each table's files fsynced from a thread once loaded, while the keys are built, so the disk "
                 "write overlaps that CPU-bound step instead of the restart's checkpoint waiting for it")
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
    flushed: list[str] = field(default_factory=list)  # files fsynced early, relative to the data directory


def fast_load(endpoint: Endpoint, dataset: Dataset, load: FastLoad, out_dir: Path) -> LoadReport:
    """Load the pgbench dataset as ``load`` says, on a server already running with ``load.parameters``.

    The result is the dataset ``pgbench -i`` builds: pgbench itself creates the tables and partitions; then the
    same rows, vacuumed and analyzed, the same primary keys (constraint and index names). Only the way differs:
    binary COPY (no text to format and parse), FREEZE, partitions side by side."""
    out_dir.mkdir(parents=True, exist_ok=True)
    steps: dict[str, float] = {}
    t0 = time.monotonic()
    _run_pgbench(load.pgbench_args, endpoint, out_dir / "pgbench-init.out")
    steps["create tables (pgbench dt)"] = time.monotonic() - t0
    flush = _EarlyFlush(None)
    if load.flush_early:
        with psycopg.connect(endpoint.conninfo(application_name="pglab-load"), autocommit=True) as conn:
            flush = _EarlyFlush(conn)
    _load_rows(endpoint, dataset, load.parallel, steps, flush)
    t = time.monotonic()
    flush.join(FLUSH_WAIT)
    steps["early flush, rest"] = time.monotonic() - t
    return LoadReport(time.monotonic() - t0, steps, load.parallel, sorted(flush.flushed))


def _run_pgbench(args: list[str], endpoint: Endpoint, out: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | endpoint.env()
    with open(out, "w") as f:
        proc = interrupts.run(args, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                              cwd=out.parent)
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


class _EarlyFlush:
    """fsync the files of the tables being loaded, from threads, while the server goes on.

    Why: with fsync=off the new tables stay dirty in the page cache until the checkpoint of the restart that
    follows the load, which then waits for the disk (1.3 s for scale 100 in a run on 2026-11-22). Flushed once the
    table's COPY has committed, while the index build keeps the CPU busy, that write overlaps it. Not during the
    COPY: fsync passes then (every 0.5 s) made the COPY no faster and the restart no shorter in two runs on a busy
    machine. Only an optimisation: durability still comes
    from that checkpoint and :func:`sync_tree`; a file this process cannot open (another user's server, another
    machine) is left to them."""

    def __init__(self, conn: psycopg.Connection[Any] | None) -> None:
        """``conn``: to ask where the data directory is (None: flush nothing)."""
        self._threads: list[threading.Thread] = []
        self._data: Path | None = None
        self.flushed: set[str] = set()  # relative to the data directory, once fsynced
        if conn is not None:
            try:  # superusers and pg_read_all_settings only; anyone else: no early flush
                row = conn.execute("SELECT current_setting('data_directory')").fetchone()
            except psycopg.Error:
                row = None
            if row and os.access(row[0], os.R_OK | os.X_OK):
                self._data = Path(row[0])

    def start(self, conn: psycopg.Connection[Any], table: str) -> threading.Event:
        """Flush ``table``'s files, as ``conn``'s transaction sees them (a truncation gave it new ones), once the
        event returned is set: set it when that transaction has ended."""
        done = threading.Event()
        if self._data is None:
            return done
        row = conn.execute("SELECT pg_relation_filepath(%s)", (table,)).fetchone()
        if not row or not row[0]:
            return done
        t = threading.Thread(target=self._run, args=(self._data / row[0], done), name=f"flush {table}", daemon=True)
        t.start()
        self._threads.append(t)
        return done

    def _run(self, path: Path, done: threading.Event) -> None:
        fork = re.compile(re.escape(path.name) + r"(_vm|_fsm)?(\.\d+)?")
        done.wait()  # set in a finally by the COPY's caller: no pass during the COPY, whose writes it would stall
        try:
            for f in os.scandir(path.parent):
                if fork.fullmatch(f.name):
                    fd = os.open(f.path, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    if self._data is not None:
                        self.flushed.add(str(Path(f.path).relative_to(self._data)))
        except OSError:
            return  # gone or not ours: the checkpoint and sync_tree write it anyway

    def join(self, timeout: float) -> None:
        """Wait for the flushes (bounded: the restart's checkpoint would write what is left)."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))


def _load_rows(endpoint: Endpoint, dataset: Dataset, parallel: int, steps: dict[str, float],
               flush: _EarlyFlush) -> None:
    """pgbench's g, v and p steps, a table (a partition) per connection at a time.

    Each table is truncated in the transaction that fills it: with wal_level=minimal its rows skip the WAL, and
    COPY FREEZE writes them frozen and all-visible, as pgbench's own client-side COPY does for an unpartitioned
    table. Primary keys are built on the partitions first; the partitioned table's key then attaches them."""
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
            futures = [pool.submit(worker) for _ in range(min(parallel, len(tables)))]
            try:
                interrupts.wait_all(futures)
            except BaseException:  # a recorded Ctrl-C or SIGTERM: no table is started after the ones in flight
                failed.set()
                raise
            for f in futures:  # a failed worker set ``failed``: the others end after their table
                f.result()

    def copy(conn: psycopg.Connection[Any], table: str, lo: int, hi: int) -> None:
        committed = threading.Event()
        try:
            with conn.transaction():
                conn.execute(f"TRUNCATE {table}")
                committed = flush.start(conn, table)
                with conn.cursor().copy(f"COPY {table} FROM STDIN (FORMAT binary, FREEZE)") as cp:
                    for chunk in account_rows(lo, hi):
                        cp.write(chunk)
        finally:
            committed.set()  # the flush: at commit the server has handed every page to the kernel

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
