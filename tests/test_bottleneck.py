"""Bottleneck rules on figures measured by real runs on this 2-core machine (scale 2, 8 clients, 5 s)."""

from __future__ import annotations

from pglab.analysis.bottleneck import INTERFERENCE_CORES, attribute, describe, interfered, storage_ceiling_share

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
