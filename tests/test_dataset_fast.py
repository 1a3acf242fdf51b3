"""Fast dataset reuse against a real server: the fast load builds what pgbench -i builds, a snapshot of the cleanly
stopped cluster is restored byte for byte (no crash recovery, pg_wal still pointing to the WAL directory, owned by
the server user), a failed restore leaves the old cluster in place, and a standby built from the snapshot streams."""

from __future__ import annotations

import dataclasses
import filecmp
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import PGBENCH_CONTENT, PGBENCH_STATS, pgbench_dump
from pglab.plan.schema import Dataset, LocalTarget
from pglab.targets.local import dataset as df
from pglab.targets.local.cluster import LocalLab, Node
from pglab.targets.local.dataset import copytree, snapshots

pytestmark = pytest.mark.postgres

SCALE, PARTITIONS = 2, 3

# what pgbench -i leaves behind, independent of the order it was built in
# the files of the accounts' heaps as the server names them: the early flush must have fsynced these, not the files
# the truncation replaced
HEAP_FILES = """
SELECT pg_relation_filepath(c.oid) FROM pg_class c
WHERE c.relname LIKE 'pgbench_accounts%' AND c.relkind = 'r' ORDER BY 1
"""

def _set(lab: LocalLab, node: Node, parameters: dict[str, Any]) -> None:
    """The lab's settings plus these, in force (a restart when PostgreSQL asks for one, as for wal_level)."""
    lab._apply(parameters)


def _stop(lab: LocalLab, node: Node, mode: str = "fast") -> None:
    lab._pg_ctl(node, "-m", mode, "stop", timeout=60)


def _log_since(node: Node, offset: int) -> str:
    return node.log.read_text(errors="replace")[offset:]


def _differences(snap: df.Snapshot, node: Node) -> list[str]:
    """Every way the node's data and WAL directories differ from the snapshot: content, owner, mode, extra files."""
    out: list[str] = []
    for src_root, dst_root in ((snap.data, node.data), (snap.wal, node.wal)):
        src = {p.relative_to(src_root) for p in src_root.rglob("*")}
        dst = {p.relative_to(dst_root) for p in dst_root.rglob("*")} - {Path("pg_wal")}
        out += [f"only in snapshot: {p}" for p in src - dst] + [f"not in snapshot: {p}" for p in dst - src]
        for rel in sorted(src & dst):
            a, b = src_root / rel, dst_root / rel
            sa, sb = a.lstat(), b.lstat()
            if (sa.st_mode, sa.st_uid, sa.st_gid) != (sb.st_mode, sb.st_uid, sb.st_gid):
                out.append(f"owner or mode: {rel}")
            elif a.is_file() and not filecmp.cmp(a, b, shallow=False):
                out.append(f"content: {rel}")
    return out


@pytest.fixture(scope="module")
def lab() -> Iterator[dict[str, Any]]:
    """A lone primary loaded fast, then sealed and snapshotted as the lab would: restart with the lab's own
    settings (so the last checkpoint says wal_level=replica), clean stop, sync, snapshot."""
    base = Path(tempfile.mkdtemp(prefix="pglab-test-"))
    lab = LocalLab(LocalTarget(instances=1, synchronous=None), base)
    try:
        ds = Dataset(scale=SCALE, partitions=PARTITIONS)
        load = df.fast_load_settings(lab.bindir, ds, cores=2)
        ep = lab.provision(load.parameters).primary
        node = lab.nodes[0]
        with lab.connect(node) as conn:
            assert conn.execute("SHOW wal_level").fetchone() == ("minimal",)
            conn.execute("CREATE DATABASE ref")
        report = df.fast_load(ep, ds, load, base / "load")
        with lab.connect(node) as conn:
            fast, stats = pgbench_dump(conn), conn.execute(PGBENCH_STATS).fetchall()
            heaps = [r[0] for r in conn.execute(HEAP_FILES)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | ep.env() | {"PGDATABASE": "ref"}
        subprocess.run([str(lab.bindir / "pgbench"), "-i", "-q", "-s", str(SCALE), f"--partitions={PARTITIONS}"],
                       env=env, check=True, capture_output=True)
        with lab.connect(node, dbname="ref") as conn:
            ref, ref_stats = pgbench_dump(conn), conn.execute(PGBENCH_STATS).fetchall()
        # unpartitioned too, at scale 1: fast into one database, pgbench into another
        plain = Dataset(scale=1)
        with lab.connect(node) as conn:
            conn.execute("DROP DATABASE ref")
            conn.execute("CREATE DATABASE plain_fast")
            conn.execute("CREATE DATABASE plain_ref")
        plain_load = df.fast_load_settings(lab.bindir, plain, cores=2)
        plain_report = df.fast_load(dataclasses.replace(ep, dbname="plain_fast"), plain, plain_load,
                                    base / "load-plain")
        with lab.connect(node, dbname="plain_fast") as conn:
            plain_heaps = [r[0] for r in conn.execute(HEAP_FILES)]
        subprocess.run([str(lab.bindir / "pgbench"), "-i", "-q", "-s", "1"], env=env | {"PGDATABASE": "plain_ref"},
                       check=True, capture_output=True)
        plain_dumps = []
        for db in ("plain_fast", "plain_ref"):
            with lab.connect(node, dbname=db) as conn:
                plain_dumps.append((pgbench_dump(conn), conn.execute(PGBENCH_STATS).fetchall()))
        with lab.connect(node) as conn:
            conn.execute("DROP DATABASE plain_fast")
            conn.execute("DROP DATABASE plain_ref")
        _set(lab, node, {})  # the lab's settings again: wal_level=replica, fsync on
        _stop(lab, node)
        df.sync_tree(node.data)
        snap, snap_report = df.snapshot(node.data, node.wal, base / "snapshot", bindir=lab.bindir)
        yield {"lab": lab, "node": node, "base": base, "snap": snap, "snap_report": snap_report, "fast": fast,
               "ref": ref, "stats": stats, "ref_stats": ref_stats,
               "plain": plain_dumps, "load": load, "report": report, "heaps": heaps,
               "plain_report": plain_report, "plain_heaps": plain_heaps}
    finally:
        lab.teardown()
        shutil.rmtree(base, ignore_errors=True)


def test_fast_load_builds_what_pgbench_builds(lab: dict[str, Any]) -> None:
    assert lab["load"].parallel == 2 and lab["report"].parallel == 2  # partitions side by side on 2 cores
    assert lab["fast"] == lab["ref"]  # tables, partition bounds, constraint and index names, sizes, rows
    assert lab["fast"][1][:2] == (SCALE * 100_000, 0)
    assert lab["stats"] == lab["ref_stats"]  # vacuumed and analyzed as pgbench's v step leaves them
    assert all(vacuumed and analyzed for name, vacuumed, analyzed, _n in lab["stats"] if name != "pgbench_accounts")


def test_fast_load_of_an_unpartitioned_dataset_builds_what_pgbench_builds(lab: dict[str, Any]) -> None:
    (fast, fast_stats), (ref, ref_stats) = lab["plain"]
    assert fast == ref and fast[1][:2] == (100_000, 0)
    assert fast_stats == ref_stats


def test_the_loaded_tables_were_flushed_early(lab: dict[str, Any]) -> None:
    """Their files fsynced while the load went on (so the restart's checkpoint does not wait for them): each
    partition's heap, and the unpartitioned table's; a flush of the files the truncation replaced would miss."""
    assert len(lab["heaps"]) == PARTITIONS and len(lab["plain_heaps"]) == 1
    assert set(lab["heaps"]) <= set(lab["report"].flushed), (lab["heaps"], lab["report"].flushed)
    assert set(lab["plain_heaps"]) <= set(lab["plain_report"].flushed), lab["plain_report"].flushed
    assert all(f.startswith("base/") for f in lab["report"].flushed + lab["plain_report"].flushed)


def test_settings_for_a_lone_primary(lab: dict[str, Any]) -> None:
    load = df.fast_load_settings(lab["lab"].bindir, Dataset(scale=100), cores=2, memory_bytes=24 * 2**30)
    assert load.parallel == 1 and "--init-steps=dt" in load.pgbench_args
    p = load.parameters
    assert (p["wal_level"], p["max_wal_senders"], p["fsync"], p["autovacuum"]) == ("minimal", 0, False, False)
    assert p["maintenance_work_mem"] == "1536MB" and p["max_parallel_maintenance_workers"] == 1
    assert not load.synced_by_server  # fsync off: sync_tree after the clean stop is what makes it durable
    assert df.fast_load_settings(lab["lab"].bindir, Dataset(scale=1), fsync=True).synced_by_server


def test_snapshot_is_the_stopped_cluster_with_only_the_wal_it_needs(lab: dict[str, Any]) -> None:
    snap: df.Snapshot = lab["snap"]
    node: Node = lab["node"]
    assert snap.meta["control"]["Database cluster state"] == "shut down"
    assert snap.meta["control"]["wal_level setting"] == "replica"  # standbys can start from it
    assert not (snap.data / "pg_wal").exists()  # a server started on the snapshot by mistake cannot change it
    segments = sorted(p.name for p in snap.wal.iterdir() if snapshots._SEGMENT.match(p.name))
    redo = snap.meta["control"]["Latest checkpoint's REDO WAL file"]
    assert redo in segments and len(segments) <= 2, segments
    assert (snap.data / "PG_VERSION").stat().st_uid == (node.data / "PG_VERSION").stat().st_uid
    report: df.CopyReport = lab["snap_report"]
    supported = df.reflink_supported(node.data.parent, snap.dir.parent)
    assert report.method == ("reflink" if supported else "copy_file_range"), report
    assert report.filesystems[str(snap.dir)] == df.filesystem_type(snap.dir) != "unknown"


def test_restore_brings_the_dataset_back_without_recovery(lab: dict[str, Any]) -> None:
    lab_, node, snap = lab["lab"], lab["node"], lab["snap"]
    lab_._start(node)
    ep = lab_.endpoints().primary
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | ep.env()
    subprocess.run([str(lab_.bindir / "pgbench"), "-n", "-c", "2", "-t", "300", "-b", "tpcb-like"], env=env,
                   check=True, capture_output=True)
    with lab_.connect(node) as conn:
        conn.execute("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid % 97 = 0")
        conn.execute("CREATE TABLE junk AS SELECT g FROM generate_series(1, 1000) g")
        changed = conn.execute(PGBENCH_CONTENT).fetchone()
    assert changed is not None and changed[1] != 0 and changed[7] == 600
    _stop(lab_, node, "immediate")  # a reset discards what the run wrote: no shutdown checkpoint needed
    assert df.control_data(lab_.bindir, node.data)["Database cluster state"] == "in production"

    report = df.restore(snap, node.data, node.wal)
    reflink = df.reflink_supported(snap.dir, node.data.parent)
    assert report.method == ("reflink" if reflink else "patch"), report  # patch: the old cluster is there
    assert report.files > 0 and report.bytes > SCALE * 13 * 2**20
    if not reflink:  # what the run changed is a part: only that is written back
        assert 0 < report.rewritten_bytes < report.compared_bytes / 2 and report.removed > 0, report
    assert _differences(snap, node) == []
    assert df.control_data(lab_.bindir, node.data)["Database cluster state"] == "shut down"
    link = node.data / "pg_wal"
    assert link.is_symlink() and Path(os.readlink(link)) == node.wal  # as initdb --waldir made it
    owner = node.data.parent.stat().st_uid
    assert {p.stat().st_uid for p in (node.data, node.wal, node.data / "base", node.data / "global")} == {owner}
    assert link.lstat().st_uid == owner and (node.data.stat().st_mode & 0o777) == 0o700
    assert not list(node.data.parent.glob(".*pglab-restore*"))  # nothing left beside it

    offset = node.log.stat().st_size
    lab_._start(node)
    with lab_.connect(node) as conn:
        assert conn.execute(PGBENCH_CONTENT).fetchone() == lab["fast"][1]  # every row back, history empty
        assert conn.execute("SELECT to_regclass('junk')").fetchone() == (None,)
        assert conn.execute("SELECT count(*) FROM pgbench_accounts WHERE abalance <> 0").fetchone() == (0,)
    log = _log_since(node, offset)
    assert "database system was shut down at" in log, log
    assert "not properly shut down" not in log and "redo starts" not in log, log


def test_refuses_to_snapshot_a_running_or_crashed_cluster(lab: dict[str, Any], tmp_path: Path) -> None:
    lab_, node = lab["lab"], lab["node"]
    if node.postmaster_pid() is None:
        lab_._start(node)
    with pytest.raises(df.SnapshotError, match="is running"):
        df.snapshot(node.data, node.wal, tmp_path / "s1", bindir=lab_.bindir)
    with pytest.raises(df.SnapshotError, match="is running"):
        df.restore(lab["snap"], node.data, node.wal)
    _stop(lab_, node, "immediate")
    with pytest.raises(df.SnapshotError, match="not shut down cleanly"):
        df.snapshot(node.data, node.wal, tmp_path / "s2", bindir=lab_.bindir)
    assert not (tmp_path / "s1").exists() and not (tmp_path / "s2").exists()
    df.restore(lab["snap"], node.data, node.wal)  # clean again for the next tests


def _fail_on(monkeypatch: pytest.MonkeyPatch, cls: type, name: str, nth: int) -> None:
    calls = {"n": 0}
    real = getattr(cls, name)

    def failing(self: Any, src: Path, dst: Path, st: os.stat_result) -> None:
        calls["n"] += 1
        if calls["n"] == nth:
            raise OSError(28, "No space left on device")
        real(self, src, dst, st)

    monkeypatch.setattr(cls, name, failing)


def test_a_failed_copy_leaves_the_old_cluster_in_place(lab: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    node = lab["node"]
    assert node.postmaster_pid() is None
    marker = node.data / "pglab-marker"
    marker.write_text("old")
    wal_before = sorted(p.name for p in node.wal.iterdir())
    _fail_on(monkeypatch, copytree._Copier, "_file", 5)
    with pytest.raises(OSError, match="No space"):
        df.restore(lab["snap"], node.data, node.wal, method="copy")
    assert marker.read_text() == "old" and sorted(p.name for p in node.wal.iterdir()) == wal_before
    assert not list(node.data.parent.glob(".*pglab-restore*"))
    monkeypatch.undo()
    report = df.restore(lab["snap"], node.data, node.wal, method="copy")
    assert report.method == "copy_file_range" or report.method == "reflink"
    assert _differences(lab["snap"], node) == []  # the marker is gone with the rest


def test_a_failed_patch_leaves_no_data_directory_and_a_rerun_completes(lab: dict[str, Any],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    node = lab["node"]
    (node.data / "pglab-marker").write_text("old")
    with open(node.data / "global" / "pg_control", "r+b") as f:  # a changed block in a file of the snapshot
        f.seek(4096)
        f.write(b"x" * 100)
    _fail_on(monkeypatch, copytree._Patcher, "_patch", 5)
    with pytest.raises(OSError, match="No space"):
        df.restore(lab["snap"], node.data, node.wal, method="patch")
    assert not node.data.exists() and not node.wal.exists()  # never a half-patched cluster at its place
    assert not list(node.data.parent.glob(".*pglab-restore*"))
    monkeypatch.undo()
    report = df.restore(lab["snap"], node.data, node.wal)
    assert report.method in ("copy_file_range", "reflink")  # nothing to patch: copied
    assert _differences(lab["snap"], node) == []
    (node.data / "pglab-marker").write_text("old")
    with open(node.data / "global" / "pg_control", "r+b") as f:
        f.seek(4096)
        f.write(b"x" * 100)
    report = df.restore(lab["snap"], node.data, node.wal, method="patch")
    assert (report.method, report.removed, report.rewritten_bytes) == ("patch", 1, 8192), report
    assert _differences(lab["snap"], node) == []


def test_an_interrupted_swap_leaves_no_data_directory_and_a_rerun_completes(lab: dict[str, Any],
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    node, lab_ = lab["node"], lab["lab"]
    real = os.rename

    def rename(src: Any, dst: Any) -> None:
        if Path(dst) == node.data:  # killed just before the last rename
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        df.restore(lab["snap"], node.data, node.wal)
    monkeypatch.undo()
    assert not node.data.exists()  # never the old data with the new WAL
    df.restore(lab["snap"], node.data, node.wal)
    assert not list(node.data.parent.glob(".*pglab-restore*"))
    assert df.control_data(lab_.bindir, node.data)["Database cluster state"] == "shut down"


def test_a_standby_built_from_the_snapshot_streams(lab: dict[str, Any]) -> None:
    lab_, primary, snap = lab["lab"], lab["node"], lab["snap"]
    if primary.postmaster_pid() is None:
        lab_._start(primary)
    with lab_.connect(primary) as conn:  # the slot first: the primary keeps the WAL since the snapshot
        conn.execute("SELECT pg_create_physical_replication_slot('n1', true)")
    home = lab_.lab_dir / "n1"  # beside the primary: the server user can reach it
    lab_._mkdir_server(home)
    standby = Node("n1", "standby", home / "data", home / "wal", lab_.nodes[0].port + 1,
                   lab_.lab_dir / "logs" / "n1.log")
    conninfo = (f"host=127.0.0.1 port={primary.port} user=pglab passfile={lab_._server_passfile} "
                "application_name=n1")
    df.make_standby(snap, standby.data, standby.wal, primary_conninfo=conninfo, slot="n1")
    assert (standby.data / "standby.signal").exists()
    lab_.nodes.append(standby)  # teardown stops it
    lab_.conf.write(standby)  # the snapshot holds the primary's pglab.conf: port and name are the standby's
    lab_._start(standby, may_move=True)
    lab_.wait_streaming(30)
    with lab_.connect(primary) as conn:
        conn.execute("UPDATE pgbench_branches SET bbalance = 7 WHERE bid = 1")
        lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
    deadline = time.monotonic() + 30
    with lab_.connect(standby) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        while conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", lsn).fetchone() != (True,):
            assert time.monotonic() < deadline, "the standby did not replay"
            time.sleep(0.1)
        assert conn.execute("SELECT bbalance FROM pgbench_branches WHERE bid = 1").fetchone() == (7,)
        assert conn.execute("SELECT count(*) FROM pgbench_accounts").fetchone() == (SCALE * 100_000,)


def test_wal_kept_is_the_checkpoint_segment_and_the_next() -> None:
    control = {"Latest checkpoint's REDO WAL file": "0000000100000002000000FF", "Bytes per WAL segment": "16777216"}
    assert snapshots._wal_keep(control) == {"00000002000000FF", "0000000300000000"}
    assert df.partition_ranges(2, 3) == [(1, 66667), (66668, 133334), (133335, 200000)]


def _tree(root: Path) -> None:
    (root / "base" / "1").mkdir(parents=True)
    (root / "base" / "1" / "1259").write_bytes(os.urandom(3 * 8192 + 100))
    (root / "PG_VERSION").write_text("15\n")
    os.chmod(root / "PG_VERSION", 0o600)
    os.symlink("base/1", root / "link")


@pytest.mark.parametrize("where", ["tmp", "reflink"])
def test_copies_reflink_where_the_filesystem_can_and_refuses_to_pretend(where: str, tmp_path: Path) -> None:
    """reflink_supported says what a copy will do; method="reflink" on a filesystem without it is an error, not a
    silent full copy. "reflink": a directory on XFS (reflink=1) or btrfs, named by $PGLAB_TEST_REFLINK_DIR."""
    root = tmp_path
    if where == "reflink":
        given = os.environ.get("PGLAB_TEST_REFLINK_DIR")
        if not given:
            pytest.skip("set PGLAB_TEST_REFLINK_DIR to a directory on a reflink filesystem (XFS, btrfs)")
        root = Path(tempfile.mkdtemp(dir=given))
    try:
        _tree(root / "src")
        supported = df.reflink_supported(root, root)
        copier = copytree._Copier("auto")
        copier.tree(root / "src", root / "dst")
        copier.finish()
        assert copier.report(0, 0, [root]).method == ("reflink" if supported else "copy_file_range")
        assert filecmp.cmp(root / "src/base/1/1259", root / "dst/base/1/1259", shallow=False)
        assert os.readlink(root / "dst/link") == "base/1" and (root / "dst/PG_VERSION").stat().st_mode & 0o777 == 0o600
        if where == "reflink":
            assert supported, f"{given} does not support reflinks ({df.filesystem_type(root)})"
        if not supported:
            with pytest.raises(df.SnapshotError, match="reflink copy refused"):
                copier = copytree._Copier("reflink")
                copier.tree(root / "src", root / "dst2")
    finally:
        if root != tmp_path:
            shutil.rmtree(root, ignore_errors=True)
