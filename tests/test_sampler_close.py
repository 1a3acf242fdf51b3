"""Opening and closing a run's probes (issue 33). They open side by side, and a failure closes those that opened.
At the window's end each probe stops at once with the samples its window figures can use, instead of waiting for a
whole tick past the end: a rate probe takes one closing sample right away (a row from its last one to that read,
which holds the end) and nothing after it; a gauge nothing taken after the end. The real CPU and disk probes' closing
reads place the edge, and the disk probe's window figures then match the counters an independent reader of
/proc/diskstats took at the window's exact edges."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from helpers import own_diskstats, steady_writes
from pglab.probes import CpuProbe, DiskProbe, ProbeContext, Sample, Sampler, now, resolve_device
from pglab.probes._util import peak_rows, rows_prorated


class Rate:
    """A rate probe: a row every ``row`` seconds from reads every ``interval`` (as the CPU and disk probes, whose
    closing sample makes a row off that grid), or a row at every call (``row`` None, as the PostgreSQL probe, whose
    closing sample is a plain ``sample``); each row carries its interval ``dt``."""

    gauge = False

    def __init__(self, name: str, interval: float, row: float | None = None):
        self.name, self.interval = name, interval
        if row is not None:
            self.row_interval = row
            self.closing_sample = self._closing  # the CPU and disk probes' method
        self.calls: list[float] = []
        self.closing: list[float] = []  # the calls that closed a window
        self._prev: float | None = None

    def open(self) -> None:
        self._prev = now()

    def sample(self, ts: float) -> list[Sample]:
        self.calls.append(ts)
        row = getattr(self, "row_interval", None)
        if row is not None and abs(ts / row - round(ts / row)) > self.interval / 2 / row:
            return []  # a fine read only
        return self._row(ts)

    def _closing(self, ts: float) -> list[Sample]:
        self.calls.append(ts)
        self.closing.append(ts)
        return self._row(ts)

    def _row(self, ts: float) -> list[Sample]:
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


@pytest.mark.parametrize("fraction", [0.1, 0.45, 0.55, 0.85])
def test_each_probe_closes_the_window_at_once_with_one_sample(fraction: float) -> None:
    for _ in range(5):  # the close asked at the window's end: a sleep overrun into a probe's next tick is retried
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
        if asked - end < 0.04:  # a loaded machine's sleep can overrun by more: then ticks past the end came first
            break
    else:
        pytest.fail(f"five sleeps to the window's end overran it by 40 ms or more (the last by {asked - end:.3f} s)")
    assert sampler.errors == []
    for probe in (fine, pg):
        rows = sorted({s.ts for s in samples if s.source == probe.name})
        past = [ts for ts in rows if ts > end]
        assert len(past) == 1, (probe.name, rows, end)  # the row that holds the end, and none after it
        assert [ts for ts in probe.calls if ts > past[0]] == []  # not one read more
        # taken once the close was asked, not at the next whole tick: the only call after it
        assert [ts for ts in probe.calls if ts >= asked] == [past[0]], (probe.name, probe.calls, asked)
        assert any(ts <= end for ts in rows)
    assert fine.closing == [max(fine.calls)] and pg.closing == []  # the fine probe's closing row: off its grid
    # a gauge counts what it took by the end: it stops at once, every sample it began is in
    assert [ts for ts in gauge.calls if ts > asked] == []
    assert sorted(s.ts for s in samples if s.source == "gauge") == gauge.calls
    # a rate probe that gives no row is asked once more, at the close, and not waited for
    assert [ts for ts in silent.calls if ts >= asked] == [max(silent.calls)]


@pytest.mark.parametrize("fraction", [0.3, 0.6])
def test_the_cpu_and_disk_probes_closing_reads_place_the_windows_edge(fraction: float) -> None:
    """The real probes, a window ending ``fraction`` into a second: the closing read covers the window (its figures
    come from the fine reads, exact at the edge), and the closing row, from the last whole row to that read, is a
    peak row when the window holds half a row of it (as the whole row it replaces was), not otherwise."""
    ctx = ProbeContext("", paths={"tmp": Path(tempfile.gettempdir())})
    cpu, disk = CpuProbe(ctx), DiskProbe(ctx)
    sampler = Sampler([cpu, disk])
    sampler.start()
    try:
        t = now()
        start = float(int(t) + 1) + 0.3
        end = float(int(start) + 3) + fraction
        time.sleep(end - now())
        asked = now()
        samples = sampler.close(end)
    finally:
        sampler.stop()
    assert sampler.errors == []
    for name, probe in (("cpu", cpu), ("disk", disk)):
        mine = [s for s in samples if s.source == name or s.source.startswith(name + ":")]
        assert mine, name
        past = sorted({s.ts for s in mine if s.ts > end})
        assert len(past) == 1 and past[0] >= asked, name  # the closing row, no other
        prorated = rows_prorated(mine, start, end)
        held = [r for r, _share in prorated if r.ts == past[0]]
        assert held and held[0].get("dt") < 1.0  # from the last whole row, not a whole row
        assert (held[0] in peak_rows(prorated, probe.row_interval)) == (fraction >= 0.5), (name, held[0])
    exact_cpu = cpu._exact(start, end)
    assert exact_cpu is not None and exact_cpu[1] == pytest.approx(end - start)
    assert disk._exact(start, end)  # every device's deltas over exactly the window
    figures = sampler.summarize(start, end)
    total = sum(exact_cpu[0].host)
    assert figures["cpu_pct"] == pytest.approx(100.0 - (exact_cpu[0].host[3] + exact_cpu[0].host[4]) / total * 100)


def test_a_window_closed_at_its_end_matches_an_independent_read_of_diskstats() -> None:
    """fio writes at a steady 250 synced 8 KiB writes/s; a window of 3.5 s ends mid-second and the sampler is
    closed right there, as a run closes it: the disk probe's write IOPS over the window is within 2 % of the counters
    the test read itself at the window's two edges (its closing read is the edge's, not a whole tick's)."""
    target = Path(tempfile.mkdtemp(prefix="pglab-close-", dir="/var/tmp"))
    try:
        dev = resolve_device(target).device
        assert dev is not None
        probe = DiskProbe(ProbeContext("", paths={"data": target}))
        sampler = Sampler([probe])
        fio = steady_writes(target, 8)
        sampler.start()
        try:
            t = now()
            a = float(int(t) + 2) + 0.37  # fio writing steadily by then
            b = a + 3.5  # mid-second: .87
            time.sleep(a - now())
            first = own_diskstats(dev)
            time.sleep(max(0.0, b - now()))
            last = own_diskstats(dev)
            samples = sampler.close(last[0])
        finally:
            sampler.stop()
            fio.wait(timeout=60)
        assert not sampler.errors
        (ta, ca), (tb, cb) = first, last
        got = probe.summarize(samples, ta, tb)
        want = (cb["writes"] - ca["writes"]) / (tb - ta)
        assert want > 200
        assert got["write_iops"] == pytest.approx(want, rel=0.02), (got["write_iops"], want)
        assert len({s.ts for s in samples if s.ts > tb}) == 1  # the closing row, nothing after it
    finally:
        shutil.rmtree(target, ignore_errors=True)


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
