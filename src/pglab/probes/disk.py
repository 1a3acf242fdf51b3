"""Block-device figures of the paths PostgreSQL uses, computed exactly as ``iostat -dx`` computes them.

A path is resolved to the block device the kernel accounts its I/O to: ``st_dev`` → ``/sys/dev/block/M:m``.
That device is measured as is (a partition ``vda1``, a device-mapper ``dm-0``, a loop device ``loop0``, as
iostat names them); what lies below it (parent disk, dm slaves, loop backing file) is recorded as its
``chain``. A path on a filesystem without a block device (tmpfs, overlay, NFS …) is reported as such — a
row of zeros would claim the storage was idle.

Figures from two reads of ``/proc/diskstats`` with Δt between the times of the reads (each read is stamped
once, on the run's clock, and that stamp is its row's ``ts`` and the edge of its fine interval):
r/s = Δreads/Δt, rkB/s = Δsectors·512/1024/Δt, r_await = Δread_ms/Δreads (0 without I/O),
%util = Δio_ms/(Δt·1000)·100, aqu-sz = Δweighted_ms/(Δt·1000); w likewise. Raw deltas are emitted too so
window aggregates are exact ratios of sums, not means of per-second ratios.
MB in summaries are MiB (1 048 576 bytes), as ``iostat -m`` uses.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from pglab.probes._pg import ProbeOpenError
from pglab.probes._util import FineReads, Row, counter_delta, peak_rows, rows_prorated
from pglab.probes.base import ProbeContext, Sample, now

SYSFS = Path("/sys")
MOUNTINFO = Path("/proc/self/mountinfo")
DISKSTATS = Path("/proc/diskstats")
SECTOR = 512
FINE = 0.1  # seconds between the counter reads that place a window's edges
MIB = 1024 * 1024

# Kernel counter widths: the millisecond counters are printed as unsigned int, the counts as unsigned long.
_WIDE = 64
_NARROW = 32


@dataclass(frozen=True)
class DeviceInfo:
    """Where the I/O of one path is accounted: the measured device and what it sits on."""

    path: str
    device: str | None  # kernel name as in /proc/diskstats and iostat (vda1, dm-0, loop0); None: no device
    major_minor: str | None
    kind: str  # disk | partition | dm | loop | none
    chain: tuple[str, ...] = ()  # measured device first, then what it is built on ("file:…" for loop files)
    reason: str = ""  # how it was resolved, or why there is no device
    fstype: str | None = None
    mount_source: str | None = None
    dm_name: str | None = None
    backing_file: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "chain": list(self.chain)}


@dataclass(frozen=True)
class Mount:
    major_minor: str
    mount_point: str
    options: str
    fstype: str
    source: str
    super_options: str


def _unescape(field_: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return field_.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def read_mounts(mountinfo: Path = MOUNTINFO) -> list[Mount]:
    out = []
    for line in mountinfo.read_text().splitlines():
        left, _, right = line.partition(" - ")
        lf, rf = left.split(), right.split()
        if len(lf) < 6 or len(rf) < 2:
            continue
        out.append(Mount(lf[2], _unescape(lf[4]), lf[5], rf[0], _unescape(rf[1]), rf[2] if len(rf) > 2 else ""))
    return out


def mount_containing(real: str, dev: str, mounts: Sequence[Mount]) -> Mount | None:
    """The mount a path lives on: the longest mount point containing it, preferring the matching st_dev."""

    def contains(mp: str) -> bool:
        return mp == "/" or real == mp or real.startswith(mp.rstrip("/") + "/")

    for candidates in ([m for m in mounts if m.major_minor == dev], list(mounts)):
        inside = [m for m in candidates if contains(m.mount_point)]
        if inside:
            return max(inside, key=lambda m: len(m.mount_point))  # last one wins among equal (over-mounts)
    return None


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:
        return None


def describe_block(
    major: int, minor: int, *, sysfs: Path = SYSFS, mountinfo: Path = MOUNTINFO
) -> tuple[str, str, tuple[str, ...], dict[str, str | None]] | None:
    """(kernel name, kind, chain, extras) of block device major:minor, or None if it is not one."""
    link = sysfs / "dev" / "block" / f"{major}:{minor}"
    if not link.exists():
        return None
    sysdir = Path(os.path.realpath(link))
    return _describe_sysdir(sysdir, sysfs=sysfs, mountinfo=mountinfo, depth=0)


def _describe_sysdir(
    sysdir: Path, *, sysfs: Path, mountinfo: Path, depth: int
) -> tuple[str, str, tuple[str, ...], dict[str, str | None]]:
    name = sysdir.name
    extras: dict[str, str | None] = {}
    if depth > 8:  # a stack deeper than any real one: stop, the chain is already informative
        return name, "disk", (name,), extras
    if (sysdir / "partition").exists():
        parent = sysdir.parent
        _, _, below, _ = _describe_sysdir(parent, sysfs=sysfs, mountinfo=mountinfo, depth=depth + 1)
        return name, "partition", (name, *below), extras
    dm_name = _read(sysdir / "dm" / "name")
    if dm_name is not None:
        extras["dm_name"] = dm_name
        return name, "dm", (name, *_slaves_chain(sysdir, sysfs, mountinfo, depth)), extras
    backing = _read(sysdir / "loop" / "backing_file")
    if backing is not None:
        extras["backing_file"] = backing
        chain: tuple[str, ...] = (name, f"file:{backing}")
        file_path = backing.removesuffix(" (deleted)")
        if os.path.exists(file_path):  # the file's own device (resolved like any path: btrfs, dm …)
            chain = (*chain, *resolve_device(file_path, sysfs=sysfs, mountinfo=mountinfo).chain)
        return name, "loop", chain, extras
    # md RAID and other stacked devices list their members as slaves; a plain disk has none.
    return name, "disk", (name, *_slaves_chain(sysdir, sysfs, mountinfo, depth)), extras


def _slaves_chain(sysdir: Path, sysfs: Path, mountinfo: Path, depth: int) -> tuple[str, ...]:
    slaves_dir = sysdir / "slaves"
    try:
        slaves = sorted(os.listdir(slaves_dir))
    except OSError:
        return ()
    out: list[str] = []
    for s in slaves:
        real = Path(os.path.realpath(slaves_dir / s))
        out.extend(_describe_sysdir(real, sysfs=sysfs, mountinfo=mountinfo, depth=depth + 1)[2])
    return tuple(out)


def resolve_device(
    path: str | os.PathLike[str], *, sysfs: Path = SYSFS, mountinfo: Path = MOUNTINFO
) -> DeviceInfo:
    """The block device whose /proc/diskstats counters carry the I/O of files under ``path``."""
    p = str(path)
    try:
        st = os.stat(p)
    except OSError as exc:
        return DeviceInfo(p, None, None, "none", (), f"path cannot be read: {exc.strerror}")
    real = os.path.realpath(p)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    mm = f"{major}:{minor}"
    try:
        mount = mount_containing(real, mm, read_mounts(mountinfo))
    except OSError:
        mount = None
    fstype = mount.fstype if mount else None
    source = mount.source if mount else None

    found = describe_block(major, minor, sysfs=sysfs, mountinfo=mountinfo)
    how = f"{fstype or 'filesystem'} on {source}" if source else "st_dev of the path"
    if found is None and source and source.startswith("/dev/"):
        # btrfs (and a few others) give files an anonymous st_dev; the mount source names the device.
        try:
            sst = os.stat(source)
        except OSError:
            sst = None
        if sst is not None and stat.S_ISBLK(sst.st_mode):
            major, minor = os.major(sst.st_rdev), os.minor(sst.st_rdev)
            mm = f"{major}:{minor}"
            found = describe_block(major, minor, sysfs=sysfs, mountinfo=mountinfo)
            how = f"{fstype} has an anonymous st_dev; device taken from its mount source {source}"
    if found is None:
        reason = f"{fstype or 'this filesystem'} has no block device"
        if fstype == "overlay" and mount is not None:
            upper = next((o[9:] for o in mount.super_options.split(",") if o.startswith("upperdir=")), None)
            if upper:
                reason += f" (its writes go to the upper dir {upper} of the host)"
        return DeviceInfo(p, None, None, "none", (), reason, fstype, source)
    name, kind, chain, extras = found
    return DeviceInfo(
        p,
        name,
        mm,
        kind,
        chain,
        how,
        fstype,
        source,
        dm_name=extras.get("dm_name"),
        backing_file=extras.get("backing_file"),
    )


@dataclass(slots=True)
class _Counters:
    reads: int
    rsect: int
    rticks: int
    writes: int
    wsect: int
    wticks: int
    io_ticks: int
    weighted: int


def read_diskstats(names: Sequence[str] | None = None, path: Path = DISKSTATS) -> dict[str, _Counters]:
    """Counters of the named devices (all when ``names`` is None) from one read of /proc/diskstats."""
    with open(path, encoding="ascii") as f:
        text = f.read()
    return parse_diskstats(text, names)


def parse_diskstats(text: str, names: Sequence[str] | None = None) -> dict[str, _Counters]:
    """Counters of the named devices (all when ``names`` is None) from the text of /proc/diskstats, wherever it
    was read (a Kubernetes node's copy comes through a pod's log)."""
    wanted = None if names is None else set(names)
    out: dict[str, _Counters] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 14:
            continue
        name = parts[2]
        if wanted is not None and name not in wanted:
            continue
        v = [int(x) for x in parts[3:14]]
        # reads rmerged rsect rticks writes wmerged wsect wticks inflight io_ticks weighted
        out[name] = _Counters(v[0], v[2], v[3], v[4], v[6], v[7], v[9], v[10])
    return out


class DiskProbe(FineReads):
    """Samples the block device behind each of ``ctx.paths``: a row of figures per second, counters every 0.1 s.

    Why the finer reads: a window's edges fall inside a second, and I/O is not spread evenly within one (fsync
    bursts, journal commits), so even pro-rating a second's deltas was 2–4 % off over 5 s. The 0.1 s reads
    are kept in memory only (a few per second per device, not rows) and place a window's edges within 0.1 s.
    """

    name = "disk"

    def __init__(self, ctx: ProbeContext, interval: float = 1.0, fine: float = FINE):
        super().__init__(interval, fine)
        self.ctx = ctx
        self.infos: dict[str, DeviceInfo] = {}  # label -> resolved device
        self.devices: dict[str, list[str]] = {}  # device -> labels sharing it (sampled once)
        self._prev: dict[str, _Counters] = {}
        self._prev_t = 0.0
        self._reads: list[tuple[float, dict[str, _Counters]]] = []  # (epoch seconds, counters) of every read

    def resolve(self) -> None:
        self.infos = {label: resolve_device(path) for label, path in self.ctx.paths.items()}
        self.devices = {}
        for label, info in self.infos.items():
            if info.device is not None:
                self.devices.setdefault(info.device, []).append(label)

    def describe(self) -> dict[str, dict[str, object]]:
        """label -> {device, major_minor, kind, chain, reason, …}; ``labels`` lists who shares the device."""
        if not self.infos:
            self.resolve()
        out = {}
        for label, info in self.infos.items():
            d = info.as_dict()
            d["labels"] = list(self.devices.get(info.device, [label])) if info.device else [label]
            out[label] = d
        return out

    def open(self) -> None:
        missing = [f"{label} ({path})" for label, path in self.ctx.paths.items() if not os.path.exists(path)]
        if missing:
            raise ProbeOpenError(
                f"the disk probe cannot measure paths that do not exist: {', '.join(missing)}; "
                "create them first"
            )
        self.resolve()
        self._reads = []
        t, self._prev = self._read()
        self._prev_t = t
        self._grid_from(t)

    def _read(self) -> tuple[float, dict[str, _Counters]]:
        """The counters, stamped with the time they were read at: one stamp per read, the fine reads' and the
        rows' alike, so that a row's interval ``[ts - dt, ts]`` is exactly the span of the fine reads it adds up
        (a row stamped with the sampler's tick and timed by a clock read after the file was off by up to a few
        ms at each edge, and a summary over whole rows then counted a share of the writes at its edges)."""
        t = now()
        cur = read_diskstats(list(self.devices))
        self._reads.append((t, cur))
        return t, cur

    def _sample(self, ts: float, closing: bool) -> list[Sample]:
        if not self.devices:
            return []
        t, cur = self._read()
        if not self._row_due(ts, closing):
            return []  # a fine read only: kept for the window's edges
        dt = t - self._prev_t
        prev, self._prev, self._prev_t = self._prev, cur, t
        if dt <= 0:
            return []
        out: list[Sample] = []
        for dev, c in cur.items():
            p = prev.get(dev)
            if p is None:
                continue
            out.extend(_figures(t, f"disk:{dev}", p, c, dt))  # ends when it was read, a hair after the tick
        return out

    def close(self) -> None:
        self._prev = {}  # the fine reads stay: the window is summarised after the sampler stopped

    def _exact(self, start: float, end: float) -> dict[str, dict[str, float]]:
        """Raw deltas per device over [start, end] from the fine reads, when they cover the window (else {}).

        Consecutive reads' deltas count for the share of their interval inside the window: the counters are
        interpolated linearly at the edges, within 0.1 s.
        """
        reads = self._reads
        if len(reads) < 2 or reads[0][0] > start or reads[-1][0] < end:
            return {}
        out: dict[str, dict[str, float]] = {}
        for (ta, a), (tb, b) in itertools.pairwise(reads):
            if tb <= start or ta >= end or tb <= ta:
                continue
            share = (min(tb, end) - max(ta, start)) / (tb - ta)
            for dev, c in b.items():
                p = a.get(dev)
                if p is None:
                    continue
                acc = out.setdefault(dev, dict.fromkeys(_RAW, 0.0))
                for k, v in _raw(p, c).items():
                    acc[k] += v * share
                acc["dt"] += (tb - ta) * share
        return out

    def summarize(self, samples: Sequence[Sample], start: float, end: float) -> dict[str, float]:
        """Exact window figures: from this probe's fine reads when they cover the window; else (samples from
        elsewhere, e.g. a Kubernetes node's) rows at the edges add the share of their deltas and ``dt`` inside it.
        """
        per_dev: dict[str, list[tuple[Row, float]]] = {}
        for row, share in rows_prorated(samples, start, end):
            per_dev.setdefault(row.source.removeprefix("disk:"), []).append((row, share))
        exact = self._exact(start, end)
        out: dict[str, float] = {}
        if not per_dev and not exact:
            return out
        sums: dict[str, dict[str, float]] = {}
        for dev in sorted(per_dev.keys() | exact.keys()):
            rs = per_dev.get(dev, [])
            s = exact.get(dev) or {k: sum(r.get(k) * share for r, share in rs) for k in _RAW}
            # a peak is one row's: the rows mostly inside the window (all of them when none is)
            mostly = peak_rows(rs, self.row_interval)
            s["util_max"] = (max(r.get("util_pct") for r in mostly) if mostly
                             else s["d_io_ticks"] / (s["dt"] * 1000) * 100 if s["dt"] > 0 else 0.0)
            sums[dev] = s
            dt = s["dt"]
            if dt <= 0:
                continue
            fig = _window_figures(s)
            for k, v in fig.items():
                out[f"disk.{dev}.{k}"] = v
        # Totals over independent devices: a device stacked on another measured one (dm-0 on vda2) is
        # already counted in the lower one's counters, so it is left out of the sums.
        independent = [d for d in sums if sums[d]["dt"] > 0 and not self._stacked_on_measured(d, set(sums))]
        if not independent:
            return out
        reads = sum(sums[d]["d_reads"] for d in independent)
        writes = sum(sums[d]["d_writes"] for d in independent)
        out["read_iops"] = sum(sums[d]["d_reads"] / sums[d]["dt"] for d in independent)
        out["write_iops"] = sum(sums[d]["d_writes"] / sums[d]["dt"] for d in independent)
        out["total_iops"] = out["read_iops"] + out["write_iops"]
        out["read_mb_s"] = sum(sums[d]["d_rsect"] * SECTOR / MIB / sums[d]["dt"] for d in independent)
        out["write_mb_s"] = sum(sums[d]["d_wsect"] * SECTOR / MIB / sums[d]["dt"] for d in independent)
        out["read_latency_ms"] = sum(sums[d]["d_read_ticks"] for d in independent) / reads if reads else 0.0
        out["write_latency_ms"] = (
            sum(sums[d]["d_write_ticks"] for d in independent) / writes if writes else 0.0
        )
        out["util_pct_max"] = max(sums[d]["util_max"] for d in sums)
        return out

    def _stacked_on_measured(self, dev: str, measured: set[str]) -> bool:
        for info in self.infos.values():
            if info.device == dev:
                return any(below in measured for below in info.chain[1:])
        return False


_RAW = ("d_reads", "d_writes", "d_rsect", "d_wsect", "d_read_ticks", "d_write_ticks", "d_io_ticks", "dt")


def _raw(p: _Counters, c: _Counters) -> dict[str, float]:
    """Deltas of one device's counters between two reads (``dt`` is the caller's)."""
    return {
        "d_reads": counter_delta(c.reads, p.reads, _WIDE),
        "d_writes": counter_delta(c.writes, p.writes, _WIDE),
        "d_rsect": counter_delta(c.rsect, p.rsect, _WIDE),
        "d_wsect": counter_delta(c.wsect, p.wsect, _WIDE),
        "d_read_ticks": counter_delta(c.rticks, p.rticks, _NARROW),
        "d_write_ticks": counter_delta(c.wticks, p.wticks, _NARROW),
        "d_io_ticks": counter_delta(c.io_ticks, p.io_ticks, _NARROW),
    }


def _figures(ts: float, source: str, p: _Counters, c: _Counters, dt: float) -> list[Sample]:
    r = _raw(p, c)
    d_reads, d_writes, d_rticks, d_wticks = r["d_reads"], r["d_writes"], r["d_read_ticks"], r["d_write_ticks"]
    d_weighted = counter_delta(c.weighted, p.weighted, _NARROW)
    values = {
        "r_s": d_reads / dt,
        "w_s": d_writes / dt,
        "rkb_s": r["d_rsect"] * SECTOR / 1024 / dt,
        "wkb_s": r["d_wsect"] * SECTOR / 1024 / dt,
        "r_await_ms": d_rticks / d_reads if d_reads else 0.0,
        "w_await_ms": d_wticks / d_writes if d_writes else 0.0,
        "aqu_sz": d_weighted / (dt * 1000),
        "util_pct": r["d_io_ticks"] / (dt * 1000) * 100,
        "d_reads": d_reads,
        "d_writes": d_writes,
        "d_read_ticks": d_rticks,
        "d_write_ticks": d_wticks,
        "d_rsect": r["d_rsect"],
        "d_wsect": r["d_wsect"],
        "d_io_ticks": r["d_io_ticks"],
        "dt": dt,
    }
    return [Sample(ts, source, k, float(v)) for k, v in values.items()]


def _window_figures(s: dict[str, float]) -> dict[str, float]:
    dt = s["dt"]
    return {
        "read_iops": s["d_reads"] / dt,
        "write_iops": s["d_writes"] / dt,
        "read_mb_s": s["d_rsect"] * SECTOR / MIB / dt,
        "write_mb_s": s["d_wsect"] * SECTOR / MIB / dt,
        "read_latency_ms": s["d_read_ticks"] / s["d_reads"] if s["d_reads"] else 0.0,
        "write_latency_ms": s["d_write_ticks"] / s["d_writes"] if s["d_writes"] else 0.0,
        "util_pct": s["d_io_ticks"] / (dt * 1000) * 100,
        "util_pct_max": s["util_max"],
    }
