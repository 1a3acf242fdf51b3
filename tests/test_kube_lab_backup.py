"""Continuous WAL archiving and a base backup under load on the multi-node lab (issue 28): the lab's object store
(versitygw) and CloudNativePG's Barman Cloud plugin started for it (``kubelab.py objectstore``), one
pglab sweep whose Cluster archives WAL through the plugin and whose run takes a ``Backup`` (method plugin) 5 s into
the load. Its figures are checked against readings taken here without pglab: versitygw's own data folder on the
system node's disk (the objects and bytes of the backup and of the WAL archive, as the server stores them), and the
Cluster's ``pg_stat_archiver`` read with psql in the primary pod while the run goes on. The run's restore check
(``restore_check: true``): pglab recovers a Cluster from that backup; the witness's log, the store's listing and the
reader's raw psql output are read here against pglab's figures.

The plan is study 001's backup half, examples/study-backup-under-load.yaml, as written at its smallest
(kube_lab_support.STUDY_EDITS: scale 1, 2 clients, one 40 s run with the backup 5 s in; a fresh destination), kept
short for the CI track that runs beside the whole suite: one 1-instance Cluster on a database node. The table the
study published, TPS before / during / after the backup with its seconds and MB/s (pglab report --table scenarios),
is checked against the run's stored figures.

The sweep and its readings are tests/kube_lab_backup_support.py's. In the test command the sweep runs beside the
interrupted sweep of tests/test_kube_lab.py (its own namespace, as another team's), and this module checks what it
left; run alone, this module runs it first.
"""

from __future__ import annotations

import json

import pytest

from conftest import pglab
from kube_lab_backup_support import Sweep, backup_sweep
from kube_lab_support import Beside, kubelab
from pglab.scenarios.witness import ACKED, parse_lsn
from pglab.store.sqlite import Store
from pglab.targets.kubernetes.restore import RESTORE_MARK
from pglab.targets.kubernetes.scenario import parse_witness_log

pytestmark = pytest.mark.kube_lab


@pytest.fixture(scope="module")
def sweep(lab: kubelab.KubeLab, tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    """The sweep the interrupted sweep's test ran beside its own (tests/test_kube_lab.py), else run here."""
    return Beside.take("backup", lambda: backup_sweep(lab, tmp_path_factory.mktemp("backup")))


def test_a_backup_under_load_completes_and_its_size_is_the_object_stores(sweep: Sweep) -> None:
    store = Store.open(sweep.results, create=False)
    [run] = store.runs()
    m = {k: v for k, v in run.metrics.items() if v is not None}  # a figure stored empty: missing
    assert run.status == "ok", m
    events = {kind: (ts, detail) for kind, ts, detail in
              store.conn.execute("SELECT kind, ts, detail FROM events WHERE run_id = ?", (run.id,))}
    assert "backup-start" in events and "backup-end" in events, events
    assert events["backup-end"][0] > events["backup-start"][0]
    # from the request to the completion: at least the operator's wait and the plugin's backup (whole seconds; the
    # operator marks it completed later still, once the end WAL is archived), and pglab saw it completed when this
    # test's own reads of the Backup did: not before the operator marked it (after this test's last read that found it
    # pending began: pglab stamps the end once its read has returned), and within pglab's 0.5 s poll and one read of
    # this test's first read that found it completed (this test reads every 1 s plus a kubectl get and exec: 3-7 s a
    # cycle on the loaded lab, so the two readers' times differ by that much on the other side)
    assert m["backup_operator_s"] + m["backup_wait_s"] - 1 <= m["backup_s"], m
    done, pending = sweep.archiver.completed, sweep.archiver.pending
    assert done is not None and pending is not None
    assert pending <= events["backup-end"][0] <= done + 4, (events, pending, done)
    assert m["recovered_s"] == pytest.approx(m["backup_s"], abs=0.01)
    # its size is what the object store holds under base/<backupId>/ (the data tar and backup.info, one file each)
    base = {k: v for k, v in sweep.listing.items() if k.startswith("base/")}
    assert len(base) == m["backup_objects"] >= 2, (base, m)  # data.tar and backup.info at least
    assert sum(base.values()) > 10 * 2**20  # scale 1: ~20 MB of PGDATA
    assert abs(m["backup_mb"] * 2**20 - sum(base.values())) < 64 * 1024, (m["backup_mb"], base)
    assert m["backup_mb_s"] == pytest.approx(m["backup_mb"] / m["backup_s"])
    assert 0 < m["backup_wal_mb"] < 64  # from its begin to its end LSN
    # the load went on through it: TPS before, during and after, as the local backup scenario reports them. A backup
    # that ended after the load (it took over 25 s once, on a CI machine loaded enough that pgbench ran at a fifth of
    # its TPS here when quiet) leaves no "after": pglab says so and stores none, never a 0 TPS that reads as a stall
    window = store.run_window(run.id)
    assert window is not None
    after = events["backup-end"][0] < window[1]
    for phase in ("before", "during", "after") if after else ("before", "during"):
        assert m[f"tps_{phase}"] > 0, m
    if not after:
        assert "tps_after" not in m and "after-unmeasured" in events, (m, events)
    assert 4 <= m["fault_at_s"] <= 9, m
    store.close()
    table = pglab("report", str(sweep.results), "--table", "scenarios", "--format", "markdown")
    assert table.returncode == 0, table.stderr
    assert "backup" in table.stdout
    print(table.stdout)
    # the study's table: one row, the backup under the load at the plan's clients, TPS and latency before, during
    # and after it, the backup's seconds and MB/s (and the restore check's), each the run's stored figure
    proc = pglab("report", str(sweep.results), "--table", "scenarios", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    shape = ["tps_before", "tps_during", *(["tps_after"] if after else []), "latency_before_ms", "latency_during_ms",
             *(["latency_after_ms"] if after else []), "backup_s", "backup_mb_s", "restore_s", "restore_acked",
             "restore_lost"]
    assert set(shape) <= set(row), sorted(row)
    assert str(row["scenario"]).startswith("backup") and row["clients"] == 2, row
    assert row["trials"] == 1 and row.get("failed_runs", 0) == 0, row  # a column no row fills is left out
    for key in shape:
        assert row[key] == pytest.approx(m[key]), (key, row, m)
    assert row["tps_during"] > 0 and row["backup_mb_s"] > 0
    print({k: round(v, 2) for k, v in m.items() if k.startswith(("backup", "archiv", "wal_seg", "pg_wal", "tps_",
                                                                  "latency_", "fault"))})


def test_the_recovered_cluster_holds_every_write_acknowledged_before_the_backup_ended(sweep: Sweep) -> None:
    store = Store.open(sweep.results, create=False)
    [run] = store.runs()
    m = {k: v for k, v in run.metrics.items() if v is not None}  # a figure stored empty: missing
    events = {kind: (ts, detail) for kind, ts, detail in
              store.conn.execute("SELECT kind, ts, detail FROM events WHERE run_id = ?", (run.id,))}
    store.close()
    folder = sweep.results / run.dir
    log = parse_witness_log((folder / "witness" / "pod.log").read_text())
    # the backup's LSNs as the operator reported them (pglab's event quotes its status)
    begin, end = (parse_lsn(x) for x in events["backup-end"][1].rsplit("LSN ", 1)[1].rstrip(")").split(" to "))
    # this test's own cut, coarser than pglab's: a row acknowledged with its insert 64 KiB before the backup's end
    # LSN (its COMMIT, a round trip later, follows within far less of pgbench's WAL) is in the backup's consistent
    # state; those inserted after its begin LSN are there only through the archived WAL the recovery replayed
    acked = [a for a in log.attempts if a.outcome == ACKED and a.lsn is not None and parse_lsn(a.lsn) < end - 65536]
    during = [a.id for a in acked if parse_lsn(str(a.lsn)) > begin]
    # how many rows fall inside the backup depends on how long its copy of the scale-1 database took (about 1 s in
    # one CI run: 4 rows); one is enough to check that the recovery replayed the archived WAL up to the end LSN
    assert len(acked) > 20 and during, (events["backup-end"], len(acked), len(during))
    # what the recovered Cluster holds, as psql printed it in the reader's pod
    raw = (folder / "restore" / "pod.log").read_text().splitlines()
    present = {int(x) for x in raw[raw.index(f"{RESTORE_MARK} present begin") + 1:
                                   raw.index(f"{RESTORE_MARK} present end")]}
    missing = sorted({a.id for a in acked} - present)
    assert not missing, missing[:10]
    assert present <= {a.id for a in log.attempts}  # nothing the witness never wrote
    # pglab's figures say the same: nothing lost, and the writes this test counted but one at most: pglab counts a
    # write only once the next one's insert is at or before the end LSN (proof that its commit came before); by
    # the rows' own inserts this test can hold one more, the last before the end whose successor came after it
    # (75 here against pglab's 74 in one CI run, that row found in the restore all the same)
    assert m["restore_lost"] == 0 and m["restore_acked"] >= len(acked) - 1, (m, len(acked))
    assert m["restore_after_found"] <= m["restore_after_acked"]
    assert m["restore_s"] > 0 and events["restore-ready"][0] - events["restore-start"][0] >= m["restore_s"] - 1
    assert events["restore-start"][0] >= events["backup-end"][0]
    # recovered from this backup: its id is the one base backup the store holds
    spec = json.loads((folder / "restore" / "cluster.json").read_text())["spec"]
    ids = {k.split("/")[1] for k in sweep.listing if k.startswith("base/")}
    assert ids == {spec["bootstrap"]["recovery"]["recoveryTarget"]["backupID"]}, (ids, spec["bootstrap"])
    table = pglab("report", str(sweep.results), "--table", "scenarios", "--format", "markdown")
    assert table.returncode == 0 and "restore lost" in table.stdout, table.stdout + table.stderr
    print(f"restore check: {events['restore-check'][1]}; restore_s {m['restore_s']:.1f}")


def test_wal_is_archived_during_the_run_with_no_failure(sweep: Sweep) -> None:
    store = Store.open(sweep.results, create=False)
    [run] = store.runs()
    m = {k: v for k, v in run.metrics.items() if v is not None}  # a figure stored empty: missing
    reads = sweep.archiver.rows
    assert len(reads) >= 5, reads
    # the archive grew while pglab's run went on, as psql in the primary saw it, and pglab counted at most that
    assert reads[-1][1] > reads[0][1], reads
    assert 1 <= m["archived_wal_segments"] <= reads[-1][1] - reads[0][1] + 1, (m, reads)
    assert m["archive_failed"] == 0 == reads[-1][2], (m, reads)
    assert m["wal_segments_written"] > 0 and m["archive_ready_max"] >= 0
    # every segment counted archived is in the object store (wals/<timeline+log>/<segment>.gz), as is pglab's own
    # listing taken after the backup
    wals = [k for k in sweep.listing if k.startswith("wals/")]
    assert len(wals) >= m["archived_wal_segments"], (wals, m)
    assert m["archive_wal_objects"] <= len(wals)
    series = {key for (key,) in store.conn.execute("SELECT DISTINCT metric FROM series WHERE run_id = ? AND "
                                                   "source = 'archiver'", (run.id,))}
    assert series == {"ready_segments", "pg_wal_mb"}, series
    store.close()
    print(f"backup test: {sweep.seconds:.0f} s in all; {m}")
