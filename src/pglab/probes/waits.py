"""What active client backends are doing, sampled several times a second from pg_stat_activity.

Each tick counts active client backends per ``wait_event_type:wait_event``; a backend with no wait event is
running on CPU and counted as ``CPU``. Over a window, the share of each event among all active-backend
samples says where the database spends its time (WAL flush, locks, I/O, CPU …). pglab's own sessions
(application_name ``pglab-…``) and the probe itself are left out.
"""

from __future__ import annotations

from collections.abc import Sequence

from pglab.probes._pg import PgConnection
from pglab.probes._util import rows_in_window
from pglab.probes.base import ProbeContext, Sample

_QUERY = """
SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') AS event, count(*)
FROM pg_stat_activity
WHERE state = 'active' AND backend_type = 'client backend' AND pid <> pg_backend_pid()
  AND coalesce(application_name, '') NOT LIKE 'pglab-%'
GROUP BY 1
"""
ACTIVE = "_active"


class WaitEventsProbe:
    """Samples at ``ctx.wait_hz`` (5 Hz by default); one sample per event seen plus ``_active``."""

    name = "waits"
    gauge = True  # a snapshot per tick: a window counts those taken by its end (Sampler.close waits for none)

    def __init__(self, ctx: ProbeContext):
        self.ctx = ctx
        self.interval = 1.0 / ctx.wait_hz if ctx.wait_hz > 0 else 0.2
        self._db = PgConnection(ctx.primary_conninfo, "waits")

    def open(self) -> None:
        self._db.open()

    def sample(self, ts: float) -> list[Sample]:
        got = self._db.fetchall(_QUERY)
        out = [Sample(ts, "waits", str(event), float(n)) for event, n in got]
        out.append(Sample(ts, "waits", ACTIVE, float(sum(n for _, n in got))))
        return out

    def close(self) -> None:
        self._db.close()

    def summarize(self, samples: Sequence[Sample], start: float, end: float) -> dict[str, float]:
        rs = rows_in_window(samples, start, end, rate=False)
        if not rs:
            return {}
        active = sum(r.get(ACTIVE) for r in rs)
        out = {"active_backends_mean": active / len(rs)}
        if active:
            counts: dict[str, float] = {}
            for r in rs:
                for event, v in r.values.items():
                    if event != ACTIVE and v:
                        counts[event] = counts.get(event, 0.0) + v
            for event, n in sorted(counts.items(), key=lambda kv: -kv[1]):
                out[f"wait.{event}"] = n / active
        return out
