"""The environment a result was measured in, captured once per sweep and stored with it."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

from pglab import __version__
from pglab.probes.disk import mount_containing, read_mounts, resolve_device


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cpu_info() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                  if line.startswith("model name")), platform.processor() or None)
    return {"model": model, "count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0))}


def memory_info() -> dict[str, Any]:
    fields = {}
    for line in _read("/proc/meminfo").splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemTotal", "SwapTotal"):
            fields[name] = int(rest.split()[0]) * 1024
    return {"total_bytes": fields.get("MemTotal"), "swap_bytes": fields.get("SwapTotal")}


def mount_of(path: Path) -> dict[str, Any]:
    """Filesystem, mount options and source of the mount holding ``path`` (longest mount-point prefix)."""
    m = mount_containing(os.path.realpath(path), "", read_mounts())
    return {} if m is None else {"mount_point": m.mount_point, "mount_options": m.options, "fstype": m.fstype,
                                 "source": m.source, "super_options": m.super_options}


def tool_version(binary: Path | str) -> str | None:
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=10, check=False)
        return out.stdout.strip() or None
    except OSError:
        return None


def postgres_info(conninfo: str) -> dict[str, Any]:
    with psycopg.connect(conninfo, autocommit=True, application_name="pglab-env") as conn:
        version = conn.execute("SELECT version(), current_setting('server_version_num')").fetchone()
        settings = conn.execute(
            "SELECT name, setting, unit, source FROM pg_settings "
            "WHERE source NOT IN ('default', 'override') ORDER BY name").fetchall()
    assert version is not None
    return {
        "version": version[0],
        "version_num": int(version[1]),
        "non_default_settings": {n: {"setting": s, "unit": u, "source": src} for n, s, u, src in settings},
    }


def capture(primary_conninfo: str, paths: dict[str, Path], bindir: Path, plan_text: str) -> dict[str, Any]:
    uname = platform.uname()
    return {
        "pglab_version": __version__,
        "python": sys.version.split()[0],
        "kernel": {"system": uname.system, "release": uname.release, "version": uname.version,
                   "machine": uname.machine},
        "cpu": cpu_info(),
        "memory": memory_info(),
        "cgroup": {"self": _read("/proc/self/cgroup").strip().splitlines(),
                   "v2": Path("/sys/fs/cgroup/cgroup.controllers").exists()},
        "postgres": postgres_info(primary_conninfo),
        "pgbench": tool_version(bindir / "pgbench"),
        "paths": {label: {"path": str(p), **mount_of(p), "device": resolve_device(p).as_dict()}
                  for label, p in paths.items()},
        "plan": plan_text,
    }
