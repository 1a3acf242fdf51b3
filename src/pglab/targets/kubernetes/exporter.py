"""PostgreSQL figures of a Kubernetes run from CloudNativePG's exporter (port 9187 of each instance pod).

pglab reads it through the API server's pod proxy while a run's Job is running, every few seconds, and keeps the
raw text. A run's figures are the primary's counters over the scrapes taken inside the measured window (the first
and the last), stored under the names the local ``pg`` and ``repl`` probes use where they mean the same thing. A
metric the exporter does not serve (an older PostgreSQL, a custom monitoring config) gives no figure, not a zero.

Clocks: the scrapes are stamped with this machine's clock, the window with the client node's (pgbench's log); on
NTP-synchronised machines the difference is far below the scrape interval.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from pglab.errors import first_line
from pglab.probes.base import now

MIB = 1024 * 1024
Key = tuple[str, frozenset[tuple[str, str]]]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse(text: str) -> dict[Key, float]:
    """Prometheus text format (version 0.0.4) → {(metric, labels): value}; comments and malformed lines skipped."""
    out: dict[Key, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name, raw_labels, raw_value = m.groups()
        try:
            value = float(raw_value)  # Go prints NaN, +Inf, -Inf: float() reads them all
        except ValueError:
            continue
        labels = {k: re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e.group(0)], v)
                  for k, v in _LABEL.findall(raw_labels or "")}
        out[(name, frozenset(labels.items()))] = value
    return out


@dataclass
class Scrape:
    """One read of one pod's exporter: when (this machine's clock), the text, or why there is none."""

    pod: str
    ts: float  # the middle of the read: the answer's counters are from some time during it (or a cached query
    text: str | None  # result up to metricsQueriesTTL older)
    error: str | None = None
    values: dict[Key, float] = field(default_factory=dict)
    took: float = 0.0  # how long the read took (through the API server's proxy: up to seconds on a busy node)


class Scraper:
    """Reads the /metrics of ``pods`` (the instances' exporters, or node-exporters) every ``interval`` seconds in a
    thread of its own between ``start`` and ``stop``, and once more when asked (``final``). A pod that cannot be
    read (being recreated, no pods/proxy permission, a timeout) is noted, not fatal."""

    def __init__(self, read: Callable[[str], str], pods: list[str], interval: float, primary: str):
        self.read, self.pods, self.interval, self.primary = read, pods, interval, primary
        self.scrapes: list[Scrape] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="pglab-scraper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end and wait for its read under way (each bounded by the read's own timeout)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._read(self.pods, until_stopped=True)
            self._stop.wait(self.interval)

    def final(self) -> None:
        """One read of every pod, the pods read together (each scrape keeps its own time)."""
        if len(self.pods) < 2:
            self._read(self.pods)
            return
        with ThreadPoolExecutor(len(self.pods), thread_name_prefix="pglab-scrape") as pool:
            done = list(pool.map(self._one, self.pods))
        self.scrapes.extend(done)

    def _read(self, pods: list[str], until_stopped: bool = False) -> None:
        """``pods`` one after the other; with ``until_stopped``, none once ``stop`` was asked: a read begun then
        would fall after the run's window (the run's load has ended when it stops the reader) and the closing
        ``final`` reads every pod just after anyway."""
        for pod in pods:
            if until_stopped and self._stop.is_set():
                return
            self.scrapes.append(self._one(pod))

    def _one(self, pod: str) -> Scrape:
        before = now()
        try:
            text: str | None = self.read(pod)
            error = None
        except Exception as exc:  # the API server's or the pod's answer: a gap in the figures, not a failure
            text, error = None, first_line(exc)
        after = now()
        scrape = Scrape(pod, (before + after) / 2, text, error, took=after - before)
        if text is not None:
            scrape.values = parse(text)
        return scrape

    def errors(self) -> list[str]:
        return sorted({f"pod/{s.pod}: {s.error}" for s in self.scrapes if s.error})

    def write(self, folder: Path, names: dict[str, str] | None = None, keep: str = "") -> list[str]:
        """The raw texts, one file per pod (``names``: pod → file stem, default the pod's name), each scrape headed
        by ``# pglab scrape ts=<epoch>``; only the lines starting with ``keep`` when given."""
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for pod in self.pods:
            blocks = []
            for s in (s for s in self.scrapes if s.pod == pod):
                text = "".join(f"{line}\n" for line in (s.text or "").splitlines() if line.startswith(keep))
                blocks.append(f"# pglab scrape ts={s.ts:.6f}" + (f" error={s.error}\n" if s.error else f"\n{text}"))
            name = f"{(names or {}).get(pod, pod)}.prom"
            (folder / name).write_text("".join(blocks))
            written.append(f"{folder.name}/{name}")
        return written


# ------------------------------------------------------------------ what the figures are
# local name → the exporter's metric (a PostgreSQL 17 alternative second); database counters are per datname
_DATABASE = {"commits": "cnpg_pg_stat_database_xact_commit", "rollbacks": "cnpg_pg_stat_database_xact_rollback",
             "blks_read": "cnpg_pg_stat_database_blks_read", "blks_hit": "cnpg_pg_stat_database_blks_hit"}
_SERVER = {"wal_bytes": ("cnpg_collector_wal_bytes",),
           "checkpoints_timed": ("cnpg_pg_stat_bgwriter_checkpoints_timed",
                                 "cnpg_pg_stat_checkpointer_checkpoints_timed"),
           "checkpoints_req": ("cnpg_pg_stat_bgwriter_checkpoints_req", "cnpg_pg_stat_checkpointer_checkpoints_req"),
           "buffers_checkpoint": ("cnpg_pg_stat_bgwriter_buffers_checkpoint",
                                  "cnpg_pg_stat_checkpointer_buffers_written"),
           # pg_stat_wal (the operator's own collector, PostgreSQL 14+) and the backends' own writes (its default
           # pg_stat_bgwriter query, up to PostgreSQL 16: on 17 it serves none, so no figure)
           "wal_records": ("cnpg_collector_wal_records",), "wal_fpi": ("cnpg_collector_wal_fpi",),
           "buffers_backend": ("cnpg_pg_stat_bgwriter_buffers_backend",),
           "buffers_backend_fsync": ("cnpg_pg_stat_bgwriter_buffers_backend_fsync",),
           "buffers_clean": ("cnpg_pg_stat_bgwriter_buffers_clean",)}
_COUNTS = ("checkpoints_timed", "checkpoints_req", "buffers_checkpoint", "wal_records", "wal_fpi", "buffers_backend",
           "buffers_backend_fsync", "buffers_clean")  # stored as the window's counts, as the local pg probe does
# the primary's pg_stat_replication, per standby (application_name): local name → (metric, factor)
_REPLICATION = {"write_lag_ms": ("cnpg_pg_stat_replication_write_lag_seconds", 1000.0),
                "flush_lag_ms": ("cnpg_pg_stat_replication_flush_lag_seconds", 1000.0),
                "replay_lag_ms": ("cnpg_pg_stat_replication_replay_lag_seconds", 1000.0),
                "replay_lsn_distance_bytes": ("cnpg_pg_stat_replication_replay_diff_bytes", 1.0)}
_REPLICATION_MAX = {"write_lag_ms": "write_lag_max_ms", "flush_lag_ms": "flush_lag_max_ms",
                    "replay_lag_ms": "replay_lag_max_ms", "replay_lsn_distance_bytes": "replay_lsn_distance_max_bytes"}


def counters(values: dict[Key, float], database: str) -> dict[str, Key]:
    """The key of each counter pglab reads, as this scrape has it (labels included: a counter whose labels change,
    such as the WAL figures' ``stats_reset``, was reset in between and gives no delta)."""
    out: dict[str, Key] = {}
    for local, metric in _DATABASE.items():
        key = (metric, frozenset({("datname", database)}))
        if key in values:
            out[local] = key
    for local, metrics in _SERVER.items():
        for metric in metrics:
            keys = [k for k in values if k[0] == metric]
            if len(keys) == 1:
                out[local] = keys[0]
                break
    return out


def deltas(a: Scrape, b: Scrape, database: str) -> dict[str, float]:
    """Counter increases from ``a`` to ``b``; a counter missing in either, reset or not finite gives nothing."""
    ka, kb = counters(a.values, database), counters(b.values, database)
    out = {}
    for name, key in kb.items():
        if ka.get(name) == key:
            d = b.values[key] - a.values[key]
            if math.isfinite(d) and d >= 0:
                out[name] = d
    return out


def rates(d: dict[str, float], dt: float) -> dict[str, float]:
    """The local pg probe's figures from counter increases over ``dt`` seconds."""
    out = {}
    for name, key in (("commits", "commits_s"), ("rollbacks", "rollbacks_s"), ("blks_read", "blks_read_s"),
                      ("blks_hit", "blks_hit_s")):
        if name in d:
            out[key] = d[name] / dt
    if "wal_bytes" in d:
        out["wal_mb_s"] = d["wal_bytes"] / MIB / dt
    return out


def replication(values: dict[Key, float]) -> dict[str, dict[str, float]]:
    """Per standby (application_name), the lags and distance the primary's exporter shows."""
    out: dict[str, dict[str, float]] = {}
    for local, (metric, factor) in _REPLICATION.items():
        for (name, labels), value in values.items():
            if name == metric and math.isfinite(value):
                standby = dict(labels).get("application_name") or "standby"
                out.setdefault(standby, {})[local] = value * factor
    return out


def standbys_behind(values: dict[Key, float], standbys: set[str]) -> list[str]:
    """Which of ``standbys`` (instance pods: CloudNativePG streams under the pod's name) the primary's exporter
    does not show caught up: not in its pg_stat_replication, or WAL left to replay. Empty when all are."""
    distance = {k: v.get("replay_lsn_distance_bytes") for k, v in replication(values).items()}
    out = []
    for name in sorted(standbys):
        if name not in distance or distance[name] is None:
            out.append(f"{name} not streaming")
        elif distance[name] > 0:  # type: ignore[operator]
            out.append(f"{name} {distance[name]:.0f} bytes behind")
    return out


# the WAL archiver (pg_stat_archiver, and the collector's pg_wal and archive_status counts), over the whole run
_ARCHIVED, _FAILED = "cnpg_pg_stat_archiver_archived_count", "cnpg_pg_stat_archiver_failed_count"
_PG_WAL, _ARCHIVE_STATUS = "cnpg_collector_pg_wal", "cnpg_collector_pg_wal_archive_status"
WAL_SEGMENT = 16 * MIB  # PostgreSQL's default wal_segment_size (CloudNativePG's too)


def _one(values: dict[Key, float], metric: str, **labels: str) -> float | None:
    value = values.get((metric, frozenset(labels.items())))
    return value if value is not None and math.isfinite(value) else None


def archiver(scrapes: list[Scrape], primary: str) -> tuple[dict[str, float], list[tuple[float, str, str, float]]]:
    """The WAL archiver over the run (the primary's first and last scrape, the one after the Job included: archiving
    lags the load): segments archived and failed attempts (pg_stat_archiver), WAL written in segments (the
    collector's wal_bytes), pg_wal's growth and the most segments waiting to be archived (archive_status .ready)
    at any scrape; per scrape, the ready segments and pg_wal's size as series. Nothing when archiving is off."""
    mine = [s for s in scrapes if s.pod == primary and s.text is not None and _ARCHIVED in {k[0] for k in s.values}]
    series: list[tuple[float, str, str, float]] = []
    ready: list[float] = []
    for s in mine:
        if (r := _one(s.values, _ARCHIVE_STATUS, value="ready")) is not None:
            ready.append(r)
            series.append((s.ts, "archiver", "ready_segments", r))
        if (size := _one(s.values, _PG_WAL, value="size")) is not None:
            series.append((s.ts, "archiver", "pg_wal_mb", size / MIB))
    if len(mine) < 2 or mine[-1].ts <= mine[0].ts:
        return {}, series
    first, last = mine[0], mine[-1]
    out: dict[str, float] = {}
    for name, metric in (("archived_wal_segments", _ARCHIVED), ("archive_failed", _FAILED)):
        a, b = _one(first.values, metric), _one(last.values, metric)
        if a is not None and b is not None and b >= a:
            out[name] = b - a
    d = deltas(first, last, "")
    if "wal_bytes" in d:
        out["wal_segments_written"] = d["wal_bytes"] / WAL_SEGMENT
    a, b = _one(first.values, _PG_WAL, value="size"), _one(last.values, _PG_WAL, value="size")
    if a is not None and b is not None:
        out["pg_wal_growth_mb"] = (b - a) / MIB
    if ready:
        out["archive_ready_max"] = max(ready)
    out["archiver_span_s"] = last.ts - first.ts
    return out, series


@dataclass
class RunFigures:
    """A run's PostgreSQL figures from the exporter, its series, and which scrapes they came from."""

    metrics: dict[str, float]
    series: list[tuple[float, str, str, float | None]]
    info: dict[str, object]


def summarize(scrapes: list[Scrape], primary: str, window: tuple[float, float], database: str) -> RunFigures:
    """Window figures from the primary's first and last scrape inside ``window``; series between consecutive ones."""
    mine = [s for s in scrapes if s.pod == primary and s.text is not None]
    series: list[tuple[float, str, str, float | None]] = []
    for a, b in itertools.pairwise(mine):
        if b.ts > a.ts:
            series += [(b.ts, "pg", k, v) for k, v in rates(deltas(a, b, database), b.ts - a.ts).items()]
    for s in mine:
        for standby, lags in replication(s.values).items():
            series += [(s.ts, f"repl:{standby}", k, v) for k, v in lags.items()]
    inside = [s for s in mine if window[0] <= s.ts <= window[1]]
    info: dict[str, object] = {"primary": primary, "scrapes": len(mine), "in_window": len(inside)}
    metrics: dict[str, float] = {}
    # an answer can lack a query's metrics (the exporter's query failed or timed out on a busy node): each group of
    # counters is taken over the first and last scrapes inside the window that have it
    groups = {"database": tuple(_DATABASE), "server": tuple(_SERVER)}
    for group, names in groups.items():
        having = [s for s in inside if any(n in counters(s.values, database) for n in names)]
        if len(having) < len(inside):
            info[f"without_{group}_counters"] = len(inside) - len(having)
        if len(having) < 2 or having[-1].ts <= having[0].ts:
            continue
        first, last = having[0], having[-1]
        if group == "database":
            info.update(start=first.ts, end=last.ts, start_read_s=first.took, end_read_s=last.took)
        d = {k: v for k, v in deltas(first, last, database).items() if k in names}
        metrics.update(rates(d, last.ts - first.ts))
        metrics.update({k: d[k] for k in _COUNTS if k in d})
        if "blks_hit" in d and "blks_read" in d and d["blks_hit"] + d["blks_read"] > 0:
            metrics["cache_hit_pct"] = d["blks_hit"] / (d["blks_hit"] + d["blks_read"]) * 100
    # per commit, as the local probe's: both counters from the same two scrapes (the first and last inside the window
    # that have both groups)
    both = [s for s in inside if {"commits", "wal_bytes"} <= counters(s.values, database).keys()]
    if len(both) >= 2 and both[-1].ts > both[0].ts:
        d = deltas(both[0], both[-1], database)
        if d.get("commits"):
            metrics.update({f"{k}_per_commit": d[k] / d["commits"] for k in ("wal_bytes", "wal_fpi") if k in d})
    if "start" not in info:
        info["note"] = "fewer than two scrapes of the primary's database counters inside the window: no commit figures"
    per_standby: dict[str, dict[str, float]] = {}
    for s in inside:
        for standby, lags in replication(s.values).items():
            for k, v in lags.items():
                per_standby.setdefault(standby, {})[k] = max(v, per_standby.get(standby, {}).get(k, -math.inf))
    for local, key in _REPLICATION_MAX.items():
        values = [lags[local] for lags in per_standby.values() if local in lags]
        if values:
            metrics[key] = max(values)
        for standby, lags in sorted(per_standby.items()):
            if local in lags:
                metrics[f"repl.{standby}.{key}"] = lags[local]
    archived, archive_series = archiver(scrapes, primary)
    metrics.update(archived)
    series += archive_series
    return RunFigures(metrics, series, info)
