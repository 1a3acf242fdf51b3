"""The plain lab's dataset: loaded once on the primary alone, snapshotted (or restored from the dataset cache, and
stored there), the standbys made from the snapshot, and every instance put back to it between runs (``reset``).
The servers are started and stopped by the lab (cluster.py), through the operations ``Servers`` names."""

from __future__ import annotations

import errno
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import psycopg

from pglab.errors import LabError, UserError
from pglab.plan.schema import Dataset, LocalTarget
from pglab.targets.base import Endpoints
from pglab.targets.local import dataset as datasets  # the fast load, copies and snapshots
from pglab.targets.local.dataset import cache
from pglab.targets.local.pgconf import DBNAME, Configuration, Node
from pglab.targets.local.postgres_bin import ServerUser


class Servers(Protocol):
    """What this part asks of the lab (``cluster.LocalLab``): its state and its servers' lifecycle."""

    spec: LocalTarget
    bindir: Path
    lab_dir: Path | None
    nodes: list[Node]
    cpus: float | None
    server_user: ServerUser | None
    log: Callable[[str], None]
    conf: Configuration
    _events: list[tuple[float, str, str]]

    def connect(self, node: Node, dbname: str = DBNAME, **kwargs: Any) -> psycopg.Connection[Any]: ...
    def endpoints_of(self, nodes: list[Node]) -> Endpoints: ...
    def log_tail(self, node: Node, lines: int = 3) -> str: ...
    def _pg_ctl(self, node: Node, *args: str, timeout: float = 120) -> None: ...
    def _start(self, node: Node, may_move: bool = False) -> None: ...
    def _replication_conninfo(self, node: Node) -> str: ...
    def wait_streaming(self, timeout: float = 60) -> None: ...


class LabDataset:
    """The lab's part that gives it its dataset, from a load or the cache, and puts it back."""

    def __init__(self, lab: Servers, dataset: Dataset | None):
        self.lab, self.spec = lab, dataset
        if dataset is not None and cache.enabled(dataset.cache):
            cache.max_bytes()  # a bad PGLAB_CACHE_SIZE stops the run here, before anything is made
        self.snapshot: datasets.Snapshot | None = None
        self.info: dict[str, Any] = {}  # how the lab got it (run.json's dataset)
        self.password = ""  # the superuser's: a cached entry's clusters all have theirs
        self._cache: cache.DatasetCache | None = None  # the dataset cache, when the dataset may come from it
        self._cache_key: cache.Key | None = None
        self._cache_lease: cache.Lease | None = None  # held while the lab may restore from the cache's entry
        self._cache_info: dict[str, Any] = {}

    def release(self) -> None:
        """The cache's entry may go (the lab is gone)."""
        if self._cache_lease is not None:
            self._cache_lease.release()

    def load_alone(self, primary: Node) -> None:
        """Load the dataset on the primary before any standby exists, with the settings that skip the WAL of the
        new tables; then restart it with the lab's settings (so the last checkpoint says wal_level=replica), stop it
        cleanly, make it durable and snapshot it. The standbys are then copies of the snapshot, not replays."""
        lab = self.lab
        assert self.spec is not None and lab.lab_dir is not None
        ds = self.spec
        r = lab.spec.resources
        cores = max(1, min(os.cpu_count() or 1, math.ceil(lab.cpus))) if lab.cpus else None
        load = datasets.fast_load_settings(lab.bindir, ds, cores=cores,
                                           memory_bytes=r.memory.bytes if r and r.memory else None)
        started = time.monotonic()
        lab.conf.parameters = dict(load.parameters)
        lab.conf.write(primary)
        lab._start(primary, may_move=True)
        with lab.connect(primary, dbname="postgres") as conn:
            conn.execute(f"CREATE DATABASE {DBNAME}")
        lab.log(f"loading the dataset on {primary.name} alone (scale {ds.scale}"
                + (f", {ds.partitions} partitions" if ds.partitions else "") + ", wal_level=minimal)")
        out = lab.lab_dir / "dataset"
        out.mkdir(exist_ok=True)
        try:
            report = datasets.fast_load(lab.endpoints_of([primary]).primary, ds, load, out)
        except datasets.SnapshotError as exc:
            raise LabError(f"loading the dataset: {exc}; server log: {lab.log_tail(primary)}") from None
        except psycopg.Error as exc:
            if "No space left on device" in str(exc):
                raise UserError(f"target.local.paths.data: no space left on the device of '{primary.data.parent}' "
                                f"while loading the dataset (scale {ds.scale}); free some space there, choose "
                                "another path or a smaller dataset.scale.") from None
            raise LabError(f"loading the dataset: {str(exc).strip()}; server log: {lab.log_tail(primary)}") from None
        lab.conf.use_wanted()
        lab.conf.write(primary)
        lab._pg_ctl(primary, "-m", "fast", "-l", str(primary.log), "restart")
        lab._pg_ctl(primary, "-m", "fast", "stop")
        t = time.monotonic()
        sync_s = datasets.sync_tree(primary.data, primary.wal) if not load.synced_by_server else 0.0
        if len(lab.nodes) == 1 and ds.reset != "snapshot" and self._cache is None:  # no standby, no reset, no cache
            self.info = {"load_s": round(report.seconds, 2), "parallel": report.parallel,
                         "sync_s": round(sync_s, 2), "total_s": round(time.monotonic() - started, 2)}
            lab.log(f"dataset loaded in {report.seconds:.1f} s (no snapshot: a single instance without resets)")
            return
        try:
            stored = self._cache_store(primary)
            self.snapshot, copy = stored or datasets.snapshot(
                primary.data, primary.wal, primary.data.parent / "snapshot", bindir=lab.bindir,
                wal_dest=primary.wal.parent / "snapshot-wal")
            if stored:
                self.snapshot = self._snapshot_for_resets(primary, self.snapshot)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise UserError(f"target.local.paths.data: no space left on the device of '{primary.data.parent}' "
                                "for the dataset's snapshot; free some space there or choose another path.") from None
            raise
        self.info = {
            "load_s": round(report.seconds, 2), "load_steps_s": {k: round(v, 2) for k, v in report.steps.items()},
            "parallel": report.parallel, "sync_s": round(sync_s, 2),
            "snapshot_s": round(time.monotonic() - t, 2), "snapshot_method": copy.method,
            "snapshot_bytes": copy.bytes, "total_s": round(time.monotonic() - started, 2),
            **({"cache": self._cache_info} if self._cache_info else {}),
        }
        lab.log(f"dataset loaded in {report.seconds:.1f} s, snapshot taken in {time.monotonic() - t:.1f} s "
                f"({copy.method}, {copy.bytes / 2**20:.0f} MiB)")

    # ---------------------------------------------------------------- dataset cache (dataset/cache.py)
    def lookup(self) -> cache.Entry | None:
        """The dataset cache's entry for this lab's dataset, leased until teardown; None on a miss (said why)."""
        ds, lab = self.spec, self.lab
        if ds is None or not cache.enabled(ds.cache):
            return None
        t = time.monotonic()
        try:
            self._cache = cache.DatasetCache()
            self._cache_key = cache.make_key(
                lab.bindir, scale=ds.scale, partitions=ds.partitions,
                owner_uid=lab.server_user.uid if lab.server_user else os.getuid(), parameters=lab.conf.wanted)
            found = self._cache.lookup(self._cache_key, lab.bindir)
        except datasets.SnapshotError as exc:
            lab.log(f"dataset cache not used: {exc}")
            self._cache = None
            return None
        if isinstance(found, str):
            self._cache_info = {"hit": False, "key": self._cache_key.name, "dir": str(self._cache.root),
                                "miss": found, "lookup_s": round(time.monotonic() - t, 3)}
            lab.log(f"dataset cache: no entry to use for {self._cache_key.name} ({found}); loading")
            return None
        entry, self._cache_lease = found
        self._cache_info = {"lookup_s": round(time.monotonic() - t, 3)}  # the key, and the entry checked
        return entry

    def restore_cached(self, primary: Node, entry: cache.Entry) -> None:
        """The primary is the cache's entry (instead of initdb and a load); the lab's snapshot is the entry."""
        assert self._cache is not None and self._cache_key is not None
        t = time.monotonic()
        try:
            self.snapshot = entry.snapshot
            copy = datasets.restore(self.snapshot, primary.data, primary.wal)
        except datasets.SnapshotError as exc:
            raise LabError(f"restoring the dataset from the cache ({entry.dir}): {exc}") from None
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise UserError(f"target.local.paths.data: no space left on the device of '{primary.data.parent}' "
                                "for the cached dataset; free some space there or choose another path.") from None
            raise
        seconds = time.monotonic() - t
        try:
            self.snapshot = self._snapshot_for_resets(primary, self.snapshot)
        except (datasets.SnapshotError, OSError) as exc:
            raise LabError(f"a snapshot beside {primary.name}: {exc}") from None
        self.lab.conf.use_wanted()
        self._cache_info |= {"hit": True, "key": self._cache_key.name, "dir": str(self._cache.root),
                             "created": entry.meta.get("created"), "restore_s": round(seconds, 2),
                             "method": copy.method, "bytes": copy.bytes}
        self.info = {"cache": self._cache_info, "snapshot_method": copy.method, "snapshot_bytes": entry.bytes,
                     "total_s": round(seconds + self._cache_info["lookup_s"], 2)}
        self.lab.log(f"dataset from cache {self._cache_key.name} ({copy.method} {seconds:.1f} s, "
                     f"{copy.bytes / 2**20:.0f} MiB; dataset.cache: false or PGLAB_CACHE=off to load it instead)")

    def _snapshot_for_resets(self, primary: Node, entry: datasets.Snapshot) -> datasets.Snapshot:
        """What the standbys and resets copy from: the cache's entry; or, when the lab's filesystems have reflinks
        that the entry cannot give them (the cache on another filesystem), a reflink snapshot beside the stopped
        primary, which costs metadata only and keeps standbys and resets at reflink speed."""
        assert self._cache is not None and self.spec is not None
        if len(self.lab.nodes) == 1 and self.spec.reset != "snapshot":
            return entry  # no standby to make, no reset to serve
        data_dir, wal_dir = primary.data.parent, primary.wal.parent
        if all(datasets.reflink_supported(self._cache.root, d) for d in (data_dir, wal_dir)):
            return entry
        if not all(datasets.reflink_supported(d, d) for d in (data_dir, wal_dir)):
            return entry
        snap, copy = datasets.snapshot(primary.data, primary.wal, data_dir / "snapshot", bindir=self.lab.bindir,
                                       wal_dest=wal_dir / "snapshot-wal")
        self._cache_info["lab_snapshot"] = copy.method
        self.lab.log(f"a snapshot beside {primary.name} by {copy.method} for standbys and resets (the cache's "
                     "filesystem cannot reflink into the lab's)")
        return snap

    def _cache_store(self, primary: Node) -> tuple[datasets.Snapshot, datasets.CopyReport] | None:
        """Snapshot the freshly loaded primary into the cache (the lab's snapshot is then the entry); None when it
        cannot be stored there (said why), and the lab takes its own snapshot."""
        if self._cache is None or self._cache_key is None:
            return None
        try:
            stored = self._cache.store(self._cache_key, primary.data, primary.wal, bindir=self.lab.bindir,
                                       password=self.password, log=self.lab.log)
        except (datasets.SnapshotError, OSError) as exc:
            stored = str(exc)
        if isinstance(stored, str):
            self._cache_info["stored"] = False
            self._cache_info["not_stored"] = stored
            self.lab.log(f"dataset cache: {self._cache_key.name} not stored ({stored})")
            return None
        entry, self._cache_lease, copy = stored
        self._cache_info["stored"] = True
        self.lab.log(f"dataset cache: stored as {entry.name} in {self._cache.root}")
        return entry.snapshot, copy

    # ---------------------------------------------------------------- standbys and resets from the snapshot
    def standbys_from_snapshot(self, quiet: bool = False) -> dict[str, str]:
        """Each standby is the snapshot plus standby.signal, streaming from the primary through its slot (created
        before the primary's first checkpoint, so the WAL since the snapshot is kept). Returns each standby's copy
        method (reflink, patch, copy)."""
        assert self.snapshot is not None
        lab = self.lab
        primary = lab.nodes[0]
        with lab.connect(primary) as conn:
            for node in lab.nodes[1:]:
                conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", (node.name,))
        methods = {}
        for node in lab.nodes[1:]:
            if not quiet:
                lab.log(f"{node.name}: standby from the snapshot")
            try:
                methods[node.name] = datasets.make_standby(
                    self.snapshot, node.data, node.wal, primary_conninfo=lab._replication_conninfo(node),
                    slot=node.name).method
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise UserError(f"target.local.paths.data: no space left on the device of '{node.data.parent}' "
                                    f"for {node.name}; free some space there or choose another path.") from None
                raise
            lab.conf.write(node)  # the snapshot holds the primary's pglab.conf
            lab._start(node, may_move=True)
        return methods

    def reset(self) -> dict[str, Any]:
        """Put every instance back to the snapshot: stop them all (immediately: their state is discarded), restore
        the primary, recreate the slots, restore the standbys, start and wait until they stream."""
        if self.snapshot is None:
            raise LabError("dataset.reset is 'snapshot' but the lab has no snapshot (the dataset was not loaded by "
                           "the lab)")
        lab = self.lab
        started = time.monotonic()
        for node in lab.nodes:
            if node.postmaster_pid() is not None:
                lab._pg_ctl(node, "-m", "immediate", "stop", timeout=60)
        primary = lab.nodes[0]
        copy = datasets.restore(self.snapshot, primary.data, primary.wal)
        methods = {primary.name: copy.method}
        lab.conf.write(primary)
        lab._start(primary)
        methods.update(self.standbys_from_snapshot(quiet=True))
        lab.wait_streaming()
        seconds = time.monotonic() - started
        lab._events.append((time.time(), "dataset-reset", f"snapshot restored in {seconds:.1f} s "
                            f"({', '.join(sorted(set(methods.values())))})"))
        return {"seconds": round(seconds, 3), "method": methods}
