"""Steady state: dips in a run's per-second TPS inside its measured window.

A dip is a stretch of consecutive seconds whose TPS is more than ``DIP_DROP`` below the window's median —
the shape a checkpoint's flush storm, an autovacuum or a stalled standby leaves. Reported with its time and
depth, and with the checkpoints PostgreSQL counted during the window, so a reader can tell which it was.
The warm-up is never part of it: it ran before the window.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

DIP_DROP = 0.30
CHECKPOINT_LEAD_S = 5.0  # a checkpoint that began this long before a dip (or during it) is tied to it


@dataclass(frozen=True)
class Dip:
    start: float  # epoch s, start of the first low second
    end: float  # epoch s, end of the last low second
    min_tps: float
    median_tps: float
    checkpoint: float | None = None  # epoch s a checkpoint started that the dip is tied to

    def describe(self, t0: float) -> str:
        text = (f"{self.start - t0:.0f}-{self.end - t0:.0f} s: down to {self.min_tps:,.0f} TPS "
                f"({(self.min_tps / self.median_tps - 1) * 100:+.0f} % vs median {self.median_tps:,.0f})")
        if self.checkpoint is not None:
            text += f", checkpoint started at {self.checkpoint - t0:.0f} s"
        return text


def find_dips(series: Sequence[tuple[float, float]], start: float, end: float) -> list[Dip]:
    """``series``: (epoch ts at the end of each second, TPS). Only seconds wholly inside [start, end] count."""
    # pgbench's progress seconds count from its launch; the window from its first transaction, a few ms later.
    # Only whole seconds inside it count: the launch second is a ramp (connections opening), not a dip.
    inside = sorted((ts, v) for ts, v in series if ts - 1.0 >= start - 0.05 and ts <= end + 0.05)
    if len(inside) < 3:
        return []
    median = statistics.median(v for _, v in inside)
    if median <= 0:
        return []
    dips: list[Dip] = []
    run: list[tuple[float, float]] = []
    for ts, v in [*inside, (float("inf"), median)]:
        if v < (1 - DIP_DROP) * median:
            run.append((ts, v))
        elif run:
            dips.append(Dip(run[0][0] - 1.0, run[-1][0], min(x for _, x in run), median))
            run = []
    return dips


def tie_to_checkpoints(dips: Sequence[Dip], checkpoint_starts: Sequence[float],
                       lead_s: float = CHECKPOINT_LEAD_S) -> list[Dip]:
    """Mark each dip with the checkpoint that began shortly before or during it.

    Right after a checkpoint starts, the first change to every page writes a full-page image into the WAL, and
    the spread write-out competes with the backends for the device: the dip follows the start by seconds."""
    out = []
    for dip in dips:
        tied = [cp for cp in checkpoint_starts if dip.start - lead_s <= cp <= dip.end]
        out.append(replace(dip, checkpoint=max(tied)) if tied else dip)
    return out
