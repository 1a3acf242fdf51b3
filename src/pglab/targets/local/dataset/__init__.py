"""Fast dataset reuse: load once on a lone primary, snapshot the stopped cluster, restore the snapshot between runs.

Why: ``pgbench -i`` on the lab as it runs (wal_level=replica, standbys streaming) writes every row twice, in the
table and in the WAL, and the standbys replay it all; re-loading before every run that asks for a fresh dataset
costs that again each time. Here the dataset is loaded once with the settings that skip the WAL of a table created
in the loading transaction (wal_level=minimal), the stopped cluster is copied aside, and a reset puts it back: a
reflink copy (metadata only) where the filesystem supports it, else the old cluster patched where it stands (only
the blocks a run changed are written back), else a full in-kernel copy.

The pieces, in the order the lab uses them, by module (imports go one way: snapshots → copytree; load uses
neither; all three share errors):

- load: :func:`fast_load_settings` — server settings and loading strategy for the first load on a primary alone;
  :func:`fast_load` — loads the pgbench dataset with them (pgbench's own steps, or partitions in parallel);
- copytree: :func:`sync_tree` — makes the data and WAL directories durable (required when the load ran with
  fsync=off); :func:`reflink_supported`, :func:`filesystem_type` — which copy a pair of directories allows;
- snapshots: :func:`snapshot` — copies a cleanly stopped cluster aside (refuses one that is not "shut down");
  :func:`restore` / :func:`make_standby` — puts the snapshot back as a primary or as a standby, atomically.

This package re-exports what the lab uses. Server start and stop stay with the lab (cluster.py); nothing here
starts a server.
"""

from pglab.targets.local.dataset.copytree import CopyReport, filesystem_type, reflink_supported, sync_tree
from pglab.targets.local.dataset.errors import SnapshotError
from pglab.targets.local.dataset.load import fast_load, fast_load_settings, partition_ranges
from pglab.targets.local.dataset.snapshots import Snapshot, control_data, make_standby, restore, snapshot

__all__ = [
    "CopyReport",
    "Snapshot",
    "SnapshotError",
    "control_data",
    "fast_load",
    "fast_load_settings",
    "filesystem_type",
    "make_standby",
    "partition_ranges",
    "reflink_supported",
    "restore",
    "snapshot",
    "sync_tree",
]
