"""Helpers shared by the probes: grouping samples back into rows and picking the rows of a window.

Probes emit one ``Sample`` per metric; summaries need all metrics of one tick of one source together
(a rate is only exact when recomputed from the raw deltas and the tick's own ``dt``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pglab.probes.base import Sample, in_window


@dataclass(slots=True)
class Row:
    """All metrics one source emitted at one tick."""

    source: str
    ts: float
    values: dict[str, float | None]

    def get(self, metric: str, default: float = 0.0) -> float:
        v = self.values.get(metric)
        return default if v is None else float(v)


class FineReads:
    """A probe that reads its counters every ``fine`` seconds (the sampler's pace) and emits a row every
    ``row_interval`` on that grid, plus the row closing a window off it: ``_sample`` reads, ``_row_due`` says
    whether the read ends a row."""

    _sample: Callable[[float, bool], list[Sample]]  # the probe's read at ``ts``, ``closing`` a window or not

    def __init__(self, interval: float, fine: float):
        self.row_interval, self.interval = interval, min(fine, interval)  # the sampler calls every ``interval``
        self._next_row = 0.0

    def sample(self, ts: float) -> list[Sample]:
        return self._sample(ts, False)

    def closing_sample(self, ts: float) -> list[Sample]:
        """A read now and the row since the last one, off the row grid: the sample that closes a window."""
        return self._sample(ts, True)

    def _grid_from(self, ts: float) -> None:
        """The next row: at the first boundary after the read at ``ts`` (reads land a hair off the multiples)."""
        self._next_row = (math.floor(ts / self.row_interval + 0.5) + 1) * self.row_interval

    def _row_due(self, ts: float, closing: bool) -> bool:
        """Whether the read at ``ts`` ends a row (it closes a window, or is at the next boundary within half a read)."""
        if not closing and self.interval < self.row_interval and ts < self._next_row - self.interval / 2:
            return False
        self._grid_from(ts)
        return True


def rows(samples: Iterable[Sample]) -> list[Row]:
    """Group samples by (source, ts), in time order."""
    by_key: dict[tuple[str, float], Row] = {}
    for s in samples:
        key = (s.source, s.ts)
        row = by_key.get(key)
        if row is None:
            row = by_key[key] = Row(s.source, s.ts, {})
        row.values[s.metric] = s.value
    return sorted(by_key.values(), key=lambda r: (r.ts, r.source))


def rows_in_window(samples: Iterable[Sample], start: float, end: float, *, rate: bool) -> list[Row]:
    """Rows whose interval middle lies in [start, end].

    A rate row carries its own measured ``dt`` metric; a gauge (a snapshot at ``ts``) is an instant (dt 0).
    """
    out = []
    for row in rows(samples):
        dt = row.get("dt") if rate else 0.0
        if in_window(Sample(row.ts, row.source, "", None), start, end, dt):
            out.append(row)
    return out


def overlap(row: Row, start: float, end: float) -> float:
    """Seconds of a rate row's interval ``[ts - dt, ts]`` that lie inside the window ``[start, end]``."""
    dt = row.get("dt")
    return max(0.0, min(row.ts, end) - max(row.ts - dt, start)) if dt > 0 else 0.0


def rows_prorated(samples: Iterable[Sample], start: float, end: float) -> list[tuple[Row, float]]:
    """Rate rows overlapping the window, each with the fraction of its interval inside it.

    Why: a tick keeps whole or drops whole when chosen by the middle of its interval, so a window's edges were up
    to half a tick off (a 14.8 s window's r_await came out 15 % low). Scaling an edge tick's raw deltas and ``dt``
    by the fraction inside interpolates the kernel counters linearly at the window's exact edges.
    """
    out = []
    for row in rows(samples):
        seconds = overlap(row, start, end)
        if seconds > 0:
            out.append((row, seconds / row.get("dt")))
    return out


def peak_rows(prorated: Iterable[tuple[Row, float]], row_interval: float) -> list[Row]:
    """The rows a window's peak (the highest row's rate) is taken from: those mostly inside it (half their interval
    or more), all of them when none is. A row shorter than half a row interval is no peak of its own: the closing
    row (from the last whole row to the read just past the window's end) is as long as the end's share of its row,
    so it counts where the whole row would have, and a fragment of a few reads never stands for a peak."""
    rows_ = list(prorated)
    mostly = [r for r, share in rows_ if share >= 0.5 and r.get("dt") >= row_interval / 2]
    return mostly or [r for r, _ in rows_]


def counter_delta(new: int, old: int, bits: int = 32) -> int:
    """Delta of a monotonically increasing kernel counter.

    A ``bits``-wide counter below 64 bits may wrap once between reads (as iostat assumes for 32-bit
    counters). A counter that went backwards otherwise was reset (device re-attached, statistics reset):
    the delta is 0 rather than a huge or negative spike.
    """
    if new >= old:
        return new - old
    limit = 1 << bits
    if bits < 64 and old < limit:
        return new + limit - old
    return 0
