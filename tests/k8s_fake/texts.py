"""What the fake's pods and exporters print: a Job's log with its results tarball, CloudNativePG's exporter,
node-exporter's diskstats, the disk sampler's and /proc/diskstats' text. Tests build expected figures from these."""

from __future__ import annotations

import base64
import io
import tarfile
from decimal import Decimal

from pglab.targets.kubernetes.scripts import BEGIN_MARK, DISKSTATS_MARK, END_MARK


def results_log(files: dict[str, str], text: str = "progress: 1.0 s, 100 tps\n") -> str:
    """A pod log as a pglab Job prints it: its own output, then its /results folder as a base64 tarball."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, content in files.items():
            data = content.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob = base64.encodebytes(buf.getvalue()).decode()
    return f"{text}{BEGIN_MARK}\n{blob}{END_MARK}\n"


# ------------------------------------------------------------------ the exporter
CAUGHT_UP = {"replay_diff_bytes": 0.0, "replay_lag_seconds": 0.0, "write_lag_seconds": 0.0, "flush_lag_seconds": 0.0}


def exporter_text(pod: str, values: dict[str, float | None] | None = None, *, primary: bool = True,
                  standbys: dict[str, dict[str, float]] | None = None, pg17: bool = False,
                  stats_reset: str = "2026-11-20T08:12:31.203411Z", database: str = "app") -> str:
    """The text CloudNativePG's exporter serves on :9187/metrics, for the metrics pglab reads.

    The shape (HELP/TYPE lines, metric and label names, Go's float formatting such as 1.3429908e+07, the
    ``stats_reset`` label of the pg_stat_wal figures, one sample per database with the empty datname of shared
    objects) follows a real exporter dump of a CloudNativePG 1.24 instance running PostgreSQL 16.5, published in
    tensorchord/pgvecto.rs-docs (src/cloud/monitoring/collect-metrics.md), and the metric definitions of
    cloudnative-pg's config/manager/default-monitoring.yaml and metricserver/pg_collector.go (PostgreSQL 17 moves
    the checkpoint counters to cnpg_pg_stat_checkpointer_*). Values are the given ones over defaults from that
    dump; a value given as None is left out, as an exporter that does not serve it."""
    given: dict[str, float | None] = {
        "xact_commit": 7887.0, "xact_rollback": 3.0, "blks_read": 316.0, "blks_hit": 1284724.0,
        "wal_bytes": 13429908.0, "checkpoints_timed": 4.0, "checkpoints_req": 2.0, "buffers_checkpoint": 1145.0,
        "wal_records": 32123.0, "wal_fpi": 1830.0, "buffers_backend": 2204.0, "buffers_backend_fsync": 0.0,
        "buffers_clean": 0.0, **(values or {})}
    v = {k: x for k, x in given.items() if x is not None}  # None: the exporter does not serve it
    out: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
        out.extend(f"{name}{labels} {_go_float(value)}" for labels, value in samples)

    family("cnpg_collector_up", "gauge", "1 if PostgreSQL is up, 0 otherwise.", [(f'{{cluster="{pod[:-2]}"}}', 1)])
    if "wal_bytes" in v:
        family("cnpg_collector_wal_bytes", "gauge", "Total amount of WAL generated in bytes. Only available on PG 14+",
               [(f'{{stats_reset="{stats_reset}"}}', v["wal_bytes"])])
    for metric, text in (("fpi", "Total number of WAL full page images generated. Only available on PG 14+"),
                         ("records", "Total number of WAL records generated. Only available on PG 14+")):
        if f"wal_{metric}" in v:
            family(f"cnpg_collector_wal_{metric}", "gauge", text,
                   [(f'{{stats_reset="{stats_reset}"}}', v[f"wal_{metric}"])])
    family("cnpg_pg_replication_in_recovery", "gauge", "Whether the instance is in recovery",
           [("", 0 if primary else 1)])
    family("cnpg_pg_replication_lag", "gauge", "Replication lag behind primary in seconds", [("", 0)])
    prefix, written = ("cnpg_pg_stat_checkpointer", "buffers_written") if pg17 else ("cnpg_pg_stat_bgwriter",
                                                                                     "buffers_checkpoint")
    for metric, key, text in ((written, "buffers_checkpoint", "Number of buffers written during checkpoints"),
                              ("checkpoints_req", "checkpoints_req", "Number of requested checkpoints that have "
                               "been performed"),
                              ("checkpoints_timed", "checkpoints_timed", "Number of scheduled checkpoints that have "
                               "been performed")):
        if key in v:
            family(f"{prefix}_{metric}", "counter", text, [("", v[key])])
    if not pg17:  # CloudNativePG's default pg_stat_bgwriter query; PostgreSQL 17 has no backend writes there
        for metric, text in (("buffers_backend", "Number of buffers written directly by a backend"),
                             ("buffers_backend_fsync", "Number of times a backend had to execute its own fsync call"),
                             ("buffers_clean", "Number of buffers written by the background writer")):
            if metric in v:
                family(f"cnpg_pg_stat_bgwriter_{metric}", "counter", text, [("", v[metric])])
    for metric, text in (("blks_hit", "Number of times disk blocks were found already in the buffer cache"),
                         ("blks_read", "Number of disk blocks read in this database"),
                         ("xact_commit", "Number of transactions in this database that have been committed"),
                         ("xact_rollback", "Number of transactions in this database that have been rolled back")):
        if metric in v:
            family(f"cnpg_pg_stat_database_{metric}", "counter", text,
                   [('{datname=""}', 94), (f'{{datname="{database}"}}', v[metric]), ('{datname="postgres"}', 5928),
                    ('{datname="template0"}', 0), ('{datname="template1"}', 1177)])
    if primary and standbys:
        for metric, text in (("flush_lag_seconds", "Time elapsed between flushing recent WAL locally and receiving "
                              "notification that this standby server has written and flushed it"),
                             ("replay_diff_bytes", "Difference in bytes from the last write-ahead log location "
                              "replayed into the database on this standby server"),
                             ("replay_lag_seconds", "Time elapsed between flushing recent WAL locally and receiving "
                              "notification that this standby server has written, flushed and applied it"),
                             ("write_lag_seconds", "Time elapsed between flushing recent WAL locally and receiving "
                              "notification that this standby server has written it")):
            family(f"cnpg_pg_stat_replication_{metric}", "gauge", text,
                   [(f'{{application_name="{name}",client_addr="10.244.0.{11 + i}",client_port="4{i}210",'
                     f'usename="streaming_replica"}}', lags[metric])
                    for i, (name, lags) in enumerate(sorted(standbys.items())) if metric in lags])
    family("go_goroutines", "gauge", "Number of goroutines that currently exist.", [("", 77)])
    return "\n".join(out) + "\n"


def _go_float(value: float) -> str:
    """A value as the Prometheus Go client prints it (strconv 'g', shortest digits): exponent form from 1e+06 up
    and below 1e-04 (13429908 → 1.3429908e+07), plain otherwise (1145, 0.00123)."""
    if value != value:
        return "NaN"
    if value == 0:
        return "0"
    sign, digits, exponent = Decimal(repr(float(value))).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    exp10 = len(text) + exponent - 1
    if exp10 < -4 or exp10 >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{'-' if sign else ''}{mantissa}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"
    return f"{'-' if sign else ''}{Decimal((0, digits, exponent)):f}"


# ------------------------------------------------------------------ node-exporter
NODE_EXPORTER_NS = "monitoring"
NODE_EXPORTER_SELECTOR = "app.kubernetes.io/name=prometheus-node-exporter"  # the plan's default labels


def node_exporter_text(counters: dict[str, list[int]], boot_time: float = 1763798400.0) -> str:
    """node-exporter's diskstats collector output for /proc/diskstats counters (DEVICES, all zero unless given):
    node_disk_info with the numbers, then the counters with sectors × 512 as bytes and milliseconds / 1000 as
    seconds, as collector/diskstats_linux.go writes them; its default filter leaves loop, zram and partitions out."""
    shown = [(ma, mi, name) for ma, mi, name in DEVICES if not name.startswith(("loop", "zram"))]
    out = ["# HELP node_disk_info Info of /sys/block/<block_device>.", "# TYPE node_disk_info gauge"]
    out += [f'node_disk_info{{device="{name}",major="{ma}",minor="{mi}",model="",path="pci-0000:00:0{4 + i}.0",'
            f'revision="",rotational="1",serial="",wwn=""}} 1' for i, (ma, mi, name) in enumerate(shown)]
    for metric, index, scale in (("reads_completed_total", 0, 1), ("reads_merged_total", 1, 1),
                                 ("read_bytes_total", 2, 512), ("read_time_seconds_total", 3, 0.001),
                                 ("writes_completed_total", 4, 1), ("writes_merged_total", 5, 1),
                                 ("written_bytes_total", 6, 512), ("write_time_seconds_total", 7, 0.001),
                                 ("io_now", 8, 1), ("io_time_seconds_total", 9, 0.001),
                                 ("io_time_weighted_seconds_total", 10, 0.001)):
        out += [f"# HELP node_disk_{metric} .", f"# TYPE node_disk_{metric} counter"]
        out += [f'node_disk_{metric}{{device="{name}"}} {_go_float(counters.get(name, [0] * 17)[index] * scale)}'
                for _, _, name in shown]
    out += ["# HELP node_load1 1m load average.", "# TYPE node_load1 gauge", "node_load1 0.42",
            "# HELP node_boot_time_seconds Node boot time, in unixtime.", "# TYPE node_boot_time_seconds gauge",
            f"node_boot_time_seconds {_go_float(boot_time)}"]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ the disk sampler's log
# The devices of the machine these tests were written on (its /proc/diskstats: 8 loop devices, the virtio disk vda,
# zram0), with a second virtio disk vdb as the database volume; 17 counters a line, as kernels since 5.5 print.
DEVICES = [(7, i, f"loop{i}") for i in range(8)] + [(254, 0, "vda"), (254, 16, "vdb"), (253, 0, "zram0")]


def diskstats_text(counters: dict[str, list[int]]) -> str:
    """/proc/diskstats as the kernel prints it ("%4d %7d %s" then the counters); a device not given is all zeros.
    Counters in the kernel's order: reads, reads merged, sectors read, ms reading, writes, writes merged, sectors
    written, ms writing, in flight, ms doing I/O, weighted ms, then discards (4), flushes (2)."""
    lines = []
    for major, minor, name in DEVICES:
        values = counters.get(name, [0] * 17)
        assert len(values) == 17
        lines.append(f"{major:4d} {minor:7d} {name} " + " ".join(map(str, values)))
    return "\n".join(lines)


def boot_id(node: str) -> str:
    """A kernel boot id of the node's own (a machine per node)."""
    return f"00000000-0000-4000-8000-{sum(map(ord, node)):012d}"


def sampler_log(node: str, blocks: list[tuple[float, dict[str, list[int]]]], kernel: str | None = None) -> str:
    """The disk sampler pod's log as its script prints it: per sample a header with the node's epoch (date
    +%s.%N, nine decimals), name and kernel boot id (a machine per node by default), the file, an end line with
    the epoch again (here the same: the file read at ``ts``)."""
    kernel = kernel or boot_id(node)
    return "".join(f"{DISKSTATS_MARK} {ts:.9f} {node} {kernel}\n{diskstats_text(c)}\n{DISKSTATS_MARK} end {ts:.9f}\n"
                   for ts, c in blocks)
