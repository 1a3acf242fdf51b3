"""Disk figures of a Kubernetes run from the database nodes' /proc/diskstats, as the local disk probe computes them.

The disk-sampler DaemonSet (``render.disk_sampler``) prints each node's /proc/diskstats, stamped with the node's
epoch; the volume probe (``render.volume_probe``) gives the device number of each instance's volume, as the local
probe resolves a path by its st_dev: docs/kubernetes.md, "Disk figures". Where no probe could run (a claim only one
pod may mount, say), the node's device with the most I/O time in the run's window is taken, and disk.json says it
was a guess. A volume on a filesystem without a block device (NFS, tmpfs) has no figures.

The figures are ``probes.disk``'s own: its per-interval ``_figures`` and its window ``summarize``, under its metric
names, summed over the instances' distinct (node, device) as the local probe sums the devices of the paths it
measures. Nodes that are containers on one kernel (kind, k3d: the same boot id, from the volume probe or the
sampler) see one host's devices: each device is counted once. Every device of a node is kept in disk.json.

Clocks: the samples carry the node's clock, the window the client node's (pgbench's log); on NTP-synchronised
machines the difference is far below the sampling interval (``scripts.DISK_SAMPLE_S``).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from pglab.probes.base import ProbeContext, Sample
from pglab.probes.disk import SECTOR, DiskProbe, _Counters, _figures, parse_diskstats
from pglab.targets.kubernetes.exporter import Key
from pglab.targets.kubernetes.render import DISKSTATS_MARK, VOLUME_MARK


@dataclass(frozen=True)
class Block:
    """One sample of one node: when (the node's epoch at the read), every device's counters, and their numbers."""

    ts: float
    node: str
    counters: dict[str, _Counters]
    numbers: dict[str, str] = field(default_factory=dict)  # "major:minor" → device name
    kernel: str | None = None  # the node's kernel (boot id): nodes that are containers of one host share it


def _numbers(text: str) -> dict[str, str]:
    return {f"{f[0]}:{f[1]}": f[2] for line in text.splitlines() if len(f := line.split()) >= 14}


@dataclass(frozen=True)
class Volume:
    """One claim of an instance pod, as the volume probe found its mount on the node."""

    claim: str
    number: str  # major:minor of the mount
    fstype: str
    source: str
    kernel: str | None = None  # the node's kernel boot id


def parse_probe_log(text: str) -> dict[str, Volume]:
    """The volume probe's log → claim → what its mount is on."""
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) in (5, 6) and f[0] == VOLUME_MARK and re.fullmatch(r"\d+:\d+", f[2]):
            out[f[1]] = Volume(f[1], f[2], f[3], f[4], f[5] if len(f) == 6 and f[5] != "-" else None)
    return out


def _read_at(before: float, after: list[str]) -> float:
    """When the block's file was read: the middle of the epochs before and after it (a log of an older sampler has
    no epoch after: its one epoch). An epoch after that is garbled or earlier than the first raises ValueError."""
    if not after:
        return before
    end = float(after[0])
    if not end >= before:
        raise ValueError(f"the end epoch {end} is before the block's {before}")
    return (before + end) / 2


def parse_log(text: str) -> list[Block]:
    """The sampler's log → its complete blocks in order, each stamped when its file was read; a block cut short
    (the log read while it printed) or garbled is left out, never half-read."""
    out: list[Block] = []
    head: tuple[float, str, str | None] | None = None
    body: list[str] = []
    for line in text.splitlines():
        if not line.startswith(DISKSTATS_MARK + " "):
            if head is not None:
                body.append(line)
            continue
        rest = line[len(DISKSTATS_MARK) + 1:].split()
        if rest[:1] == ["end"] and len(rest) <= 2:
            if head is not None:
                with contextlib.suppress(ValueError):  # a garbled line: the whole block is left out
                    text = "\n".join(body)
                    out.append(Block(_read_at(head[0], rest[1:]), head[1], parse_diskstats(text), _numbers(text),
                                     head[2]))
            head, body = None, []
            continue
        head, body = None, []
        if len(rest) in (2, 3):
            try:
                head = (float(rest[0]), rest[1], rest[2] if len(rest) == 3 and rest[2] != "-" else None)
            except ValueError:
                head = None
    return out


# node-exporter's diskstats collector: the kernel's counters, sectors as bytes and milliseconds as seconds
_NODE_DISK = {"reads": "node_disk_reads_completed_total", "rsect": "node_disk_read_bytes_total",
              "rticks": "node_disk_read_time_seconds_total", "writes": "node_disk_writes_completed_total",
              "wsect": "node_disk_written_bytes_total", "wticks": "node_disk_write_time_seconds_total",
              "io_ticks": "node_disk_io_time_seconds_total", "weighted": "node_disk_io_time_weighted_seconds_total"}
_SCALE = {"rsect": 1 / SECTOR, "wsect": 1 / SECTOR, "rticks": 1000.0, "wticks": 1000.0, "io_ticks": 1000.0,
          "weighted": 1000.0}


def node_exporter_block(values: dict[Key, float], ts: float, node: str) -> Block:
    """One node-exporter scrape as a block of /proc/diskstats counters (back to sectors and milliseconds, rounded:
    node-exporter multiplied integers), the devices' numbers from ``node_disk_info``. A device missing one of the
    counters is left out. node-exporter's default filter leaves partitions and loop devices out."""
    per: dict[str, dict[str, float]] = {}
    numbers: dict[str, str] = {}
    names = {v: k for k, v in _NODE_DISK.items()}
    for (metric, labels), value in values.items():
        lab = dict(labels)
        if metric in names and "device" in lab:
            per.setdefault(lab["device"], {})[names[metric]] = value
        elif metric == "node_disk_info" and {"device", "major", "minor"} <= lab.keys():
            numbers[f"{lab['major']}:{lab['minor']}"] = lab["device"]
    counters = {dev: _Counters(**{k: round(v[k] * _SCALE.get(k, 1.0)) for k in _NODE_DISK})
                for dev, v in per.items() if v.keys() >= _NODE_DISK.keys() and all(map(math.isfinite, v.values()))}
    return Block(ts, node, counters, numbers)  # the kernel: the volume probe's boot id (a boot time is not unique)


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


# an interval ending this long before the window or starting this long after it has no share of it (rounding
# moves an interval's ends by a few tenths of a microsecond)
_NO_SHARE_S = 1.0


def near_window(blocks: list[Block], window: tuple[float, float]) -> list[Block]:
    """The blocks bounding the intervals that reach into ``window``: the window figures of the rest are 0 shares
    (``rows_prorated`` drops them), and every device of a node over a whole log costs a tenth of a second a node."""
    start, end = window[0] - _NO_SHARE_S, window[1] + _NO_SHARE_S
    first = next((i for i in range(1, len(blocks)) if blocks[i].ts >= start), len(blocks)) - 1
    last = next((i for i in range(len(blocks) - 2, -1, -1) if blocks[i].ts <= end), -1) + 1
    return blocks[max(first, 0):last + 1]


def node_devices(blocks: list[Block], window: tuple[float, float]) -> dict[str, dict[str, float]]:
    """Every device of one node: its window figures (``disk.<dev>.*`` of the local probe, prefix removed)."""
    devices = sorted({d for b in blocks for d in b.counters})
    near = near_window(blocks, window)
    samples = [s for d in devices for s in device_samples(near, d, f"disk:{d}")]
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


def volume_device(volume: Volume, blocks: list[Block], filtered: str = "") -> tuple[str | None, str]:
    """The node's device carrying ``volume`` (by its number, else by its mount source as the local probe does for
    btrfs's anonymous numbers), and how it was found or why there is none (``filtered``: why a device of the
    node may be missing from the samples, such as node-exporter's device filter)."""
    numbers: dict[str, str] = {}
    for b in blocks:
        numbers.update(b.numbers)
    devices = {d for b in blocks for d in b.counters}
    if volume.number in numbers:
        return numbers[volume.number], f"{volume.fstype} on device {volume.number}"
    base = os.path.basename(volume.source)
    if volume.source.startswith("/dev/") and base in devices:
        return base, f"{volume.fstype} has device number {volume.number}; device taken from its source {volume.source}"
    if volume.source.startswith("/dev/"):
        return None, (f"{volume.fstype} on {volume.source} (device {volume.number}) is not among the node's sampled "
                      f"devices{filtered}")
    return None, f"{volume.fstype} ({volume.source}) has no block device on the node"


@dataclass
class RunDisks:
    """A run's disk figures, their series, and what they were computed from (disk.json)."""

    metrics: dict[str, float] = field(default_factory=dict)
    series: list[tuple[float, str, str, float | None]] = field(default_factory=list)
    info: dict[str, object] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)  # written into the run's folder, relative to it
    problems: list[str] = field(default_factory=list)  # why a total would be wrong: then none is stored
    guessed: list[str] = field(default_factory=list)  # instance pods whose device is the busiest, not probed


def summarize(blocks_of: dict[str, list[Block]], instances: dict[str, str], primary: str | None,
              window: tuple[float, float], volumes: dict[str, list[Volume] | str] | None = None,
              filtered: str = "") -> RunDisks:
    """``blocks_of``: node → its blocks (the sampler's log parsed, or node-exporter's scrapes); ``instances``:
    instance pod → its node; ``volumes``: instance pod → its
    claims as the volume probe found them, or why it could not (then the node's busiest device is taken). The
    figures of the instances' volume devices, summed over distinct (node, device) as the local probe does. An
    instance whose node has no sample in the window, or a volume without a block device, is named in
    ``problems``: a total without it would be a wrong total."""
    out = RunDisks()
    nodes: dict[str, object] = {}
    pods: dict[str, object] = {}
    sources: dict[str, list[Sample]] = {}
    counted: dict[tuple[str, str], str] = {}  # (kernel, device) → the source it is counted under
    for pod, node in sorted(instances.items()):
        blocks = sorted((b for b in blocks_of.get(node, []) if b.node == node), key=lambda b: b.ts)
        figures = node_devices(blocks, window)
        nodes[node] = {"samples": len(blocks), "devices": figures}
        found = (volumes or {}).get(pod, "no volume probe ran")
        chosen: list[dict[str, Any]] = []
        if not figures:
            out.problems.append(f"no sample of node {node} (pod/{pod}) in the window")
        elif isinstance(found, str):
            device = busiest(figures)
            chosen.append({"device": device, "how": f"busiest device of the node in the window ({found})"})
            if device is None:
                out.problems.append(f"pod/{pod}: no device of node {node} did any I/O")
            out.guessed.append(pod)
        else:
            for v in found:
                device, how = volume_device(v, blocks, filtered)
                chosen.append({"claim": v.claim, "device": device, "how": how})
                if device is None:
                    out.problems.append(f"pod/{pod} claim {v.claim}: {how}")
        pods[pod] = {"node": node, "primary": pod == primary, "volumes": chosen}
        kernel = (next((v.kernel for v in found if v.kernel), None) if not isinstance(found, str) else None) or \
            next((b.kernel for b in blocks if b.kernel), None) or node
        for c in chosen:
            if (device := c["device"]) is None:
                continue
            source = f"disk:{node}/{device}"
            first = counted.setdefault((kernel, str(device)), source)
            if first != source:  # the same kernel's device seen from another node: a container of the same host
                c["counted_as"] = first
                continue
            sources.setdefault(source, device_samples(blocks, str(device), source))
    samples = [s for ss in sources.values() for s in ss]
    out.metrics = _summarize(samples, window)
    out.series = [(s.ts, s.source, s.metric, s.value) for s in samples]  # all of them, as a local run keeps
    out.info = {"how": "per instance pod: the devices of its claims' mounts on its node (the volume probe), else "
                       "its node's device with the most I/O time in the window",
                "instances": pods, "nodes": nodes, "window": list(window)}
    if not out.metrics and not out.problems:
        out.problems.append("no sample of an instance's node inside the window")
    if out.problems:
        out.info["note"] = "; ".join(out.problems) + ": no disk figures"
    return out
