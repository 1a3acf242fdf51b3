"""What the embedded lab and the Patroni lab share about limits and shaping: a cgroup per instance and one for
pgbench (GroupedLimits), and Toxiproxy proxies on the replication links (ShapedLinks)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pglab.plan.schema import LocalTarget
from pglab.targets.local import cgroups
from pglab.targets.local.toxiproxy import ToxiproxyServer

MIB = 1024 * 1024


class GroupedLimits:
    """Mixin: ``groups`` (instance name → cgroup), ``client_group`` (pgbench's) and ``limits_problem`` (why limits
    are not applied, with ``limits: best-effort``) are set by the lab; this turns them into the Target's figures."""

    spec: LocalTarget
    groups: dict[str, cgroups.Group]
    client_group: cgroups.Group | None
    limits_problem: str | None
    member_limits: bool = False  # the members' groups carry the plan's limits (else they only account)
    io_problem: str | None = None  # why no member has a group to count its I/O

    def _limits(self, cpus: float | None) -> cgroups.Limits:
        """An instance's limits: the plan's resources, with ``cpus`` (the CPU axis' current step) as the quota."""
        r = self.spec.resources
        return cgroups.Limits(
            cpus=cpus, memory_bytes=r.memory.bytes if r and r.memory else None,
            read_iops=r.read_iops if r else None, write_iops=r.write_iops if r else None,
            read_bps=round(r.read_mbps * MIB) if r and r.read_mbps else None,
            write_bps=round(r.write_mbps * MIB) if r and r.write_mbps else None)

    def limits_in_force(self) -> dict[str, Any]:
        """What the kernel reports for every group now (stored with each run)."""
        if self.limits_problem:
            return {"applied": False, "reason": self.limits_problem}
        limited = self.groups if self.member_limits else {}
        if not limited and self.client_group is None:
            return {}  # the plan asks for no limits (accounting-only groups limit nothing)
        out: dict[str, Any] = {"applied": True}
        for name, g in limited.items():
            out[name] = g.in_force()
        if self.client_group is not None:
            out["client"] = self.client_group.in_force()
        return out

    def cpu_stats(self) -> dict[str, dict[str, float]]:
        """CPU used and CFS throttling per instance group (and pgbench's), for deltas over a measured window."""
        out = {}
        limited = self.groups if self.member_limits else {}
        named = {**limited, **({"client": self.client_group} if self.client_group else {})}
        for name, g in named.items():
            with contextlib.suppress(cgroups.CgroupError, ValueError):
                out[name] = g.cpu_stat()
        return out

    def io_stats(self) -> dict[str, dict[str, float]]:
        """I/Os and bytes each instance's group has submitted so far (limited or accounting only), for deltas
        over a measured window; {} when the instances have no groups (:meth:`io_accounting` says why)."""
        out = {}
        for name, g in self.groups.items():
            with contextlib.suppress(cgroups.CgroupError, ValueError):
                out[name] = g.io_stat()
        return out

    def io_accounting(self) -> str | None:
        """None when every instance's I/O is counted in its own group; otherwise why the run's I/O figures are
        device-wide only."""
        if self.io_problem:
            return self.io_problem
        if not self.groups:  # a lab another pglab process built: its groups are that process's
            return "the instances have no cgroups in this pglab process"
        return None

    def client_procs_files(self) -> list[Path]:
        return self.client_group.procs_files() if self.client_group else []


class ShapedLinks:
    """Mixin: ``toxiproxy`` (the lab's server, or None) and ``proxy_ports`` (link name → proxy port) are set by the
    lab; this shapes them as the plan's ``network`` says and reports them as Toxiproxy does."""

    spec: LocalTarget
    toxiproxy: ToxiproxyServer | None
    proxy_ports: dict[str, int]
    log: Callable[[str], None]

    def _shape_links(self, names: list[str] | None = None) -> None:
        """Every link (or only ``names``: a proxy made again for a node started anew)."""
        net = self.spec.network
        if self.toxiproxy is None or net is None:
            return
        for name in names if names is not None else list(self.proxy_ports):
            self.toxiproxy.set_link(name, net.latency_ms, net.jitter_ms, net.bandwidth_kbps)
        if names is None:
            self.log(f"replication links shaped: +{net.latency_ms} ms round trip ± {net.jitter_ms} ms"
                     + (f", {net.bandwidth_kbps} kbit/s" if net.bandwidth_kbps else ""))

    def links_in_force(self) -> dict[str, Any]:
        """Each link as Toxiproxy reports it (stored with every run); on the Patroni lab, the proxy in front of
        each node (the leader's carries every replica's link)."""
        if self.toxiproxy is None:
            return {}
        return {name: {**self.toxiproxy.link(name).__dict__, "proxy_port": port}
                for name, port in self.proxy_ports.items()}
