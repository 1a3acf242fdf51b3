"""Disk figures of a Kubernetes run from the database nodes' /proc/diskstats, as the local disk probe computes them.

The disk-sampler DaemonSet (``render.disk_sampler``) prints each node's /proc/diskstats every second, stamped with
the node's epoch. After a run pglab reads those pods' logs, takes the node of every instance pod and, since the
device behind a PVC cannot be known from the API without exec, takes as the instance's volume the device of that
node with the most I/O time in the run's window (every device of the node is kept in disk.json). The figures are
``probes.disk``'s own: its per-interval ``_figures`` and its window ``summarize``, under its metric names, summed
over the instances' distinct devices as the local probe sums the devices of the paths it measures.

Clocks: the samples carry the node's clock, the window the client node's (pgbench's log); on NTP-synchronised
machines the difference is far below the 1 s sampling interval.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field

from pglab.probes.base import ProbeContext, Sample
from pglab.probes.disk import DiskProbe, _Counters, _figures, parse_diskstats
from pglab.targets.kubernetes.render import DISKSTATS_MARK


@dataclass(frozen=True)
class Block:
    """One sample of one node: when (the node's epoch) and every device's counters."""

    ts: float
    node: str
    counters: dict[str, _Counters]


def parse_log(text: str) -> list[Block]:
    """The sampler's log → its complete blocks in order; a block cut short (the log read while it printed) or
    garbled is left out, never half-read."""
    out: list[Block] = []
    head: tuple[float, str] | None = None
    body: list[str] = []
    for line in text.splitlines():
        if not line.startswith(DISKSTATS_MARK + " "):
            if head is not None:
                body.append(line)
            continue
        rest = line[len(DISKSTATS_MARK) + 1:].split()
        if rest == ["end"]:
            if head is not None:
                with contextlib.suppress(ValueError):  # a garbled line: the whole block is left out
                    out.append(Block(head[0], head[1], parse_diskstats("\n".join(body))))
            head, body = None, []
            continue
        head, body = None, []
        if len(rest) == 2:
            try:
                head = (float(rest[0]), rest[1])
            except ValueError:
                head = None
    return out


def device_samples(blocks: list[Block], device: str, source: str) -> list[Sample]:
    """The local disk probe's per-interval samples of ``device`` between consecutive blocks (Δt from their
    stamps), stamped at the later one as the probe stamps its reads."""
    out: list[Sample] = []
    for a, b in itertools.pairwise(blocks):
        dt = b.ts - a.ts
        p, c = a.counters.get(device), b.counters.get(device)
        if dt > 0 and p is not None and c is not None:
            out.extend(_figures(b.ts, source, p, c, dt))
    return out


def _summarize(samples: list[Sample], window: tuple[float, float]) -> dict[str, float]:
    return DiskProbe(ProbeContext("")).summarize(samples, *window)


def node_devices(blocks: list[Block], window: tuple[float, float]) -> dict[str, dict[str, float]]:
    """Every device of one node: its window figures (``disk.<dev>.*`` of the local probe, prefix removed)."""
    devices = sorted({d for b in blocks for d in b.counters})
    samples = [s for d in devices for s in device_samples(blocks, d, f"disk:{d}")]
    out: dict[str, dict[str, float]] = {}
    for key, value in _summarize(samples, window).items():
        if key.startswith("disk."):
            dev, _, name = key[5:].rpartition(".")
            out.setdefault(dev, {})[name] = value
    return out


def busiest(figures: dict[str, dict[str, float]]) -> str | None:
    """The device with the most I/O time in the window (then the most I/Os); None when no device did any I/O."""
    def load(f: dict[str, float]) -> tuple[float, float]:
        return f.get("util_pct", 0.0), f.get("read_iops", 0.0) + f.get("write_iops", 0.0)

    device = max(figures, key=lambda d: load(figures[d]), default=None)
    return device if device is not None and any(load(figures[device])) else None


@dataclass
class RunDisks:
    """A run's disk figures, their series, and what they were computed from (disk.json)."""

    metrics: dict[str, float] = field(default_factory=dict)
    series: list[tuple[float, str, str, float | None]] = field(default_factory=list)
    info: dict[str, object] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)  # written into the run's folder, relative to it


def summarize(logs: dict[str, str], instances: dict[str, str], primary: str | None,
              window: tuple[float, float]) -> RunDisks:
    """``logs``: node → its sampler's log; ``instances``: instance pod → its node. The figures of each instance's
    volume device (the busiest of its node), summed over distinct (node, device) as the local probe does; nothing
    for an instance whose node has no log or no sample in the window."""
    out = RunDisks()
    nodes: dict[str, object] = {}
    pods: dict[str, object] = {}
    sources: dict[str, list[Sample]] = {}
    for pod, node in sorted(instances.items()):
        blocks = sorted((b for b in parse_log(logs.get(node, "")) if b.node == node), key=lambda b: b.ts)
        figures = node_devices(blocks, window)
        device = busiest(figures)
        nodes[node] = {"samples": len(blocks), "devices": figures, "volume_device": device}
        pods[pod] = {"node": node, "device": device, "primary": pod == primary,
                     "chosen": "busiest device of the node in the window" if device else
                     "no sample of the node in the window" if not figures else "no device did any I/O"}
        if device is not None:
            source = f"disk:{node}/{device}"
            sources.setdefault(source, device_samples(blocks, device, source))
    samples = [s for ss in sources.values() for s in ss]
    out.metrics = _summarize(samples, window)
    out.series = [(s.ts, s.source, s.metric, s.value) for s in samples]  # all of them, as a local run keeps
    out.info = {"how": "per instance pod: its node's device with the most I/O time in the window",
                "instances": pods, "nodes": nodes, "window": list(window)}
    if not out.metrics:
        out.info["note"] = "no sample of an instance's node inside the window: no disk figures"
    return out
