"""Replication lag of each standby, as the primary sees it in pg_stat_replication, every second.

Lags (write/flush/replay) are the primary's measured times for WAL to be written/flushed/applied on the
standby. PostgreSQL reports NULL when no WAL was sent recently: if the standby's corresponding LSN equals the
primary's current LSN it is caught up (lag 0), otherwise the lag is unknown (None, not 0). LSN distances are
bytes between the primary's current WAL position and what the standby has sent/written/flushed/replayed.
"""

from __future__ import annotations

from collections.abc import Sequence

from pglab.probes._pg import PgConnection
from pglab.probes._util import rows_in_window
from pglab.probes.base import ProbeContext, Sample

_QUERY = """
SELECT r.application_name, r.state, r.sync_state,
       c.cur IS NOT NULL AND r.write_lsn = c.cur,
       c.cur IS NOT NULL AND r.flush_lsn = c.cur,
       c.cur IS NOT NULL AND r.replay_lsn = c.cur,
       extract(epoch FROM r.write_lag)::float8 * 1000,
       extract(epoch FROM r.flush_lag)::float8 * 1000,
       extract(epoch FROM r.replay_lag)::float8 * 1000,
       pg_wal_lsn_diff(c.cur, r.sent_lsn)::float8,
       pg_wal_lsn_diff(c.cur, r.write_lsn)::float8,
       pg_wal_lsn_diff(c.cur, r.flush_lsn)::float8,
       pg_wal_lsn_diff(c.cur, r.replay_lsn)::float8
FROM pg_stat_replication r,
     (SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_wal_lsn() END AS cur) c
ORDER BY r.application_name, r.pid
"""


def _lag(ms: float | None, caught_up: bool) -> float | None:
    if ms is not None:
        return ms
    return 0.0 if caught_up else None


class ReplicationProbe:
    """One source ``repl:<application_name>`` per standby connected to the primary."""

    name = "repl"
    gauge = True  # a snapshot per tick: a window counts those taken by its end (Sampler.close waits for none)

    def __init__(self, ctx: ProbeContext, interval: float = 1.0):
        self.ctx = ctx
        self.interval = interval
        self._db = PgConnection(ctx.primary_conninfo, "repl")

    def open(self) -> None:
        self._db.open()

    def sample(self, ts: float) -> list[Sample]:
        out: list[Sample] = []
        seen: dict[str, int] = {}
        for row in self._db.fetchall(_QUERY):
            app, state, sync_state, w_up, f_up, r_up, w_ms, f_ms, r_ms, sent, wr, fl, rp = row
            app = app or "standby"
            n = seen[app] = seen.get(app, 0) + 1
            source = f"repl:{app}" if n == 1 else f"repl:{app}#{n}"  # same name twice: keep both
            values: dict[str, float | None] = {
                "write_lag_ms": _lag(w_ms, bool(w_up)),
                "flush_lag_ms": _lag(f_ms, bool(f_up)),
                "replay_lag_ms": _lag(r_ms, bool(r_up)),
                "sent_lsn_distance_bytes": sent,
                "write_lsn_distance_bytes": wr,
                "flush_lsn_distance_bytes": fl,
                "replay_lsn_distance_bytes": rp,
                "streaming": 1.0 if state == "streaming" else 0.0,
                "sync": 1.0 if sync_state in ("sync", "quorum") else 0.0,
            }
            out.extend(Sample(ts, source, k, v) for k, v in values.items())
        return out

    def close(self) -> None:
        self._db.close()

    def summarize(self, samples: Sequence[Sample], start: float, end: float) -> dict[str, float]:
        """Maxima over all standbys (and per standby); nothing at all when there was no standby."""
        rs = rows_in_window(samples, start, end, rate=False)
        out: dict[str, float] = {}
        keys = {
            "replay_lag_ms": "replay_lag_max_ms",
            "write_lag_ms": "write_lag_max_ms",
            "flush_lag_ms": "flush_lag_max_ms",
            "replay_lsn_distance_bytes": "replay_lsn_distance_max_bytes",
        }
        for metric, key in keys.items():
            vals = [v for r in rs if (v := r.values.get(metric)) is not None]
            if vals:
                out[key] = max(vals)
            for standby in sorted({r.source.removeprefix("repl:") for r in rs}):
                mine = [
                    v for r in rs if r.source == f"repl:{standby}" and (v := r.values.get(metric)) is not None
                ]
                if mine:
                    out[f"repl.{standby}.{key}"] = max(mine)
        return out
