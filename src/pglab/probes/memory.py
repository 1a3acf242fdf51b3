"""Dirty and Writeback page cache (/proc/meminfo), every second.

Dirty data piling up and then being written back is what makes checkpoints and fsyncs stall; the two
figures explain write-latency spikes seen by the disk probe. MB here are MiB (1 048 576 bytes).
"""

from __future__ import annotations

from collections.abc import Sequence

from pglab.probes._util import rows_in_window
from pglab.probes.base import ProbeContext, Sample

_FIELDS = {"Dirty:": "dirty_mb", "Writeback:": "writeback_mb"}


def read_meminfo(path: str = "/proc/meminfo") -> dict[str, float]:
    """Dirty and Writeback in MiB."""
    out: dict[str, float] = {}
    with open(path, encoding="ascii") as f:
        for line in f:
            parts = line.split()
            key = _FIELDS.get(parts[0]) if parts else None
            if key is not None:
                out[key] = int(parts[1]) / 1024  # the file gives kB
                if len(out) == len(_FIELDS):
                    break
    return out


class MemoryProbe:
    """Snapshots of Dirty/Writeback; a gauge, so a sample belongs to the window of its own instant."""

    name = "mem"
    gauge = True  # a snapshot per tick: a window counts those taken by its end (Sampler.close waits for none)

    def __init__(self, ctx: ProbeContext | None = None, interval: float = 1.0):
        self.ctx = ctx
        self.interval = interval

    def open(self) -> None:
        read_meminfo()  # fail early if /proc/meminfo cannot be read

    def sample(self, ts: float) -> list[Sample]:
        return [Sample(ts, "mem", k, v) for k, v in read_meminfo().items()]

    def close(self) -> None:
        pass

    def summarize(self, samples: Sequence[Sample], start: float, end: float) -> dict[str, float]:
        rs = rows_in_window(samples, start, end, rate=False)
        if not rs:
            return {}
        dirty = [r.get("dirty_mb") for r in rs]
        return {
            "dirty_mb_max": max(dirty),
            "dirty_mb_mean": sum(dirty) / len(dirty),
            "writeback_mb_max": max(r.get("writeback_mb") for r in rs),
        }
