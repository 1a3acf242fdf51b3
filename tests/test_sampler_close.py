"""Opening and closing a run's probes (issue 33). They open side by side, and a failure closes those that opened.
At the window's end each probe stops once it has the samples its window figures can use, not at a whole tick and a
margin past the end: a rate probe keeps its first row past the end (the row that holds the end) and nothing after
it; a gauge nothing taken after the end; the real CPU and disk probes keep the reads that place the edge."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from pglab.probes import CpuProbe, DiskProbe, ProbeContext, Sample, Sampler, now
from pglab.probes._util import rows_prorated


class Rate:
    """A rate probe: a row every ``row`` seconds from reads every ``interval`` (as the CPU and disk probes), or a
    row at every tick (``row`` None, as the PostgreSQL probe); each row carries its interval ``dt``."""

    gauge = False

    def __init__(self, name: str, interval: float, row: float | None = None):
        self.name, self.interval = name, interval
        if row is not None:
            self.row_interval = row
        self.calls: list[float] = []
        self._prev: float | None = None

    def open(self) -> None:
        self._prev = now()

    def sample(self, ts: float) -> list[Sample]:
        self.calls.append(ts)
        row = getattr(self, "row_interval", None)
        if row is not None and abs(ts / row - round(ts / row)) > self.interval / 2 / row:
            return []  # a fine read only
        assert self._prev is not None
        dt, self._prev = ts - self._prev, ts
        return [Sample(ts, self.name, "n", 1.0), Sample(ts, self.name, "dt", dt)]

    def close(self) -> None:
        pass

    def summarize(self, samples: Sequence[Sample], start: float, end: float) -> dict[str, float]:
        return {}


class Gauge(Rate):
    gauge = True

    def sample(self, ts: float) -> list[Sample]:
        self.calls.append(ts)
        return [Sample(ts, self.name, "v", 1.0)]


class Silent(Rate):
    """A rate probe that never gives a row (a disk probe with no device to read)."""

    def sample(self, ts: float) -> list[Sample]:
        self.calls.append(ts)
        return []


@pytest.mark.parametrize("fraction", [0.1, 0.45, 0.55, 0.9])
def test_each_probe_stops_once_it_has_what_a_window_ending_there_uses(fraction: float) -> None:
    fine, pg, gauge, silent = Rate("fine", 0.1, row=1.0), Rate("pg", 1.0), Gauge("gauge", 0.2), Silent("none", 0.5)
    sampler = Sampler([fine, pg, gauge, silent])
    sampler.start()
    try:
        # the window ends at ``fraction`` of a second, after a few rows of every probe
        t = now()
        end = float(int(t) + 2) + fraction
        time.sleep(end - t)
        asked = now()
        samples = sampler.close(end)
    finally:
        sampler.stop()
    assert sampler.errors == []
    for probe in (fine, pg):
        rows = sorted({s.ts for s in samples if s.source == probe.name})
        past = [ts for ts in rows if ts > end]
        assert len(past) == 1, (probe.name, rows, end)  # the row that holds the end, and none after it
        assert [ts for ts in probe.calls if ts > past[0]] == []  # not one read more
        assert any(ts <= end for ts in rows)
    # a gauge counts what it took by the end: it stops at once, every sample it began is in
    assert [ts for ts in gauge.calls if ts > asked] == []
    assert sorted(s.ts for s in samples if s.source == "gauge") == gauge.calls
    # a rate probe that gives no row is not waited for past the second boundary after the end
    assert silent.calls and max(silent.calls) < int(end) + 2 + silent.interval * 1.5


def test_the_cpu_and_disk_probes_keep_the_reads_that_place_the_windows_edge_and_its_peak_row() -> None:
    """The real probes, a window ending 0.6 s into a second: the fine reads cover the window (its figures come from
    them, exact at the edge, not from whole rows) and the row that holds the end, mostly inside it, is kept for
    the peaks."""
    ctx = ProbeContext("", paths={"tmp": Path(tempfile.gettempdir())})
    cpu, disk = CpuProbe(ctx), DiskProbe(ctx)
    sampler = Sampler([cpu, disk])
    sampler.start()
    try:
        t = now()
        start = float(int(t) + 1) + 0.3
        end = start + 3.3
        time.sleep(end - now())
        samples = sampler.close(end)
    finally:
        sampler.stop()
    assert sampler.errors == []
    for name in ("cpu", "disk"):
        mine = [s for s in samples if s.source == name or s.source.startswith(name + ":")]
        assert mine, name
        past = sorted({s.ts for s in mine if s.ts > end})
        assert len(past) == 1, name  # the row that holds the end, no other
        held = [(r, share) for r, share in rows_prorated(mine, start, end) if r.ts == past[0]]
        assert held and held[0][1] >= 0.5  # a row a peak is taken from
    exact_cpu = cpu._exact(start, end)
    assert exact_cpu is not None and exact_cpu[1] == pytest.approx(end - start)
    assert disk._exact(start, end)  # every device's deltas over exactly the window
    figures = sampler.summarize(start, end)
    total = sum(exact_cpu[0].host)
    assert figures["cpu_pct"] == pytest.approx(100.0 - (exact_cpu[0].host[3] + exact_cpu[0].host[4]) / total * 100)


class Opening(Gauge):
    """A probe whose opening waits for every other probe's to have begun (a barrier): it opens only when they all
    open side by side."""

    def __init__(self, name: str, barrier: threading.Barrier, fails: bool = False):
        super().__init__(name, 1.0)
        self.barrier, self.fails, self.closed = barrier, fails, False

    def open(self) -> None:
        self.barrier.wait()
        if self.fails:
            raise RuntimeError(f"{self.name} cannot open")

    def close(self) -> None:
        self.closed = True


def test_the_probes_open_side_by_side_and_a_failure_closes_those_that_opened() -> None:
    barrier = threading.Barrier(3, timeout=20)
    probes = [Opening("a", barrier), Opening("b", barrier, fails=True), Opening("c", barrier)]
    with pytest.raises(RuntimeError, match="b cannot open"):
        Sampler(probes).start()
    assert [p.closed for p in probes] == [True, False, True]
    opened = [Opening(n, threading.Barrier(2, timeout=20)) for n in "xy"]
    opened[1].barrier = opened[0].barrier
    sampler = Sampler(opened)
    sampler.start()
    sampler.stop()
    assert sampler.errors == [] and all(p.closed for p in opened)
