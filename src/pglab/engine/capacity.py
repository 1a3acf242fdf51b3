"""The capacity search (issue 29): for each point of the matrix, the highest rate (transactions/s) whose latency
percentile stays under the plan's target.

A closed-loop run first: its TPS is what the clients reach at their own pace, so no rate above it can be held. Then
open-loop runs (latency from each transaction's scheduled start): at that pace first (if it passes, the clients, not
the server, bound the capacity), then bisecting between the highest passing rate (0 at first) and the lowest
failing one, until the bracket is narrower than ``precision_pct`` of its top or ``max_probes`` runs were made.
Every probe is a run of its own point (the configuration with ``rate``), stored as any run: a resumed sweep replays
the decisions from the runs already stored and measures only what is missing."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pglab.engine.types import Event
from pglab.plan.expand import Point
from pglab.plan.schema import Capacity


@dataclass(frozen=True)
class Found:
    """One configuration's answer: ``capacity`` (tx/s) in [``capacity``, ``failing``) at the given precision."""

    point: Point
    capacity: float | None  # None: not even the lowest probe passed, or a probe failed
    failing: float | None  # the lowest rate that missed the target (None: the closed loop met it)
    probes: int
    why: str

    def event(self, spec: Capacity) -> Event:
        target = f"p{spec.percentile} ≤ {spec.target * 1000:g} ms"
        if self.capacity is None:
            detail = f"{self.point.label()}: {target}: no capacity found ({self.why}, {self.probes} runs)"
        else:
            upper = f" (below {self.failing:g})" if self.failing is not None else ""
            detail = f"{self.point.label()}: {target}: {self.capacity:g} tx/s{upper}, {self.why}, {self.probes} runs"
        return time.time(), "capacity", detail


def runs(points: list[Point], spec: Capacity, probe: Callable[[Point, float | None], Point],
         done: Callable[[Point], bool], figure: Callable[[Point, str], float | None],
         found: Callable[[Found], None]) -> Iterator[tuple[Point, int]]:
    """The probe runs, one at a time: each is yielded (unless ``done`` already) and its figures read back
    (``figure``) before the next rate is chosen; ``probe`` gives (and registers) a configuration's point at a rate."""
    for base in points:
        lo, hi, top, rate, n = 0.0, None, 0.0, None, 0
        while True:
            point = probe(base, rate)
            if not done(point):
                yield point, 1
            n += 1
            figures = {k: figure(point, k) for k in (f"latency_p{spec.percentile}_ms", "skipped_pct", "tps")}
            held, tps = spec.holds(figures), figures["tps"]
            if held is None or tps is None:  # the run failed: no figure to decide on
                found(Found(base, lo or None, hi, n, "a probe run failed"))
                break
            if rate is None:  # the closed loop: the clients' own pace, above which no rate can be held
                top = rate = float(max(1, round(tps)))
                continue
            if held:
                lo = rate
            else:
                hi = rate
            if lo == top:
                found(Found(base, lo, None, n, "held at the closed loop's pace: the clients bound it"))
                break
            assert hi is not None
            narrow = hi - lo <= hi * spec.precision_pct / 100
            if narrow or n >= spec.max_probes:
                found(Found(base, lo or None, hi, n, "bracket within precision" if narrow else "max_probes reached"))
                break
            rate = float(max(1, round((lo + hi) / 2)))
            if rate in (lo, hi):  # whole transactions/s: nothing left between them
                found(Found(base, lo or None, hi, n, "bracket within 1 tx/s"))
                break


def probe_point(base: Point, rate: float | None, index: int) -> Point:
    """``base`` at ``rate`` (None: the closed-loop run, the base point itself)."""
    return base if rate is None else dataclasses.replace(base, rate=rate, index=index)
