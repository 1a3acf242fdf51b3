"""The metrics catalogue: every figure a run stores (``run_metrics``, a tenant's in ``tenant_metrics``) that a report,
``compare``, an export or the HTML report shows or reads, described once: unit, which way is better, the layer it
measures, and the report columns it fills.

Adding a metric to the reports is one entry here: the tables (points, runs, scenarios, tiers, host, tenants) take
their metric columns, headers, decimals and how repeats combine from :data:`METRICS`, in catalogue order; the views
that pick a few figures (the compact terminal table, the HTML charts and runs table, compare's and the price of
durability's Δ columns) take theirs in the order their columns say; compare takes the direction; export the column
types. A leaf module: it imports nothing from pglab.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Literal

Layer = Literal["client", "database", "replication", "storage", "cpu", "memory", "limits", "scenario", "tenants",
                "host"]
How = Literal["mean", "median", "max", "sum", "value"]
TABLES = ("points", "runs", "scenarios", "tiers", "host", "tenants")
# a few of a table's figures
VIEWS = ("compact", "chart", "durability-chart", "tier-chart", "compare", "durability", "html-runs")


@dataclass(frozen=True)
class Column:
    """One report column a metric fills.

    ``table``: points (means over a point's ok repeats) · runs (one per run) · scenarios (over a level's trials) ·
    tiers (median over repeats) · host (median over repeats) · tenants (one per run × tenant); or a view of the
    points/runs figures: compact (the default terminal table) · chart, durability-chart (the HTML charts vs clients,
    per synchronous_commit level; ``header``: the unit) · tier-chart (of the tiers table; ``header``: the title) ·
    compare (``pglab compare``'s default: the first figure's A, B, Δ and verdict, the others' Δ and verdict) ·
    durability (the price of durability: per synchronous_commit level the figure, and its Δ against the base level;
    ``key``: the Δ's name in ``<level>_<key>_vs_base_pct``) · html-runs (the HTML runs table). In the compare and
    durability views ``header`` is the figure's title with its unit; its Δ's and verdict's titles drop the unit.
    ``key``: the column's name in CSV/JSON rows (default: the metric's name); ``header``: its title in the terminal
    and markdown tables (default: the key); ``how``: how the runs of one row combine into it; ``at``: its place in a
    view (then catalogue order). Compact only: ``optional`` is left out (the last first) on a narrow terminal,
    ``interval`` shows the mean ± its 95 % interval, ``per_run`` is in the per-run form too."""

    table: str
    key: str | None = None
    header: str | None = None
    how: How = "mean"
    at: int = 0
    optional: bool = False
    interval: bool = False
    per_run: bool = True


@dataclass(frozen=True)
class Metric:
    """``name`` as stored; ``{…}`` stands for a part that varies (``tier.{tier}.tps``: one per tier).
    ``lower_is_better``: None when neither way is better (a count, a limit, a setting)."""

    name: str
    unit: str
    lower_is_better: bool | None
    layer: Layer
    description: str
    decimals: int = 2  # terminal and markdown tables
    ci: bool = False  # points table: the mean ± its 95 % interval (and a ``<key>_ci95`` column)
    columns: tuple[Column, ...] = field(default=())


def _in(*tables: str, key: str | None = None, header: str | None = None, how: How = "mean") -> tuple[Column, ...]:
    return tuple(Column(t, key, header, how) for t in tables)


# Catalogue order is column order: every table lists its metric columns in the order they appear here.
METRICS: tuple[Metric, ...] = (
    # ---- tenants plans: how many were measured together
    Metric("tenants", "count", None, "tenants", "tenants measured together in the run",
           columns=_in("host", how="median")),
    Metric("instances", "count", None, "tenants", "PostgreSQL instances of all tenants together",
           columns=_in("host", how="median")),
    Metric("start_spread_s", "s", True, "tenants", "Kubernetes tenants: how far apart the tenants' pgbench windows "
           "began", columns=_in("host", header="start spread s", how="median")),
    Metric("common_window_s", "s", None, "tenants", "Kubernetes tenants: how long every tenant's pgbench ran at "
           "the same time", columns=_in("host", header="common window s", how="median")),
    # ---- the client: pgbench's own figures
    Metric("tps", "tx/s", False, "client", "transactions per second over the measured window (pgbench)", 1, ci=True,
           columns=(*_in("points", "runs", "compare", "durability", "html-runs"),
                    Column("host", header="host TPS", how="median"),
                    Column("tenants", how="value"), Column("compact", header="tps", at=1, interval=True),
                    *_in("chart", "durability-chart", header="TPS"))),
    Metric("latency_avg_ms", "ms", True, "client", "mean transaction latency (pgbench)", ci=True,
           columns=(*_in("points", "runs"), Column("compare", header="lat ms"), Column("tenants", how="value"),
                    Column("durability", "latency", "lat ms"), Column("durability-chart", header="mean latency ms"))),
    Metric("latency_p95_ms", "ms", True, "client", "95th percentile of transaction latency (transaction log)", ci=True,
           columns=_in("points", "runs")),
    Metric("latency_p99_ms", "ms", True, "client", "99th percentile of transaction latency (transaction log)", ci=True,
           columns=(*_in("points", "runs", "html-runs"), Column("compare", header="p99 ms"),
                    Column("tenants", how="value"), Column("compact", header="p99 ms", at=2),
                    Column("chart", header="p99 latency ms"))),
    Metric("memory_per_instance_mb", "MB", True, "tenants", "memory of one tenant instance (its cgroup), mean",
           columns=_in("host", header="memory per instance MB", how="median")),
    # ---- storage: the devices behind the data and WAL paths
    Metric("read_iops", "IOPS", None, "storage",
           "device-wide reads per second (as iostat counts them): every instance on the disk and the rest of the host",
           1, columns=(*_in("points", "runs", header="disk read IOPS"), Column("host", header="disk read IOPS",
                                                                               how="median"),
                       Column("tenants", how="value"))),
    Metric("write_iops", "IOPS", None, "storage",
           "device-wide writes per second (as iostat counts them): every instance on the disk and the rest of the host",
           1, columns=(*_in("points", "runs", "chart", header="disk write IOPS"),
                       Column("host", header="disk write IOPS", how="median"), Column("tenants", how="value"),
                       Column("compact", header="disk w IOPS", at=4, optional=True))),
    Metric("total_iops", "IOPS", None, "storage", "device-wide reads and writes per second", 1,
           columns=_in("points", "runs")),
    Metric("read_latency_ms", "ms", True, "storage", "mean time a device read took (iostat r_await), device-wide",
           columns=_in("points", "runs")),
    Metric("write_latency_ms", "ms", True, "storage", "mean time a device write took (iostat w_await), device-wide",
           columns=(*_in("points", "runs"), Column("compact", header="disk w ms", at=5, optional=True,
                                                   per_run=False))),
    # ---- CPU
    Metric("tenants_cpu_cores", "cores", True, "tenants", "CPU of every tenant's cgroup added up",
           columns=_in("host", header="tenants' cores", how="median")),
    Metric("cpu_cores", "cores", True, "tenants", "CPU a tenant used (its cgroup; on Kubernetes its primary's "
           "container, cAdvisor's counter)", columns=_in("tenants", how="value")),
    Metric("cpu_s", "s", True, "tenants", "Kubernetes tenants: CPU seconds the tenant's primary's container used "
           "over its window (cAdvisor)", columns=_in("tenants", how="value")),
    Metric("cpu_limit_pct", "%", None, "tenants", "Kubernetes tenants: the primary's CPU use as a share of its "
           "limit (its tier's cpus)", columns=_in("tenants", header="cpu % of limit", how="value")),
    Metric("memory_mb", "MB", True, "tenants", "memory a tenant used (its cgroup; on Kubernetes its primary's "
           "container's working set, mean over the window, cAdvisor)", columns=_in("tenants", how="value")),
    Metric("cpu_pct", "%", None, "cpu", "host CPU busy, mean over the window", 1,
           columns=(*_in("points", "runs"), Column("host", header="host CPU %", how="median"),
                    Column("compact", header="cpu %", at=3, optional=True))),
    # ---- the database
    Metric("wal_mb_s", "MB/s", None, "database", "WAL written per second (pg_stat_wal)", columns=_in("points", "runs")),
    Metric("replay_lag_max_ms", "ms", True, "replication", "largest replay lag of any standby in the window",
           columns=_in("points", "runs")),
    # ---- storage, per instance: each instance's own cgroup, read at the window's start and end (after the
    #      published shape: per configuration, the device-wide IOPS and latencies, then CPU %, WAL and lag)
    Metric("primary_write_iops", "IOPS", None, "storage",
           "writes per second of the primary alone, per instance from its cgroup (cgroup v1: what its own processes "
           "submitted, the kernel's writeback not included; IOs before the block layer merges them)", 1,
           columns=_in("points", "runs", header="primary write IOPS")),
    Metric("standby_write_iops", "IOPS", None, "storage",
           "writes per second of one standby (the mean over the standbys), per instance from its cgroup", 1,
           columns=_in("points", "runs", header="standby write IOPS")),
    # ---- why the run went as it did (issue 29): after the published shape, so its columns keep their order
    Metric("wal_bytes_per_commit", "B", True, "database", "WAL generated per commit over the window "
           "(pg_stat_wal.wal_bytes over pg_stat_database.xact_commit; PostgreSQL 14+)", 0,
           columns=(*_in("points", "runs", "html-runs", header="WAL B/commit"),
                    Column("tenants", header="WAL B/commit", how="value"))),
    Metric("wal_fpi_per_commit", "count", True, "database", "full-page images per commit over the window "
           "(pg_stat_wal.wal_fpi over xact_commit; many after a checkpoint: the first change of each page after it "
           "logs the whole page)", columns=(*_in("points", "runs", "html-runs", header="FPI/commit"),
                                            Column("tenants", header="FPI/commit", how="value"))),
    Metric("buffers_backend", "count", True, "database", "shared buffers the backends wrote themselves in the "
           "window, not left to the checkpointer or background writer (pg_stat_bgwriter.buffers_backend up to "
           "PostgreSQL 16, pg_stat_io's relation writes from 17)", 0,
           columns=(*_in("points", "runs", "html-runs", header="backend writes"),
                    Column("tenants", header="backend writes", how="value"))),
    # ---- open loop (a rate, pgbench -R): how far the load fell behind its schedule (issue 29)
    Metric("schedule_lag_ms", "ms", True, "client", "mean delay from each transaction's scheduled start to its "
           "actual start (pgbench's rate limit schedule lag; latency counts from the scheduled start)",
           columns=(*_in("points", "runs", header="sched lag ms"),
                    Column("tenants", header="sched lag ms", how="value"))),
    Metric("schedule_lag_max_ms", "ms", True, "client", "largest schedule lag of the run (pgbench)",
           columns=(*_in("points", "runs", header="sched lag max ms", how="max"),
                    Column("tenants", header="sched lag max ms", how="value"))),
    Metric("skipped_pct", "%", True, "client", "transactions skipped: already later than run.latency_limit at "
           "their scheduled start, never run (pgbench, of those scheduled)",
           columns=(*_in("points", "runs", header="skipped %"), Column("tenants", header="skipped %", how="value"))),
    Metric("late_pct", "%", True, "client", "transactions that ran longer than run.latency_limit from their "
           "scheduled start (pgbench, of those processed)",
           columns=(*_in("points", "runs", header="late %"), Column("tenants", header="late %", how="value"))),
    Metric("failed", "count", True, "client", "transactions that failed (pgbench)",
           columns=_in("tenants", how="value")),
    # ---- scenarios: faults and what they cost
    Metric("rto_s", "s", True, "scenario", "from the fault to the first write acknowledged after it (witness)",
           columns=(Column("scenarios", "rto_p50_s", "RTO p50 s", "median"),
                    Column("scenarios", "rto_max_s", "RTO max s", "max"))),
    Metric("write_gap_s", "s", True, "scenario", "longest stretch without an acknowledged write (witness)",
           columns=_in("scenarios", key="write_gap_max_s", header="write gap max s", how="max")),
    Metric("acked_lost", "count", True, "scenario", "acknowledged writes missing afterwards (witness)",
           columns=(Column("scenarios", "acked_lost_total", "acked lost", "sum"),
                    Column("scenarios", "acked_lost_max", "lost max/trial", "max"))),
    Metric("in_doubt", "count", None, "scenario", "writes whose commit the fault cut off unanswered (witness)",
           columns=_in("scenarios", header="in doubt", how="sum")),
    Metric("in_doubt_survived", "count", None, "scenario", "writes in doubt found present afterwards (witness)",
           columns=_in("scenarios", header="in doubt kept", how="sum")),
    Metric("lsn_gap_bytes", "B", True, "scenario", "WAL the new primary lacked of the old one's (witness)",
           columns=_in("scenarios", key="lsn_gap_max_bytes", header="LSN gap max B", how="max")),
    Metric("clients_aborted", "count", True, "scenario", "pgbench clients aborted by the fault",
           columns=_in("scenarios", header="clients aborted", how="sum")),
    Metric("tps_before", "tx/s", False, "scenario", "TPS before the fault (transaction log)",
           columns=_in("scenarios", header="tps before", how="median")),
    Metric("tps_during", "tx/s", False, "scenario", "TPS from the fault until recovery (transaction log)",
           columns=_in("scenarios", header="tps during", how="median")),
    Metric("tps_after", "tx/s", False, "scenario", "TPS after recovery (transaction log)",
           columns=_in("scenarios", header="tps after", how="median")),
    Metric("latency_before_ms", "ms", True, "scenario", "mean latency before the fault",
           columns=_in("scenarios", header="lat before ms", how="median")),
    Metric("latency_during_ms", "ms", True, "scenario", "mean latency from the fault until recovery",
           columns=_in("scenarios", header="lat during ms", how="median")),
    Metric("latency_after_ms", "ms", True, "scenario", "mean latency after recovery",
           columns=_in("scenarios", header="lat after ms", how="median")),
    Metric("backup_s", "s", True, "scenario", "time the base backup took",
           columns=_in("scenarios", header="backup s", how="median")),
    Metric("backup_mb_s", "MB/s", False, "scenario", "base backup throughput",
           columns=_in("scenarios", header="backup MB/s", how="median")),
    Metric("restore_s", "s", True, "scenario", "Kubernetes restore check: from the recovered Cluster's creation "
           "until it was healthy", columns=_in("scenarios", header="restore s", how="median")),
    Metric("restore_acked", "count", None, "scenario", "Kubernetes restore check: writes the witness saw acknowledged "
           "before the backup's end LSN", columns=_in("scenarios", header="restore acked", how="sum")),
    Metric("restore_lost", "count", True, "scenario", "Kubernetes restore check: of those, missing from the Cluster "
           "recovered from the backup", columns=_in("scenarios", header="restore lost", how="sum")),
    # ---- tenants plans: per tier (each a mean over the tier's tenants within a run)
    Metric("tier.{tier}.tenants", "count", None, "tenants", "tenants in the tier (its table shows their instances)",
           columns=_in("tiers", key="instances", how="median")),
    Metric("tier.{tier}.tps", "tx/s", False, "tenants", "TPS per tenant of the tier",
           columns=(*_in("tiers", key="tps_per_instance", header="TPS per instance", how="median"),
                    Column("tier-chart", "tps_per_instance", "TPS per instance, per tier"))),
    Metric("tier.{tier}.latency_avg_ms", "ms", True, "tenants", "mean latency per tenant of the tier",
           columns=_in("tiers", key="latency_avg_ms", header="latency ms", how="median")),
    Metric("tier.{tier}.latency_p95_ms", "ms", True, "tenants", "p95 latency per tenant of the tier",
           columns=_in("tiers", key="latency_p95_ms", header="p95 ms", how="median")),
    Metric("tier.{tier}.latency_p99_ms", "ms", True, "tenants", "p99 latency per tenant of the tier",
           columns=(*_in("tiers", key="latency_p99_ms", header="p99 ms", how="median"),
                    Column("tier-chart", "latency_p99_ms", "Latency p99 per tier"))),
    Metric("tier.{tier}.total_iops", "IOPS", None, "tenants", "device IOPS per tenant of the tier (its cgroup)",
           columns=_in("tiers", key="iops_per_instance", header="IOPS per instance", how="median")),
    Metric("tier.{tier}.cpu_cores", "cores", True, "tenants", "CPU per tenant of the tier (its cgroup)",
           columns=_in("tiers", key="cpu_cores_per_instance", header="cores per instance", how="median")),
    Metric("tier.{tier}.tps_spread_pct", "%", True, "tenants", "(max − min) / mean TPS of the tier's tenants",
           columns=_in("tiers", key="tps_spread_pct", header="spread %", how="median")),
    Metric("tier.{tier}.tps_min", "tx/s", False, "tenants", "TPS of the tier's slowest tenant"),
    Metric("tier.{tier}.tps_max", "tx/s", False, "tenants", "TPS of the tier's fastest tenant"),
    Metric("tier.{tier}.memory_per_instance_mb", "MB", True, "tenants", "memory per instance of the tier"),
    # ---- stored, read by the analysis (bottleneck, limits note), not a column of their own
    Metric("latency_stddev_ms", "ms", True, "client", "standard deviation of transaction latency (pgbench)"),
    Metric("latency_p50_ms", "ms", True, "client", "median transaction latency (transaction log)"),
    Metric("latency_max_ms", "ms", True, "client", "slowest transaction (transaction log)"),
    Metric("latency_log_mean_ms", "ms", True, "client", "mean latency from the transaction log"),
    Metric("initial_connection_ms", "ms", True, "client", "time to open pgbench's connections"),
    Metric("transactions", "count", None, "client", "transactions pgbench completed"),
    Metric("logged_transactions", "count", None, "client", "transactions in the (sampled) transaction log"),
    Metric("window_s", "s", None, "client", "length of the measured window"),
    Metric("load_pods", "count", None, "client", "pgbench pods that drove the run together (Kubernetes "
           "run.load_pods; none stored for one pgbench)", 0, columns=_in("points", "runs", how="max")),
    Metric("load_start_skew_s", "s", True, "client", "from the first load pod's first transaction to the last "
           "one's (run.load_pods): the common window starts at the last", 3),
    Metric("client_cpu_cores", "cores", True, "cpu", "CPU pgbench used"),
    Metric("client_cpu_cores_max", "cores", True, "cpu", "most CPU pgbench used in one second"),
    Metric("server_cpu_cores", "cores", True, "cpu", "CPU the PostgreSQL servers used"),
    Metric("interference_cpu_cores", "cores", True, "host",
           "CPU the host's processes used outside the lab (not the servers, pgbench or pglab) during the window; "
           "analysis.bottleneck.interfered() says when it is too much to trust the point"),
    Metric("cpu_user_pct", "%", None, "cpu", "host CPU in user mode"),
    Metric("cpu_sys_pct", "%", None, "cpu", "host CPU in the kernel"),
    Metric("cpu_iowait_pct", "%", True, "cpu", "host CPU idle waiting for I/O"),
    Metric("cpu_steal_pct", "%", True, "cpu", "host CPU taken by the hypervisor"),
    Metric("util_pct_max", "%", None, "storage", "highest device utilisation in one second, device-wide"),
    Metric("read_mb_s", "MB/s", None, "storage", "device-wide bytes read per second (every instance on the disk)",
           columns=_in("tenants", how="value")),
    Metric("write_mb_s", "MB/s", None, "storage", "device-wide bytes written per second (every instance on the disk)",
           columns=_in("tenants", how="value")),
    Metric("io_per_instance", "flag", None, "storage",
           "1 when the primary_*/standby_* I/O figures come from each instance's cgroup; 0 when the run's I/O "
           "figures are device-wide only (run.json's io.reason says why)"),
    Metric("primary_read_iops", "IOPS", None, "storage", "reads per second of the primary alone, per instance from "
           "its cgroup"),
    Metric("primary_read_mb_s", "MB/s", None, "storage", "bytes read per second by the primary alone, per instance "
           "from its cgroup"),
    Metric("primary_write_mb_s", "MB/s", None, "storage", "bytes written per second by the primary alone, per "
           "instance from its cgroup (cgroup v1: what its own processes submitted)"),
    Metric("primary_io_pressure_pct", "%", True, "storage", "share of the window some of the primary's tasks "
           "waited on I/O, per instance from its cgroup's io.pressure (cgroup v2 only)"),
    Metric("standby_read_iops", "IOPS", None, "storage", "reads per second of one standby (mean over the "
           "standbys), per instance from its cgroup"),
    Metric("standby_read_mb_s", "MB/s", None, "storage", "bytes read per second by one standby (mean over the "
           "standbys), per instance from its cgroup"),
    Metric("standby_write_mb_s", "MB/s", None, "storage", "bytes written per second by one standby (mean over the "
           "standbys), per instance from its cgroup"),
    Metric("standby_io_pressure_pct", "%", True, "storage", "share of the window some of one standby's tasks "
           "waited on I/O (mean over the standbys), from its cgroup's io.pressure (cgroup v2 only)"),
    Metric("dirty_mb_max", "MB", None, "memory", "most dirty page cache"),
    Metric("dirty_mb_mean", "MB", None, "memory", "mean dirty page cache"),
    Metric("writeback_mb_max", "MB", None, "memory", "most page cache under writeback"),
    Metric("commits_s", "tx/s", False, "database", "commits per second (pg_stat_database)"),
    Metric("rollbacks_s", "tx/s", True, "database", "rollbacks per second (pg_stat_database)"),
    Metric("blks_read_s", "blocks/s", None, "database", "blocks read outside shared buffers per second"),
    Metric("blks_hit_s", "blocks/s", None, "database", "blocks found in shared buffers per second"),
    Metric("cache_hit_pct", "%", False, "database", "share of block accesses found in shared buffers"),
    Metric("checkpoints_timed", "count", None, "database", "checkpoints started by checkpoint_timeout"),
    Metric("checkpoints_req", "count", None, "database", "checkpoints requested (max_wal_size, commands)"),
    Metric("buffers_checkpoint", "count", None, "database", "buffers written by checkpoints"),
    Metric("buffers_clean", "count", None, "database", "buffers written by the background writer (pg_stat_bgwriter)"),
    Metric("buffers_backend_fsync", "count", True, "database", "fsyncs the backends had to do themselves (the "
           "checkpointer's request queue full; pg_stat_io's fsyncs from PostgreSQL 17)"),
    Metric("wal_records", "count", None, "database", "WAL records generated in the window (pg_stat_wal)"),
    Metric("wal_fpi", "count", None, "database", "full-page images written to WAL in the window (pg_stat_wal)"),
    Metric("active_backends_mean", "count", None, "database", "mean active backends (pg_stat_activity)"),
    Metric("wait.{event}", "share", True, "database", "share of active backends waiting on the event"),
    Metric("disk.{device}.{figure}", "per figure", None, "storage",
           "one device's own figures (read_iops, write_mb_s, write_latency_ms, util_pct_max …)"),
    Metric("repl.{standby}.{figure}", "per figure", True, "replication", "one standby's own lags and distances"),
    Metric("write_lag_max_ms", "ms", True, "replication", "largest write lag of any standby"),
    Metric("flush_lag_max_ms", "ms", True, "replication", "largest flush lag of any standby"),
    Metric("replay_lsn_distance_max_bytes", "B", True, "replication", "most WAL any standby had left to replay"),
    Metric("limits_applied", "flag", None, "limits", "1 when the plan's resource limits were in force, else 0"),
    Metric("limit_cpus", "cores", None, "limits", "the primary's CPU limit"),
    Metric("limit_client_cpus", "cores", None, "limits", "pgbench's CPU limit"),
    Metric("primary_cpu_cores", "cores", True, "limits", "CPU the primary's cgroup used"),
    Metric("client_cgroup_cpu_cores", "cores", True, "limits", "CPU pgbench's cgroup used"),
    Metric("cpu_throttled_pct", "%", True, "limits", "CFS periods in which the primary was throttled",
           columns=_in("tenants", header="throttled %", how="value")),
    Metric("client_throttled_pct", "%", True, "limits", "CFS periods in which pgbench was throttled"),
    Metric("tenants_read_iops", "IOPS", None, "tenants", "reads per second of every tenant's cgroup added up"),
    Metric("tenants_write_iops", "IOPS", None, "tenants", "writes per second of every tenant's cgroup added up"),
    Metric("fault_at_s", "s", None, "scenario", "when the fault fell, from the start of the load"),
    Metric("recovered_s", "s", True, "scenario", "from the fault until a primary was back"),
    Metric("leader_changed", "flag", None, "scenario", "1 when a new primary took over"),
    Metric("pgbench_starts", "count", None, "scenario", "times pgbench was started during the scenario"),
    Metric("witness_attempts", "count", None, "scenario", "writes the witness attempted"),
    Metric("witness_acked", "count", None, "scenario", "writes the witness saw acknowledged"),
    Metric("witness_failed", "count", None, "scenario", "writes the witness saw refused"),
    Metric("witness_unexpected", "count", True, "scenario", "rows present the witness never wrote"),
    Metric("backup_mb", "MB", None, "scenario", "size of the base backup"),
    Metric("restore_after_acked", "count", None, "scenario", "Kubernetes restore check: writes acknowledged after "
           "the backup's end LSN"),
    Metric("restore_after_found", "count", None, "scenario", "Kubernetes restore check: of those, found in the "
           "recovered Cluster (as far as the archived WAL reached)"),
    Metric("backup_wal_mb", "MB", None, "scenario", "WAL the base backup carried"),
    Metric("backup_wait_s", "s", True, "scenario", "Kubernetes: from the Backup's creation until the operator began"),
    Metric("backup_operator_s", "s", True, "scenario", "Kubernetes: the backup's duration as the operator reports it "
           "(its start and stop times)"),
    Metric("backup_objects", "count", None, "scenario", "Kubernetes: objects of the base backup in the object store"),
    Metric("archive_wal_objects", "count", None, "database", "Kubernetes: WAL objects in the object store's archive "
           "after the run"),
    Metric("archive_wal_mb", "MB", None, "database", "Kubernetes: size of the WAL archive in the object store after "
           "the run"),
    Metric("archived_wal_segments", "count", None, "database", "WAL segments archived over the run (pg_stat_archiver)"),
    Metric("archive_failed", "count", True, "database", "failed attempts to archive a WAL segment (pg_stat_archiver)"),
    Metric("wal_segments_written", "count", None, "database", "WAL written over the run, in 16 MiB segments"),
    Metric("pg_wal_growth_mb", "MB", None, "database", "how much pg_wal grew over the run"),
    Metric("archive_ready_max", "count", True, "database", "most WAL segments waiting to be archived at one read"),
    Metric("archiver_span_s", "s", None, "database", "time between the reads the archiver's figures come from"),
)


@cache
def _by_name() -> dict[str, Metric]:
    return {m.name: m for m in METRICS}


@cache
def _patterns() -> list[tuple[re.Pattern[str], Metric]]:
    return [(re.compile(re.sub(r"\\\{\w+\\\}", r"[^.]+", re.escape(m.name)) + "$"), m)
            for m in METRICS if "{" in m.name]


def get(name: str) -> Metric | None:
    """The entry of a stored name (``tier.gold.tps`` finds ``tier.{tier}.tps``); None when not catalogued."""
    if (m := _by_name().get(name)) is not None:
        return m
    return next((m for pattern, m in _patterns() if pattern.match(name)), None)


def lower_is_better(name: str) -> bool | None:
    """Which way is better for ``name``: the catalogue's word; for a name it does not know, guessed from the name
    (latencies, lags and durations lower, the rest higher), as compare did before there was a catalogue."""
    if (m := get(name)) is not None:
        return m.lower_is_better
    n = name.lower()
    return "latency" in n or "lag" in n or n.endswith(("_ms", "_s", "_us"))


@dataclass(frozen=True)
class Shown:
    """A metric column of one table: its key, header and how runs combine, with its metric and its column."""

    key: str
    header: str
    how: How
    metric: Metric
    column: Column

    @property
    def short(self) -> str:
        """The header without its unit ("lat ms" → "lat"): the figure's name in a Δ's or a verdict's title."""
        return self.header.removesuffix(f" {self.metric.unit}")


@cache
def columns(table: str) -> tuple[Shown, ...]:
    """The metric columns of ``table`` (or view) in catalogue order (a view's: in the order of their ``at``)."""
    if table not in (*TABLES, *VIEWS):
        raise ValueError(f"no report table '{table}'; one of {', '.join((*TABLES, *VIEWS))}")
    return tuple(sorted((Shown(c.key or m.name, c.header or c.key or m.name, c.how, m, c)
                         for m in METRICS for c in m.columns if c.table == table), key=lambda s: s.column.at))


def keys(table: str) -> tuple[str, ...]:
    return tuple(s.key for s in columns(table))


def headers(table: str) -> dict[str, str]:
    """Terminal / markdown headers of the table's metric columns that differ from their key."""
    return {s.key: s.header for s in columns(table) if s.header != s.key}


@cache
def decimals() -> dict[str, int]:
    """Decimals of every metric column key in the terminal and markdown tables (one per key, whatever the table)."""
    return {s.key: s.metric.decimals for t in TABLES for s in columns(t)}


def with_ci(table: str = "points") -> tuple[str, ...]:
    """Metric columns shown as mean ± 95 % interval."""
    return tuple(s.key for s in columns(table) if s.metric.ci)


def combine(how: How, values: Iterable[float | None]) -> float | None:
    """The runs' values of one row in one figure, as the column says (None when no run measured it)."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return None
    if how == "value":
        if len(present) > 1:
            raise ValueError("a 'value' column holds one run's figure, not several")
        return present[0]
    if how == "mean":
        return statistics.fmean(present)
    if how == "median":
        return statistics.median(present)
    return max(present) if how == "max" else sum(present)
