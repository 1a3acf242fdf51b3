"""Bottleneck rules on figures measured by real runs on this 2-core machine (scale 2, 8 clients, 5 s)."""

from __future__ import annotations

from pglab.analysis.bottleneck import (
    BACKEND_WRITE_SHARE,
    BACKEND_WRITES_S,
    FPI_PER_RECORD,
    INTERFERENCE_CORES,
    attribute,
    describe,
    interfered,
    storage_ceiling_share,
)

# select-only, 8 clients, 2 pgbench threads: the host is saturated, backends wait for the starved pgbench
CPU_BOUND: dict[str, float | None] = {"cpu_pct": 96.0, "server_cpu_cores": 1.56, "client_cpu_cores": 0.29,
                                      "wait.Client:ClientRead": 0.42, "wait.CPU": 0.55}
# tpcb-like, remote_apply, standbys applying 20 ms late: committers wait for standbys, the rest queue behind them
SYNC_REP_BOUND: dict[str, float | None] = {"cpu_pct": 35.0, "server_cpu_cores": 0.5, "client_cpu_cores": 0.05,
                                           "wait.Lock:transactionid": 0.68, "wait.IPC:SyncRep": 0.22,
                                           "wait.Lock:tuple": 0.09, "wait.LWLock:LockManager": 0.01}
# tpcb-like, local: the lock holders wait on the WAL flush
WAL_BOUND: dict[str, float | None] = {"cpu_pct": 70.0, "wait.Lock:transactionid": 0.69, "wait.Lock:tuple": 0.08,
                                      "wait.IO:WALSync": 0.08, "wait.LWLock:WALWrite": 0.06, "wait.CPU": 0.05}
# tpcb-like, max_wal_size at its minimum: a checkpoint requested inside the 6 s window, page images 6 % of the records
CHECKPOINT_REQUESTED: dict[str, float | None] = {
    "cpu_pct": 66.11, "wait.IO:WALSync": 0.19, "checkpoints_req": 1.0, "checkpoints_timed": 0.0, "wal_fpi": 2938.0,
    "wal_records": 48641.0, "wal_bytes_per_commit": 3442.573, "wal_fpi_per_commit": 0.38, "buffers_checkpoint": 1349.0,
    "buffers_clean": 0.0, "buffers_backend": 38.0, "window_s": 6.053}
# tpcb-like, the default max_wal_size: no checkpoint in the window, only the images after pglab's own checkpoint
# before it (20 % of the records: more than above, and no finding, since nothing in the load's settings caused them)
CHECKPOINT_BEFORE_ONLY: dict[str, float | None] = {
    "cpu_pct": 70.0, "wait.IO:WALSync": 0.17, "checkpoints_req": 0.0, "checkpoints_timed": 0.0, "wal_fpi": 14453.0,
    "wal_records": 70589.0, "wal_fpi_per_commit": 1.32, "buffers_backend": 0.0, "window_s": 60.0}
# a data set larger than shared_buffers: the backends evicted dirty buffers themselves, 58 % of the writes
BACKENDS_WRITING: dict[str, float | None] = {
    "cpu_pct": 60.0, "tps": 1023.083, "buffers_backend": 11883.0, "buffers_clean": 8600.0, "buffers_checkpoint": 0.0,
    "checkpoints_req": 0.0, "wal_fpi": 0.0, "wal_records": 110212.0, "window_s": 19.988}


def test_cpu_bound_select_only() -> None:
    verdicts = attribute(CPU_BOUND, cores=2, jobs=2)
    assert [v.resource for v in verdicts] == ["cpu"]
    assert "host CPU 96 % busy" in verdicts[0].evidence and "starved pgbench" in verdicts[0].evidence


def test_sync_rep_is_the_cause_behind_lock_queues() -> None:
    verdicts = attribute(SYNC_REP_BOUND, cores=2, jobs=2)
    assert [v.resource for v in verdicts] == ["sync-replication", "locks"]
    assert "22 % of all" in verdicts[0].evidence


def test_wal_flush_behind_lock_queues() -> None:
    assert [v.resource for v in attribute(WAL_BOUND, cores=2, jobs=2)] == ["wal-flush", "locks"]


def test_client_bound_and_nothing_stands_out() -> None:
    verdicts = attribute({"cpu_pct": 60.0, "client_cpu_cores": 1.9}, cores=4, jobs=2)
    assert [v.resource for v in verdicts] == ["client"]
    assert describe(attribute({"cpu_pct": 20.0}, cores=2, jobs=1)) == "none stood out"


def test_storage_against_the_fio_ceiling() -> None:
    ceilings = {"randwrite_iops_qd32": 10000.0, "randread_iops_qd32": 20000.0}
    verdicts = attribute({"cpu_pct": 30.0, "write_iops": 9000.0, "read_iops": 1000.0}, cores=2, ceilings=ceilings)
    assert verdicts[0].resource == "storage" and "90 % of the fio ceiling" in verdicts[0].evidence
    assert storage_ceiling_share({"write_iops": 5000.0, "read_iops": 2000.0}, ceilings) == 0.6


def test_a_cpu_quota_is_named_before_a_busy_host() -> None:
    verdicts = attribute({"cpu_pct": 100.0, "server_cpu_cores": 0.3, "limit_cpus": 0.25, "primary_cpu_cores": 0.24,
                          "cpu_throttled_pct": 71.0}, cores=2, jobs=2)
    assert [v.resource for v in verdicts] == ["cpu"]
    assert verdicts[0].evidence == ("primary 0.24 of its 0.25-core quota, throttled in 71 % of CFS periods; "
                                    "host CPU 100 % busy")
    quiet = attribute({"cpu_pct": 40.0, "limit_cpus": 2.0, "primary_cpu_cores": 0.5, "cpu_throttled_pct": 1.0},
                      cores=2, jobs=1)
    assert quiet == []


def test_a_client_at_its_own_quota_is_named() -> None:
    verdicts = attribute({"cpu_pct": 60.0, "client_cpu_cores": 0.49, "limit_client_cpus": 0.5,
                          "client_throttled_pct": 80.0, "wait.Client:ClientRead": 0.7}, cores=2, jobs=2)
    assert verdicts[0].resource == "client"
    assert verdicts[0].evidence == "pgbench 0.49 of its 0.5-core quota, throttled in 80 % of CFS periods"


def test_a_host_saturated_by_another_process_is_interference_not_cpu() -> None:
    """Measured: another process burning the host while a select-only point ran (servers 0.18, pgbench 0.02)."""
    figures: dict[str, float | None] = {"cpu_pct": 100.0, "server_cpu_cores": 0.18, "client_cpu_cores": 0.02,
                                        "interference_cpu_cores": 1.6}
    assert interfered(figures)
    verdicts = attribute(figures, cores=2, jobs=1)
    assert [v.resource for v in verdicts] == ["interference"]
    assert verdicts[0].evidence.startswith("1.60 of 2 cores used outside the lab; host CPU 100 % busy")
    # the lab's own CPU first when it uses more than the outsiders: both named
    busy_lab = {**CPU_BOUND, "interference_cpu_cores": 0.3}
    assert [v.resource for v in attribute(busy_lab, cores=2, jobs=2)] == ["cpu", "interference"]
    # below the threshold it is the host's cpu as before
    assert not interfered({**CPU_BOUND, "interference_cpu_cores": INTERFERENCE_CORES - 0.01})
    assert [v.resource for v in attribute({**CPU_BOUND, "interference_cpu_cores": 0.1}, cores=2, jobs=2)] == ["cpu"]
    assert not interfered({"cpu_pct": 100.0})  # no figure (older runs, Kubernetes): not claimed


def test_servers_not_found_on_the_host_are_not_claimed_idle() -> None:
    """An external server: without its processes the text says its CPU is not attributed, never 0.00 cores."""
    verdicts = attribute({"cpu_pct": 97.0, "client_cpu_cores": 0.4, "interference_cpu_cores": 0.1}, cores=2)
    assert verdicts[0].evidence == "host CPU 97 % busy, servers' CPU not attributed, pgbench 0.40"
    outside = attribute({"cpu_pct": 97.0, "client_cpu_cores": 0.4, "interference_cpu_cores": 1.5}, cores=2)
    assert outside[0].resource == "interference" and "the server's own among them" in outside[0].evidence


def test_a_checkpoint_requested_in_the_window_with_many_page_images_is_named() -> None:
    """Measured: a checkpoint requested by max_wal_size inside the window; no wait rule fires (WALSync 19 %)."""
    verdicts = attribute(CHECKPOINT_REQUESTED, cores=2, jobs=2)
    assert [v.resource for v in verdicts] == ["checkpoints"]
    assert verdicts[0].evidence == (
        "1 checkpoint(s) requested in the window (WAL reached max_wal_size before checkpoint_timeout) and 6 "
        "full-page images per 100 WAL records, 3,443 B of WAL per commit; raise max_wal_size (and "
        "checkpoint_timeout) so checkpoints come further apart")
    assert verdicts[0].score == 2938.0 / 48641.0 / FPI_PER_RECORD
    # beside a WAL-flush bound: both named, the waits still first
    both = attribute({**WAL_BOUND, **CHECKPOINT_REQUESTED, "wait.IO:WALSync": 0.08}, cores=2, jobs=2)
    assert [v.resource for v in both] == ["wal-flush", "locks", "checkpoints"]
    # a point's means: a requested checkpoint in one run of three
    assert attribute({**CHECKPOINT_REQUESTED, "checkpoints_req": 1 / 3}, cores=2)[0].evidence.startswith(
        "0.33 checkpoint(s) requested")


def test_page_images_without_a_requested_checkpoint_or_few_of_them_are_no_finding() -> None:
    assert attribute(CHECKPOINT_BEFORE_ONLY, cores=2, jobs=2) == []
    timed = {**CHECKPOINT_REQUESTED, "checkpoints_req": 0.0, "checkpoints_timed": 1.0}  # checkpoint_timeout's own
    assert attribute(timed, cores=2, jobs=2) == []
    few = {**CHECKPOINT_REQUESTED, "wal_fpi": FPI_PER_RECORD * 48641.0 * 0.9}
    assert attribute(few, cores=2, jobs=2) == []
    # no pg_stat_wal (before PostgreSQL 14, an older store): the checkpoints alone claim nothing
    old = {k: v for k, v in CHECKPOINT_REQUESTED.items() if k not in ("wal_fpi", "wal_records")}
    assert attribute(old, cores=2, jobs=2) == []


def test_backends_writing_their_own_buffers_point_at_shared_buffers() -> None:
    verdicts = attribute(BACKENDS_WRITING, cores=2, jobs=2)
    assert [v.resource for v in verdicts] == ["backend-writes"]
    assert verdicts[0].evidence == (
        "backends wrote 11,883 shared buffers themselves (595/s, 58 % of the window's buffer writes); raise "
        "shared_buffers if the working set does not fit, or make the background writer keep up "
        "(bgwriter_lru_maxpages, bgwriter_delay)")
    # measured as well: the background writer kept most of it (37 %): no finding
    assert attribute({**BACKENDS_WRITING, "buffers_backend": 4525.0, "buffers_clean": 7557.0,
                      "window_s": 19.817}, cores=2) == []
    # most of the writes but few of them (fewer than BACKEND_WRITES_S a second): no finding
    slow = {**BACKENDS_WRITING, "buffers_backend": BACKEND_WRITES_S * 19.988 * 0.9, "buffers_clean": 0.0}
    assert attribute(slow, cores=2) == []
    half = {**BACKENDS_WRITING, "buffers_clean": 11883.0 / BACKEND_WRITE_SHARE - 11883.0 + 1.0}
    assert attribute(half, cores=2) == []
    # without the figures (Kubernetes tenants, an external server without pg_stat_bgwriter): nothing claimed
    assert attribute({k: v for k, v in BACKENDS_WRITING.items() if k != "window_s"}, cores=2) == []
    assert attribute({"cpu_pct": 60.0, "buffers_backend": 11883.0}, cores=2) == []
