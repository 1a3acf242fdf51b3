"""Probes: what is measured during a run, every probe on the one shared clock of ``base.Sampler``."""

from __future__ import annotations

from pglab.probes._pg import ProbeOpenError
from pglab.probes.base import Probe, ProbeContext, Sample, Sampler, now
from pglab.probes.cpu import CpuProbe
from pglab.probes.disk import DiskProbe, resolve_device
from pglab.probes.memory import MemoryProbe
from pglab.probes.pgstats import PgStatsProbe
from pglab.probes.replication import ReplicationProbe
from pglab.probes.waits import WaitEventsProbe

__all__ = [
    "CpuProbe",
    "DiskProbe",
    "MemoryProbe",
    "PgStatsProbe",
    "Probe",
    "ProbeContext",
    "ProbeOpenError",
    "ReplicationProbe",
    "Sample",
    "Sampler",
    "WaitEventsProbe",
    "default_probes",
    "now",
    "resolve_device",
]


def default_probes(ctx: ProbeContext) -> list[Probe]:
    """Every probe of a run: host layers first, then the database's own view."""
    return [
        DiskProbe(ctx),
        CpuProbe(ctx),
        MemoryProbe(ctx),
        PgStatsProbe(ctx),
        ReplicationProbe(ctx),
        WaitEventsProbe(ctx),
    ]
