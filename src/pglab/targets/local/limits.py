"""Two parts both labs hold alike, through which the Target reports: the lab's cgroups, one per member and one for
pgbench (``Groups``), and the Toxiproxy proxies on its replication links (``Links``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pglab.errors import UserError
from pglab.plan.schema import LocalTarget
from pglab.targets.local import cgroups
from pglab.targets.local.cgroups import cgroup_name
from pglab.targets.local.toxiproxy import ToxiproxyServer

MIB = 1024 * 1024


class Member(Protocol):
    """A member of a lab, as its group sees it."""

    @property
    def name(self) -> str: ...
    @property
    def data(self) -> Path: ...
    @property
    def wal(self) -> Path: ...


class Groups:
    """The lab's cgroups: ``groups`` (member name → its group: the plan's limits, or accounting only) and ``client``
    (pgbench's), named ``pglab-<lab>-<digest>/n0`` …, ``…/client``; and what the kernel says of them."""

    def __init__(self, spec: LocalTarget, log: Callable[[str], None], member: str):
        self.spec, self.log, self.member = spec, log, member
        self.groups: dict[str, cgroups.Group] = {}
        self.client: cgroups.Group | None = None
        self.problem: str | None = None  # why limits are not applied (limits: best-effort)
        self.member_limits = False  # the members' groups carry the plan's limits (else they only account)
        self.io_problem: str | None = None  # why no member has a group to count its I/O
        self._top = ""  # pglab-<lab>-<digest>

    def limits(self, cpus: float | None) -> cgroups.Limits:
        """A member's limits: the plan's resources, with ``cpus`` (the CPU axis' current step) as the quota."""
        r = self.spec.resources
        return cgroups.Limits(
            cpus=cpus, memory_bytes=r.memory.bytes if r and r.memory else None,
            read_iops=r.read_iops if r else None, write_iops=r.write_iops if r else None,
            read_bps=round(r.read_mbps * MIB) if r and r.read_mbps else None,
            write_bps=round(r.write_mbps * MIB) if r and r.write_mbps else None)

    def make(self, lab_dir: Path, members: list[Member], cpus: float | None, wants_members: bool) -> None:
        """One group per member (limited when the plan gives resources or a CPU axis) and one for pgbench. With
        ``limits: best-effort`` a failure is recorded, not raised. Members without limits still get a group,
        accounting only, to count each one's I/O."""
        self._top = cgroup_name(lab_dir)
        if wants_members or self.spec.client is not None:
            self._make_limited(members, cpus, wants_members)
        if not self.groups:
            self._make_accounting(members)

    def _make_limited(self, members: list[Member], cpus: float | None, wants_members: bool) -> None:
        client = self.spec.client
        field = "target.local.resources"
        try:
            if wants_members:
                self.member_limits = True
                for m in members:
                    self.add(m, cpus)
            if client is not None:
                field = "target.local.client"
                self.client = cgroups.Group(f"{self._top}/client", cgroups.Limits(cpus=client.cpus,
                                                                                  cpuset=client.cpuset))
                self.client.apply()
        except cgroups.CgroupError as exc:
            self.remove()
            self.member_limits = False
            if self.spec.limits == "strict":
                raise UserError(f"{field}: the limits cannot be applied here ({exc}); run pglab as root on a host "
                                "with cgroups, or set target.local.limits: best-effort.") from None
            self.problem = str(exc)
            self.log(f"limits NOT applied (limits: best-effort): {exc}")

    def _make_accounting(self, members: list[Member]) -> None:
        """A group per member that limits nothing and counts its I/O (and CPU), whenever cgroups allow it;
        otherwise the reason is kept (:meth:`io_accounting`) and the runs' I/O figures are the devices' only."""
        problem = cgroups.io_accounting_problem()
        if problem is None:
            try:
                for m in members:
                    self.add(m, None)
            except cgroups.CgroupError as exc:
                for g in self.groups.values():
                    g.remove()
                self.groups, problem = {}, str(exc)
        self.io_problem = problem
        if problem:
            self.log(f"I/O figures are device-wide only (no cgroup per {self.member}): {problem}")

    def add(self, m: Member, cpus: float | None) -> None:
        """The member's group: the plan's limits written, or (accounting only) none and its I/O counted."""
        devices = sorted({cgroups.device_of(d) for d in (m.data.parent, m.wal.parent)})
        limits = self.limits(cpus) if self.member_limits else cgroups.Limits()
        group = cgroups.Group(f"{self._top}/{m.name}", limits, devices)
        self.groups[m.name] = group
        if not self.member_limits:
            group.account_io()
            return
        group.apply()
        if not limits.io:  # no I/O rule of the plan's sets the disk's throttle up: count anyway, never fail on it
            with contextlib.suppress(cgroups.CgroupError):
                group.account_io()

    def drop(self, name: str) -> None:
        if (group := self.groups.pop(name, None)) is not None:
            group.remove()

    def remove(self) -> None:
        for g in [*self.groups.values(), *([self.client] if self.client else [])]:
            g.remove()
        self.groups, self.client = {}, None

    def in_force(self) -> dict[str, Any]:
        """What the kernel reports for every group now (stored with each run)."""
        if self.problem:
            return {"applied": False, "reason": self.problem}
        limited = self.groups if self.member_limits else {}
        if not limited and self.client is None:
            return {}  # the plan asks for no limits (accounting-only groups limit nothing)
        return {"applied": True, **{name: g.in_force() for name, g in limited.items()},
                **({"client": self.client.in_force()} if self.client is not None else {})}

    def cpu_stats(self) -> dict[str, dict[str, float]]:
        """CPU used and CFS throttling per member group (and pgbench's), for deltas over a measured window."""
        out = {}
        limited = self.groups if self.member_limits else {}
        named = {**limited, **({"client": self.client} if self.client else {})}
        for name, g in named.items():
            with contextlib.suppress(cgroups.CgroupError, ValueError):
                out[name] = g.cpu_stat()
        return out

    def io_stats(self) -> dict[str, dict[str, float]]:
        """I/Os and bytes each member's group has submitted so far (limited or accounting only), for deltas over a
        measured window; {} when the members have no groups (:meth:`io_accounting` says why)."""
        out = {}
        for name, g in self.groups.items():
            with contextlib.suppress(cgroups.CgroupError, ValueError):
                out[name] = g.io_stat()
        return out

    def io_accounting(self) -> str | None:
        """None when every member's I/O is counted in its own group; otherwise why the run's I/O figures are
        device-wide only."""
        if self.io_problem:
            return self.io_problem
        if not self.groups:  # a lab another pglab process built: its groups are that process's
            return "the instances have no cgroups in this pglab process"
        return None

    def client_procs_files(self) -> list[Path]:
        return self.client.procs_files() if self.client else []


class Links:
    """The lab's replication links: a Toxiproxy proxy per link (``ports``: link name → proxy port), shaped as the
    plan's ``network`` says and reported as Toxiproxy does."""

    def __init__(self, spec: LocalTarget, log: Callable[[str], None]):
        self.spec, self.log = spec, log
        self.toxiproxy: ToxiproxyServer | None = None
        self.ports: dict[str, int] = {}

    def start(self, lab_dir: Path, upstreams: dict[str, int], binary: Path | None = None) -> None:
        """Toxiproxy in ``<lab>/toxiproxy`` (its log beside the servers'), a proxy per link to its upstream port: on
        the port it had when Toxiproxy is started again (the standbys' primary_conninfo names it)."""
        self.toxiproxy = ToxiproxyServer(lab_dir / "toxiproxy", lab_dir / "logs" / "toxiproxy.log", binary=binary)
        for name, port in upstreams.items():
            self.ports[name] = self.toxiproxy.create_proxy(name, port, listen_port=self.ports.get(name, 0))

    def shape(self, names: list[str] | None = None) -> None:
        """Every link (or only ``names``: a proxy made again for a node started anew)."""
        net = self.spec.network
        if self.toxiproxy is None or net is None:
            return
        for name in names if names is not None else list(self.ports):
            self.toxiproxy.set_link(name, net.latency_ms, net.jitter_ms, net.bandwidth_kbps)
        if names is None:
            self.log(f"replication links shaped: +{net.latency_ms} ms round trip ± {net.jitter_ms} ms"
                     + (f", {net.bandwidth_kbps} kbit/s" if net.bandwidth_kbps else ""))

    def in_force(self) -> dict[str, Any]:
        """Each link as Toxiproxy reports it (stored with every run); on the Patroni lab, the proxy in front of
        each node (the leader's carries every replica's link)."""
        if self.toxiproxy is None:
            return {}
        return {name: {**self.toxiproxy.link(name).__dict__, "proxy_port": port} for name, port in self.ports.items()}

    def stop(self) -> None:
        if self.toxiproxy is not None:
            self.toxiproxy.stop()
