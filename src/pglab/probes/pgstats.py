"""PostgreSQL's own counters, every second: transactions, buffer reads/hits, WAL volume, checkpoints.

One autocommit connection, one query per tick (so the probe adds one read-only commit per second to
``xact_commit``, negligible against any benchmark). Counters are sampled as deltas with the monotonic Δt of
the reads; raw deltas are emitted too so window means are exact ratios of sums.

Note on timing: backends publish their transaction counts to shared statistics at most once per second
(PostgreSQL ≥ 15) and at disconnect, so per-second commit rates are lumpy by up to one second; means over a
window of several seconds are not. WAL position is read live. MB are MiB (1 048 576 bytes), as iostat's
MB/s, so wal_mb_s compares directly with the disk probe's write_mb_s.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pglab.probes._pg import PgConnection
from pglab.probes._util import rows_in_window
from pglab.probes.base import ProbeContext, Sample

MIB = 1024 * 1024

_DB_QUERY = """
SELECT d.xact_commit, d.xact_rollback, d.blks_read, d.blks_hit,
       pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                            ELSE pg_current_wal_lsn() END, '0/0')::float8,
       c.*
FROM pg_stat_database d, ({checkpoints}) c
WHERE d.datname = current_database()
"""
_CHECKPOINTS_BGWRITER = "SELECT checkpoints_timed, checkpoints_req, buffers_checkpoint FROM pg_stat_bgwriter"
_CHECKPOINTS_CHECKPOINTER = "SELECT num_timed, num_requested, buffers_written FROM pg_stat_checkpointer"

_COUNTERS = (
    "commits",
    "rollbacks",
    "blks_read",
    "blks_hit",
    "wal_bytes",
    "checkpoints_timed",
    "checkpoints_req",
    "buffers_checkpoint",
)


def _query_for(server_version_num: int) -> str:
    """PostgreSQL 17 moved the checkpoint counters from pg_stat_bgwriter to pg_stat_checkpointer."""
    checkpoints = _CHECKPOINTS_CHECKPOINTER if server_version_num >= 170000 else _CHECKPOINTS_BGWRITER
    return _DB_QUERY.format(checkpoints=checkpoints)


class PgStatsProbe:
    """Per-second rates of the primary's database statistics."""

    name = "pg"

    def __init__(self, ctx: ProbeContext, interval: float = 1.0):
        self.ctx = ctx
        self.interval = interval
        self._db = PgConnection(ctx.primary_conninfo, "pg")
        self._query = ""
        self._prev: tuple[float, tuple[float, ...]] | None = None
        self.server_version_num = 0

    def open(self) -> None:
        conn = self._db.open()
        self.server_version_num = conn.info.server_version
        self._query = _query_for(self.server_version_num)
        self._prev = self._read()

    def _read(self) -> tuple[float, tuple[float, ...]] | None:
        got = self._db.fetchall(self._query)
        t = time.monotonic()
        if self._db.reconnected:  # the server may have restarted (failover): counters restart
            self._prev = None
        if not got:
            return None
        return t, tuple(float(v) if v is not None else 0.0 for v in got[0])

    def sample(self, ts: float) -> list[Sample]:
        cur = self._read()
        prev, self._prev = self._prev, cur
        if cur is None or prev is None:
            return []
        dt = cur[0] - prev[0]
        deltas = [c - p for c, p in zip(cur[1], prev[1], strict=True)]
        if dt <= 0 or any(d < 0 for d in deltas):
            return []  # statistics were reset (or the server restarted): this read is the new baseline
        d = dict(zip(_COUNTERS, deltas, strict=True))
        values = {
            "commits_s": d["commits"] / dt,
            "rollbacks_s": d["rollbacks"] / dt,
            "blks_read_s": d["blks_read"] / dt,
            "blks_hit_s": d["blks_hit"] / dt,
            "wal_mb_s": d["wal_bytes"] / MIB / dt,
            "checkpoints_timed": d["checkpoints_timed"],
            "checkpoints_req": d["checkpoints_req"],
            "buffers_checkpoint": d["buffers_checkpoint"],
            "d_commits": d["commits"],
            "d_rollbacks": d["rollbacks"],
            "d_blks_read": d["blks_read"],
            "d_blks_hit": d["blks_hit"],
            "d_wal_bytes": d["wal_bytes"],
            "dt": dt,
        }
        return [Sample(ts, "pg", k, v) for k, v in values.items()]

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
            "checkpoints_timed": total("checkpoints_timed"),
            "checkpoints_req": total("checkpoints_req"),
            "buffers_checkpoint": total("buffers_checkpoint"),
        }
        accesses = total("d_blks_hit") + total("d_blks_read")
        if accesses:
            out["cache_hit_pct"] = total("d_blks_hit") / accesses * 100
        return out
