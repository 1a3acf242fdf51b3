"""PostgreSQL's own counters, every second: transactions, buffer reads/hits, WAL volume and records, checkpoints,
buffers written by backends and the background writer.

One autocommit connection, one query per tick (so the probe adds one read-only commit per second to
``xact_commit``, negligible against any benchmark). Counters are sampled as deltas with the monotonic Δt of
the reads; raw deltas are emitted too so window means are exact ratios of sums.

Note on timing: backends publish their transaction counts to shared statistics at most once per second
(PostgreSQL ≥ 15) and at disconnect, so per-second commit rates are lumpy by up to one second; means over a
window of several seconds are not. WAL position is read live. MB are MiB (1 048 576 bytes), as iostat's
MB/s, so wal_mb_s compares directly with the disk probe's write_mb_s.

Why a run went as it did (issue 29): pg_stat_wal's records, full-page images and bytes (PostgreSQL 14+; none on an
older server), per commit over the window; buffers the backends had to write themselves (pg_stat_bgwriter's
buffers_backend and buffers_backend_fsync up to PostgreSQL 16, pg_stat_io's relation writes and fsyncs of every
backend type but the checkpointer and background writer from 17) and the background writer's buffers_clean.
pg_stat_wal is published with the backends' other statistics (with the commits), so WAL per commit is a ratio of
counters flushed together.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pglab.probes._pg import PgConnection
from pglab.probes._util import Row, rows_in_window
from pglab.probes.base import ProbeContext, Sample

MIB = 1024 * 1024

_DB_QUERY = """
SELECT d.xact_commit, d.xact_rollback, d.blks_read, d.blks_hit,
       pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                            ELSE pg_current_wal_lsn() END, '0/0')::float8,
       c.*, w.*, b.*
FROM pg_stat_database d, ({checkpoints}) c, ({wal}) w, ({backends}) b
WHERE d.datname = current_database()
"""
_CHECKPOINTS_BGWRITER = "SELECT checkpoints_timed, checkpoints_req, buffers_checkpoint FROM pg_stat_bgwriter"
_CHECKPOINTS_CHECKPOINTER = "SELECT num_timed, num_requested, buffers_written FROM pg_stat_checkpointer"
_WAL = "SELECT wal_records, wal_fpi, wal_bytes::float8 FROM pg_stat_wal"
_NO_WAL = "SELECT NULL::bigint, NULL::bigint, NULL::float8"  # before PostgreSQL 14: no pg_stat_wal
_BACKENDS_BGWRITER = "SELECT buffers_backend, buffers_backend_fsync, buffers_clean FROM pg_stat_bgwriter"
# PostgreSQL 17 dropped buffers_backend*: every backend's own writes of shared relation buffers are in pg_stat_io
_BACKENDS_IO = ("SELECT coalesce(sum(writes), 0), coalesce(sum(fsyncs), 0), "
                "(SELECT buffers_clean FROM pg_stat_bgwriter) FROM pg_stat_io "
                "WHERE object = 'relation' AND backend_type NOT IN ('checkpointer', 'background writer')")

_COUNTERS = (
    "commits",
    "rollbacks",
    "blks_read",
    "blks_hit",
    "wal_bytes",
    "checkpoints_timed",
    "checkpoints_req",
    "buffers_checkpoint",
    "wal_records",
    "wal_fpi",
    "wal_stat_bytes",  # pg_stat_wal.wal_bytes: the records' bytes (wal_bytes above is the LSN's advance)
    "buffers_backend",
    "buffers_backend_fsync",
    "buffers_clean",
)
_COUNTS = ("checkpoints_timed", "checkpoints_req", "buffers_checkpoint", "buffers_backend", "buffers_backend_fsync",
           "buffers_clean")  # emitted per tick as they are (counts), summed over a window
_RAW = ("commits", "rollbacks", "blks_read", "blks_hit", "wal_bytes", "wal_records", "wal_fpi", "wal_stat_bytes")


def _query_for(server_version_num: int) -> str:
    """PostgreSQL 17 moved the checkpoint counters from pg_stat_bgwriter to pg_stat_checkpointer and the backends'
    writes to pg_stat_io; pg_stat_wal came with 14."""
    v17 = server_version_num >= 170000
    return _DB_QUERY.format(checkpoints=_CHECKPOINTS_CHECKPOINTER if v17 else _CHECKPOINTS_BGWRITER,
                            wal=_WAL if server_version_num >= 140000 else _NO_WAL,
                            backends=_BACKENDS_IO if v17 else _BACKENDS_BGWRITER)


class PgStatsProbe:
    """Per-second rates of the primary's database statistics."""

    name = "pg"

    def __init__(self, ctx: ProbeContext, interval: float = 1.0):
        self.ctx = ctx
        self.interval = interval
        self._db = PgConnection(ctx.primary_conninfo, "pg")
        self._query = ""
        self._prev: tuple[float, tuple[float | None, ...]] | None = None
        self.server_version_num = 0

    def open(self) -> None:
        conn = self._db.open()
        self.server_version_num = conn.info.server_version
        self._query = _query_for(self.server_version_num)
        self._prev = self._read()

    def _read(self) -> tuple[float, tuple[float | None, ...]] | None:
        got = self._db.fetchall(self._query)
        t = time.monotonic()
        if self._db.reconnected:  # the server may have restarted (failover): counters restart
            self._prev = None
        if not got:
            return None
        return t, tuple(float(v) if v is not None else None for v in got[0])  # None: not on this server

    def sample(self, ts: float) -> list[Sample]:
        cur = self._read()
        prev, self._prev = self._prev, cur
        if cur is None or prev is None:
            return []
        dt = cur[0] - prev[0]
        deltas = [c - p if c is not None and p is not None else None for c, p in zip(cur[1], prev[1], strict=True)]
        if dt <= 0 or any(d is not None and d < 0 for d in deltas):
            return []  # statistics were reset (or the server restarted): this read is the new baseline
        d = {k: v or 0.0 for k, v in zip(_COUNTERS, deltas, strict=True)}
        values: dict[str, float | None] = {
            "commits_s": d["commits"] / dt,
            "rollbacks_s": d["rollbacks"] / dt,
            "blks_read_s": d["blks_read"] / dt,
            "blks_hit_s": d["blks_hit"] / dt,
            "wal_mb_s": d["wal_bytes"] / MIB / dt,
            **{k: d[k] for k in _COUNTS},
            **{f"d_{k}": d[k] for k in _RAW},
            "dt": dt,
        }
        missing = {k for k, v in zip(_COUNTERS, deltas, strict=True) if v is None}  # not on this server: no sample
        missing |= {f"d_{k}" for k in missing}
        return [Sample(ts, "pg", k, v) for k, v in values.items() if k not in missing]

    def close(self) -> None:
        self._db.close()

    def summarize(self, samples: Sequence[Sample], start: float, end: float) -> dict[str, float]:
        rs = rows_in_window(samples, start, end, rate=True)
        dt = sum(r.get("dt") for r in rs)
        if not rs or dt <= 0:
            return {}

        def total(metric: str) -> float:
            return sum(r.get(metric) for r in rs)

        out = {
            "commits_s": total("d_commits") / dt,
            "rollbacks_s": total("d_rollbacks") / dt,
            "blks_read_s": total("d_blks_read") / dt,
            "blks_hit_s": total("d_blks_hit") / dt,
            "wal_mb_s": total("d_wal_bytes") / MIB / dt,
            **why_figures(rs),
        }
        accesses = total("d_blks_hit") + total("d_blks_read")
        if accesses:
            out["cache_hit_pct"] = total("d_blks_hit") / accesses * 100
        return out


def why_figures(rows: Sequence[Row]) -> dict[str, float]:
    """The checkpoint and buffer counts and the WAL figures of a window's rows, one server's or several servers'
    together (a tenants host): sums, WAL and full-page images per commit as ratios of the sums."""

    def total(metric: str) -> float:
        return sum(r.get(metric) for r in rows)

    out = {k: total(k) for k in _COUNTS if any(k in r.values for r in rows)}
    if any("d_wal_records" in r.values for r in rows):
        out["wal_records"], out["wal_fpi"] = total("d_wal_records"), total("d_wal_fpi")
        if commits := total("d_commits"):
            out["wal_bytes_per_commit"] = total("d_wal_stat_bytes") / commits
            out["wal_fpi_per_commit"] = total("d_wal_fpi") / commits
    return out
