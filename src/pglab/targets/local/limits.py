"""What a lab with a cgroup per instance and one for pgbench reports: the embedded lab and the Patroni lab share it."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from pglab.plan.schema import LocalTarget
from pglab.targets.local import cgroups
from pglab.workloads.fio import parse_size

MIB = 1024 * 1024


class GroupedLimits:
    """Mixin: ``groups`` (instance name → cgroup), ``client_group`` (pgbench's) and ``limits_problem`` (why limits
    are not applied, with ``limits: best-effort``) are set by the lab; this turns them into the Target's figures."""

    spec: LocalTarget
    groups: dict[str, cgroups.Group]
    client_group: cgroups.Group | None
    limits_problem: str | None

    def _limits(self, cpus: float | None) -> cgroups.Limits:
        """An instance's limits: the plan's resources, with ``cpus`` (the CPU axis' current step) as the quota."""
        r = self.spec.resources
        return cgroups.Limits(
            cpus=cpus, memory_bytes=parse_size(r.memory) if r and r.memory else None,
            read_iops=r.read_iops if r else None, write_iops=r.write_iops if r else None,
            read_bps=round(r.read_mbps * MIB) if r and r.read_mbps else None,
            write_bps=round(r.write_mbps * MIB) if r and r.write_mbps else None)

    def limits_in_force(self) -> dict[str, Any]:
        """What the kernel reports for every group now (stored with each run)."""
        if self.limits_problem:
            return {"applied": False, "reason": self.limits_problem}
        if not self.groups and self.client_group is None:
            return {}  # the plan asks for no limits
        out: dict[str, Any] = {"applied": True}
        for name, g in self.groups.items():
            out[name] = g.in_force()
        if self.client_group is not None:
            out["client"] = self.client_group.in_force()
        return out

    def cpu_stats(self) -> dict[str, dict[str, float]]:
        """CPU used and CFS throttling per instance group (and pgbench's), for deltas over a measured window."""
        out = {}
        named = {**self.groups, **({"client": self.client_group} if self.client_group else {})}
        for name, g in named.items():
            with contextlib.suppress(cgroups.CgroupError, ValueError):
                out[name] = g.cpu_stat()
        return out

    def client_procs_files(self) -> list[Path]:
        return self.client_group.procs_files() if self.client_group else []
