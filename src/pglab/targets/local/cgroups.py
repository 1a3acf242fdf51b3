"""CPU, memory and IO limits per instance, and the client's own budget, through Linux control groups.

The published procedures pin PostgreSQL to a CPU budget (1.5 vCPU, Guaranteed QoS) and keep the client apart;
on one host, cgroups reproduce both. Both hierarchies are supported, detected at run time:

- **v2** (unified): one directory per group with ``cpu.max``, ``memory.max``, ``io.max``, ``cpuset.cpus``;
  the controllers must be enabled in the parent's ``cgroup.subtree_control``.
- **v1**: one directory per controller: ``cpu.cfs_quota_us``/``cpu.cfs_period_us``, ``memory.limit_in_bytes``,
  ``blkio.throttle.{read,write}_{iops,bps}_device``, ``cpuset.cpus`` (and ``cpuset.mems``).

What v1 IO throttling does not cover (the flusher threads' writeback, most checkpoint and bgwriter writes, is
charged to the root group; v2 charges the group that dirtied the page): docs/methodology.md, "Each instance's I/O".

The same counters give each instance's own I/O over a run (``io_stat``), beside the device-wide figures of the
disk probe; a lab without limits still makes an accounting-only group per instance for them (``account_io``).

Groups live below the cgroup pglab itself runs in (``<ours>/pglab-<id>/<member>``), so any limit already
above pglab still applies, and are removed at teardown.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pglab.targets.local import procs

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
V1_CONTROLLERS = ("cpu", "cpuacct", "memory", "blkio", "cpuset")


class CgroupError(Exception):
    """Limits cannot be applied here (no cgroup controller, or not allowed to write it)."""


@dataclass(frozen=True)
class Limits:
    cpus: float | None = None
    memory_bytes: int | None = None
    read_iops: int | None = None
    write_iops: int | None = None
    read_bps: int | None = None
    write_bps: int | None = None
    cpuset: str | None = None

    @property
    def io(self) -> bool:
        return any(v is not None for v in (self.read_iops, self.write_iops, self.read_bps, self.write_bps))


def version() -> int | None:
    """2 for the unified hierarchy, 1 for the legacy one, None when neither can be used."""
    if (ROOT / "cgroup.controllers").is_file():
        return 2
    if (ROOT / "cpu").is_dir() or (ROOT / "cpu,cpuacct").is_dir():
        return 1
    return None


def _own_path(controller: str | None) -> str:
    """This process's cgroup path in a v1 controller's hierarchy (or the unified one when None)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if (controller is None and names == "") or (controller and controller in names.split(",")):
            return path
    return "/"


def _v1_mount(controller: str) -> Path:
    for name in (controller, "cpu,cpuacct" if controller in ("cpu", "cpuacct") else controller):
        if (ROOT / name).is_dir():
            return ROOT / name
    raise CgroupError(f"the cgroup v1 '{controller}' controller is not mounted under {ROOT}")


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupError(f"cannot write '{value.strip()}' to {path} ({exc.strerror})") from None


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class Group:
    """One cgroup (a directory per controller on v1), created on demand and removed by :meth:`remove`."""

    def __init__(self, name: str, limits: Limits, devices: list[str] | None = None):
        self.name = name
        self.limits = limits
        self.devices = devices or []  # "major:minor" of the block devices the IO limits apply to
        self.version = version()
        if self.version is None:
            raise CgroupError(f"no cgroup hierarchy is mounted under {ROOT}")
        self.dirs: list[Path] = []
        self._create()

    # ------------------------------------------------------------ creation
    def _needed_v1(self) -> list[str]:
        needed = ["cpu", "cpuacct"]
        if self.limits.memory_bytes is not None:
            needed.append("memory")
        if self.limits.io or self.devices:  # with devices: IO accounting (io_stat) even without a limit
            needed.append("blkio")
        if self.limits.cpuset:
            needed.append("cpuset")
        return needed

    def _create(self) -> None:
        if self.version == 2:
            base = ROOT / _own_path(None).lstrip("/")
            path = base / self.name
            self._enable_v2_controllers(path)
            self._mkdir(path)
            self.dirs = [path]
        else:
            for controller in self._needed_v1():
                path = _v1_mount(controller) / _own_path(controller).lstrip("/") / self.name
                if path in self.dirs:  # cpu and cpuacct mounted together
                    continue
                self._mkdir(path)
                if controller == "cpuset":
                    for f in ("cpuset.mems", "cpuset.cpus"):  # an empty cpuset group refuses tasks
                        parent = _read(path.parent / f)
                        _write(path / f, parent)
                self.dirs.append(path)

    def _mkdir(self, path: Path) -> None:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CgroupError(f"cannot create the cgroup {path} ({exc.strerror}); run pglab as root, or set "
                              "target.local.limits: best-effort") from None

    def _enable_v2_controllers(self, path: Path) -> None:
        wanted = ["cpu", "memory", "io", "cpuset"]
        chain = [p for p in [*reversed(path.parents)] if p.is_relative_to(ROOT) and p != path]
        for parent in chain:
            available = _read(parent / "cgroup.controllers").split()
            for c in wanted:
                if c in available and c not in _read(parent / "cgroup.subtree_control").split():
                    with contextlib.suppress(CgroupError):  # a parent with processes cannot delegate: read back
                        _write(parent / "cgroup.subtree_control", f"+{c}")

    def _file(self, name: str) -> Path:
        """The file ``name`` in whichever of the group's directories holds it."""
        for d in self.dirs:
            if (d / name).exists():
                return d / name
        raise CgroupError(f"the cgroup {self.dirs[0] if self.dirs else self.name} has no '{name}' "
                          "(its controller is not enabled here)")

    def account_io(self) -> None:
        """Make sure the group counts its I/O on its devices, without limiting it (an accounting-only group).

        On v1 a zero limit is written for each device: zero means "no limit", but the write makes sure the
        throttle layer, which keeps the ``blkio.throttle`` counters, is set up for the disk (some kernels set it
        up only once a first rule is written). Raises :class:`CgroupError` when the group has no I/O statistics
        here."""
        if self.version == 1:
            for dev in self.devices:
                _write(self._file("blkio.throttle.read_iops_device"), f"{dev} 0")
            self._file("blkio.throttle.io_serviced")
        else:
            self._file("io.stat")

    # ------------------------------------------------------------ limits
    def apply(self, limits: Limits | None = None) -> dict[str, Any]:
        """Write the limits, then read back and return what is in force (for the run's record)."""
        if limits is not None:
            self.limits = limits
        lim = self.limits
        if self.version == 2:
            quota = f"{round(lim.cpus * PERIOD_US)} {PERIOD_US}" if lim.cpus else f"max {PERIOD_US}"
            _write(self._file("cpu.max"), quota)
            if lim.memory_bytes is not None:
                _write(self._file("memory.max"), str(lim.memory_bytes))
            if lim.cpuset:
                _write(self._file("cpuset.cpus"), lim.cpuset)
            if lim.io:
                for dev in self.devices:
                    parts = [f"{k}={v}" for k, v in (("riops", lim.read_iops), ("wiops", lim.write_iops),
                                                      ("rbps", lim.read_bps), ("wbps", lim.write_bps)) if v]
                    _write(self._file("io.max"), f"{dev} {' '.join(parts)}")
        else:
            _write(self._file("cpu.cfs_period_us"), str(PERIOD_US))
            _write(self._file("cpu.cfs_quota_us"), str(round(lim.cpus * PERIOD_US)) if lim.cpus else "-1")
            if lim.memory_bytes is not None:
                _write(self._file("memory.limit_in_bytes"), str(lim.memory_bytes))
            if lim.cpuset:
                _write(self._file("cpuset.cpus"), lim.cpuset)
            if lim.io:
                for dev in self.devices:
                    for name, value in (("read_iops", lim.read_iops), ("write_iops", lim.write_iops),
                                        ("read_bps", lim.read_bps), ("write_bps", lim.write_bps)):
                        if value:
                            _write(self._file(f"blkio.throttle.{name}_device"), f"{dev} {value}")
        return self.in_force()

    def in_force(self) -> dict[str, Any]:
        """What the kernel reports for the group now, not what was asked."""
        out: dict[str, Any] = {"cgroup": f"v{self.version}", "path": str(self.dirs[0])}
        if self.version == 2:
            quota, period = ([*_read(self._file("cpu.max")).split(), "max", str(PERIOD_US)])[:2]
            out["cpus"] = None if quota == "max" else int(quota) / int(period)
            with contextlib.suppress(CgroupError):
                mem = _read(self._file("memory.max"))
                out["memory_bytes"] = None if mem in ("max", "") else int(mem)
            with contextlib.suppress(CgroupError):
                out["io_max"] = _read(self._file("io.max")) or None
            with contextlib.suppress(CgroupError):
                out["cpuset"] = _read(self._file("cpuset.cpus")) or None
        else:
            quota_us = int(_read(self._file("cpu.cfs_quota_us")) or -1)
            period_us = int(_read(self._file("cpu.cfs_period_us")) or PERIOD_US)
            out["cpus"] = None if quota_us < 0 else quota_us / period_us
            if self.limits.memory_bytes is not None:
                out["memory_bytes"] = int(_read(self._file("memory.limit_in_bytes")))
            if self.limits.io:
                out["io_max"] = {name: _read(self._file(f"blkio.throttle.{name}_device")) or None
                                 for name in ("read_iops", "write_iops", "read_bps", "write_bps")}
            if self.limits.cpuset:
                out["cpuset"] = _read(self._file("cpuset.cpus"))
        return out

    def cpu_stat(self) -> dict[str, float]:
        """CPU seconds used, CFS periods, throttled periods and throttled seconds since the group was created."""
        text = _read(self._file("cpu.stat"))
        values = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
        if self.version == 2:
            return {"usage_s": float(values.get("usage_usec", 0)) / 1e6,
                    "periods": float(values.get("nr_periods", 0)), "throttled": float(values.get("nr_throttled", 0)),
                    "throttled_s": float(values.get("throttled_usec", 0)) / 1e6}
        usage = _read(self._file("cpuacct.usage"))
        return {"usage_s": float(usage or 0) / 1e9,
                "periods": float(values.get("nr_periods", 0)), "throttled": float(values.get("nr_throttled", 0)),
                "throttled_s": float(values.get("throttled_time", 0)) / 1e9}

    def io_stat(self) -> dict[str, float]:
        """Read/write IOs and bytes the group submitted to its devices since it was created, and on v2 the
        seconds some of its tasks stalled on I/O (``io_stall_s``, from ``io.pressure``; v1 gives no time). What
        each version counts (v1: no flusher writeback; both: bios before merging): docs/methodology.md, "Each
        instance's I/O"."""
        out = {"read_ios": 0.0, "write_ios": 0.0, "read_bytes": 0.0, "write_bytes": 0.0}
        if self.version == 2:
            for line in _read(self._file("io.stat")).splitlines():
                dev, *fields = line.split()
                if dev not in self.devices:
                    continue
                kv = dict(f.split("=", 1) for f in fields if "=" in f)
                for key, name in (("rios", "read_ios"), ("wios", "write_ios"), ("rbytes", "read_bytes"),
                                  ("wbytes", "write_bytes")):
                    out[name] += float(kv.get(key, 0))
            with contextlib.suppress(CgroupError):  # PSI may be off (psi=0): then no time
                for line in _read(self._file("io.pressure")).splitlines():
                    kind, *fields = line.split()
                    kv = dict(f.split("=", 1) for f in fields if "=" in f)
                    if kind == "some" and "total" in kv:
                        out["io_stall_s"] = float(kv["total"]) / 1e6
            return out
        for file, unit in (("blkio.throttle.io_serviced", "ios"), ("blkio.throttle.io_service_bytes", "bytes")):
            for line in _read(self._file(file)).splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0] in self.devices and parts[1] in ("Read", "Write"):
                    out[f"{parts[1].lower()}_{unit}"] += float(parts[2])
        return out

    # ------------------------------------------------------------ members
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    def add(self, pid: int) -> None:
        """Move a process (all its threads) into the group; its future children are born there."""
        for f in self.procs_files():
            _write(f, str(pid))

    def add_tree(self, pid: int) -> None:
        """Move a process and its descendants: the parent first, so that nothing forked meanwhile escapes."""
        self.add(pid)
        for child in procs.descendants(pid):
            with contextlib.suppress(CgroupError):  # a child may have exited meanwhile
                self.add(child)

    def pids(self) -> list[int]:
        return [int(p) for p in _read(self.procs_files()[0]).split()]

    def remove(self) -> None:
        """Move what is left (a server's last processes still exiting) to the cgroup pglab runs in, above
        ``pglab-<id>`` so that this one can go too, and remove the group (one with processes cannot be removed)."""
        for d in self.dirs:
            for pid in _read(d / "cgroup.procs").split():
                with contextlib.suppress(OSError):
                    (d.parent.parent / "cgroup.procs").write_text(pid)
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
        parents = {d.parent for d in self.dirs}
        for p in parents:  # pglab-<id> holds only our groups
            with contextlib.suppress(OSError):
                p.rmdir()


def io_accounting_problem() -> str | None:
    """None when pglab can give each instance a group that counts its I/O; otherwise why the I/O figures can only
    be the devices' (all instances and anything else on the host together)."""
    if os.geteuid() != 0:
        return "pglab does not run as root, so it cannot create a cgroup per instance to count its I/O"
    v = version()
    if v == 2:
        if "io" not in _read(ROOT / "cgroup.controllers").split():
            return f"the cgroup v2 'io' controller is not available under {ROOT}"
        return None
    if v == 1:
        if not (ROOT / "blkio").is_dir():
            return f"the cgroup v1 'blkio' controller is not mounted under {ROOT}"
        return None
    return f"no cgroup hierarchy is mounted under {ROOT}"


def device_of(path: Path) -> str:
    """'major:minor' of the whole disk holding ``path`` (limits apply to disks, not partitions)."""
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    sys_dev = Path(f"/sys/dev/block/{major}:{minor}")
    if (sys_dev / "partition").is_file():
        parent = sys_dev.resolve().parent
        with contextlib.suppress(OSError):
            return (parent / "dev").read_text().strip()
    return f"{major}:{minor}"


def wrap(args: list[str], procs_files: list[Path]) -> list[str]:
    """A command that enters the group before it runs ``args`` (no window where it runs outside)."""
    if not procs_files:
        return args
    script = 'pid=$$; for f in $PGLAB_CGROUP_PROCS; do echo "$pid" > "$f" || exit 126; done; exec "$@"'
    return ["env", f"PGLAB_CGROUP_PROCS={' '.join(str(f) for f in procs_files)}", "sh", "-c", script, "sh", *args]


def remove_named(name: str) -> None:
    """Remove the groups ``name``/* left by a lab whose pglab died (their processes are gone by then)."""
    v = version()
    if v == 2:
        bases = [ROOT / _own_path(None).lstrip("/")]
    elif v == 1:
        bases = []
        for c in V1_CONTROLLERS:
            with contextlib.suppress(CgroupError):
                bases.append(_v1_mount(c) / _own_path(c).lstrip("/"))
    else:
        return
    for base in bases:
        top = base / name
        if not top.is_dir():
            continue
        for child in [p for p in top.iterdir() if p.is_dir()]:
            with contextlib.suppress(OSError):
                child.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def cgroup_name(lab_dir: Path) -> str:
    """The lab's cgroup: named after its directory, plus a digest of the full path, so that two labs in folders
    of the same name (tenants t01 of two sweeps) never share one."""
    digest = hashlib.sha1(str(lab_dir.resolve()).encode()).hexdigest()[:8]
    return f"pglab-{lab_dir.name}-{digest}"
