"""A window's figures from per-tick rows: edge ticks count for the share of their interval inside the window."""

from __future__ import annotations

import pytest

from pglab.probes import CpuProbe, DiskProbe, ProbeContext, Sample


def _tick(ts: float, source: str, **values: float) -> list[Sample]:
    return [Sample(ts, source, k, v) for k, v in values.items()]


def _disk(ts: float, writes: float, wticks: float, wsect: float, util: float, dt: float = 1.0) -> list[Sample]:
    return _tick(ts, "disk:vda", d_reads=0, d_writes=writes, d_read_ticks=0, d_write_ticks=wticks, d_rsect=0,
                 d_wsect=wsect, d_io_ticks=util * 10 * dt, dt=dt, util_pct=util)


def test_disk_edges_count_for_the_share_of_their_tick_inside_the_window() -> None:
    """Window [10.25, 12.5] over ticks ending at 10, 11, 12, 13: ticks 11 and 13 count 3/4 and 1/2, 12 whole."""
    samples = [*_disk(10.0, 1000, 9000, 8000, 99.0),  # before the window: not a single write of it
               *_disk(11.0, 100, 100, 800, 10.0),
               *_disk(12.0, 200, 400, 1600, 20.0),
               *_disk(13.0, 400, 2000, 3200, 80.0)]
    s = DiskProbe(ProbeContext("")).summarize(samples, 10.25, 12.5)
    writes = 0.75 * 100 + 200 + 0.5 * 400
    assert s["write_iops"] == pytest.approx(writes / 2.25)
    assert s["write_mb_s"] == pytest.approx((0.75 * 800 + 1600 + 0.5 * 3200) * 512 / 2**20 / 2.25)
    assert s["write_latency_ms"] == pytest.approx((0.75 * 100 + 400 + 0.5 * 2000) / writes)  # Σticks / Σios
    assert s["disk.vda.util_pct"] == pytest.approx((0.75 * 10 + 20 + 0.5 * 80) / 2.25)
    assert s["util_pct_max"] == 80.0  # the peak of a tick at least half inside
    # a window exactly on tick edges is the plain sum of whole ticks
    whole = DiskProbe(ProbeContext("")).summarize(samples, 10.0, 12.0)
    assert whole["write_iops"] == pytest.approx(300 / 2)
    assert whole["write_latency_ms"] == pytest.approx(500 / 300)


def test_disk_ticks_of_unequal_length() -> None:
    """A late tick (dt 2.5 s) is pro-rated by its own measured length, not the nominal interval."""
    samples = [*_disk(10.0, 100, 100, 800, 10.0), *_disk(12.5, 500, 1000, 4000, 50.0, dt=2.5)]
    s = DiskProbe(ProbeContext("")).summarize(samples, 9.5, 11.0)
    assert s["write_iops"] == pytest.approx((50 + 0.4 * 500) / 1.5)
    assert s["write_latency_ms"] == pytest.approx((50 + 400) / (50 + 200))


def test_cpu_means_weigh_the_seconds_inside_the_window() -> None:
    """Host busy and cores are exact pro-rated means; a tick just touching the window barely counts."""

    def cpu(ts: float, busy: float, server: float, client: float, other: float) -> list[Sample]:
        return _tick(ts, "cpu", busy_pct=busy, user_pct=busy, system_pct=0, iowait_pct=0, steal_pct=0,
                     server_cores=server, client_cores=client, other_cores=other, dt=1.0)

    samples = [*cpu(1.0, 100, 2.0, 0.0, 0.0), *cpu(2.0, 50, 1.0, 0.0, 0.0), *cpu(3.0, 0, 0.0, 0.0, 0.0),
               *cpu(4.0, 100, 0.0, 0.5, 1.5)]
    s = CpuProbe(ProbeContext("")).summarize(samples, 0.9, 3.1)
    assert s["cpu_pct"] == pytest.approx((0.1 * 100 + 50 + 0 + 0.1 * 100) / 2.2)
    assert s["server_cpu_cores"] == pytest.approx((0.1 * 2.0 + 1.0) / 2.2)
    assert s["client_cpu_cores"] == pytest.approx(0.1 * 0.5 / 2.2)
    assert s["client_cpu_cores_max"] == 0.0  # the tick ending at 4 is 10 % inside: not its peak
    assert s["interference_cpu_cores"] == pytest.approx(0.1 * 1.5 / 2.2)
