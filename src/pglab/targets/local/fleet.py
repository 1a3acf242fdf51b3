"""Many tenants on one host: one independent local lab per tenant, each instance in its own cgroup.

A tenant is a :class:`LocalLab` (a single server, or a primary and standbys), so everything a lab does — the
fast first load, the server user, the registry that cleans a lab left behind by a crash — holds per tenant.
The fleet adds what density needs: building and loading tenants side by side within the host's cores, the
limits of each tenant's tier, and the per-tenant accounting the tier tables are made of (CPU and IOs from the
tenant's cgroups, memory as the proportional set size of its processes).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pglab import interrupts
from pglab.errors import LabError
from pglab.plan.schema import Arrangement, Plan, Resources, Tier
from pglab.targets.base import Endpoints
from pglab.targets.local import cgroups, procs
from pglab.targets.local.cluster import LocalLab, Log
from pglab.targets.local.postgres_bin import find_bindir


@dataclass
class Tenant:
    name: str  # t01, t02 … in tier order
    tier: Tier
    lab: LocalLab


def tenant_names(arrangement: Arrangement) -> list[tuple[str, Tier]]:
    """Tenants are numbered across the tiers in plan order, so t01 is the first tenant of the first tier."""
    width = max(2, len(str(arrangement.tenant_count)))
    out: list[tuple[str, Tier]] = []
    for tier in arrangement.tiers:
        for _ in range(tier.tenants):
            out.append((f"t{len(out) + 1:0{width}d}", tier))
    return out


def pss_bytes(pid: int) -> int:
    """Proportional set size of a process and its descendants: shared memory (shared_buffers) counted once
    across the processes that map it, so that instances add up to what the host really holds."""
    total = 0
    for p in [pid, *procs.descendants(pid)]:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
    return total


class Fleet:
    """The Topology the runner drives for a ``tenants`` plan: the tenants of the current arrangement.

    An arrangement's tenants are built when the runner first needs them and kept for its repeats; the next
    arrangement (other tiers, other limits) gets a fresh fleet, so nothing of one arrangement's state leaks into
    the next."""

    def __init__(self, plan: Plan, base_dir: Path, log: Log = lambda _m: None):
        assert plan.tenants is not None and plan.target.local is not None
        self.plan = plan
        self.template = plan.target.local
        self.base_dir = base_dir
        self.log = log
        self.bindir = find_bindir(self.template.bindir)
        self.arrangement: Arrangement | None = None
        self.tenants: list[Tenant] = []
        self._built_for: str | None = None
        self._events: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------ building
    def use(self, arrangement: Arrangement) -> None:
        """The arrangement the next :meth:`provision` must stand up."""
        self.arrangement = arrangement

    def _spec(self, name: str, tier: Tier) -> Any:
        """The tenant's lab: the plan's local target with the tenant's instances, its tier's limits (an empty
        limit when the tier has none, so its cgroups still account CPU and IOs) and its own directories."""
        paths = self.template.paths
        sub = {k: str(Path(v) / name) for k, v in paths.model_dump().items() if v}
        return self.template.model_copy(update={
            "instances": self.plan.tenants.instances if self.plan.tenants else 1,
            "resources": tier.resources or Resources(),
            "paths": paths.model_copy(update=sub)})

    def _build(self, parameters: dict[str, Any]) -> None:
        assert self.arrangement is not None and self.plan.tenants is not None
        names = tenant_names(self.arrangement)
        self.tenants = [Tenant(n, tier, LocalLab(self._spec(n, tier), self.base_dir, log=self._tenant_log(n),
                                                 dataset=self.plan.dataset)) for n, tier in names]
        workers = self.plan.tenants.parallel_builds or os.cpu_count() or 1
        self.log(f"arrangement {self.arrangement.name}: building {len(names)} tenant(s) "
                 f"({self.plan.tenants.instances} instance(s) each), {workers} at a time")
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tenant-build")
        futures = [pool.submit(t.lab.provision, self._parameters(t.tier, parameters)) for t in self.tenants]
        try:
            interrupts.wait_all(futures)  # a safe point: a recorded Ctrl-C or SIGTERM ends the wait
            for t, f in zip(self.tenants, futures, strict=True):
                if (exc := f.exception()) is not None:
                    if isinstance(exc, LabError):
                        raise LabError(f"tenant {t.name}: {exc}") from None
                    raise exc
        finally:  # an interrupt while waiting: builds in flight finish, then teardown finds them all
            pool.shutdown(wait=True, cancel_futures=True)
        self._built_for = self.arrangement.name
        self._events.append((time.time(), "tenants-built", f"{self.arrangement.name}: {len(self.tenants)} tenants"))

    def _tenant_log(self, name: str) -> Log:
        def log(message: str) -> None:
            with self._lock:
                self.log(f"{name}: {message}")
        return log

    @staticmethod
    def _parameters(tier: Tier, parameters: dict[str, Any]) -> dict[str, Any]:
        return {**parameters, "synchronous_commit": tier.synchronous_commit}

    # ------------------------------------------------------------ Target protocol (what the runner calls)
    def preflight(self) -> None:
        """Binaries and the server user are checked when each tenant's lab is made."""

    def provision(self, parameters: dict[str, Any]) -> Endpoints:
        """The current arrangement's tenants, up and with ``parameters`` (each tier's synchronous_commit on top).
        Returns the first tenant's endpoints (what the sweep's environment record describes)."""
        assert self.arrangement is not None, "use() an arrangement first"
        if self._built_for != self.arrangement.name:
            self.teardown()
            self._build(parameters)
        else:
            for t in self.tenants:
                t.lab.provision(self._parameters(t.tier, parameters))
                self._events += t.lab.take_events()
        return self.tenants[0].lab.endpoints()

    def primary_name(self) -> str:
        return self.tenants[0].lab.primary_name()

    def server_pids(self) -> list[int]:
        return [p for t in self.tenants for p in t.lab.server_pids()]

    def probe_paths(self) -> dict[str, Path]:
        """The first tenant's directories: every tenant's are beside them, on the same devices."""
        return self.tenants[0].lab.probe_paths() if self.tenants else {}

    def storage_paths(self) -> dict[str, tuple[Path, str]]:
        return self.tenants[0].lab.storage_paths()

    def health(self) -> str | None:
        down = [f"{t.name}: {problem}" for t in self.tenants if (problem := t.lab.health())]
        return "; ".join(down) or None

    def describe(self) -> dict[str, Any]:
        return {"kind": "tenants", "arrangement": self._built_for, "bindir": str(self.bindir),
                "tenants": [{"name": t.name, "tier": t.tier.name, **t.lab.describe()} for t in self.tenants]}

    def server_logs(self) -> dict[str, Path]:
        return {f"{t.name}-{node}": path for t in self.tenants for node, path in t.lab.server_logs().items()}

    def take_events(self) -> list[tuple[float, str, str]]:
        out, self._events = self._events, []
        return out

    def limits_in_force(self) -> dict[str, Any]:
        """Per tenant, what the kernel reports for each of its instances' groups."""
        return {t.name: {"tier": t.tier.name, **t.lab.limits_in_force()} for t in self.tenants}

    def reset_dataset(self) -> dict[str, Any]:
        return {t.name: t.lab.reset_dataset() for t in self.tenants}

    def teardown(self, keep: bool = False) -> None:
        for t in self.tenants:
            try:
                t.lab.teardown(keep=keep)
            except Exception as exc:  # teardown goes on with the other tenants
                self.log(f"{t.name}: teardown: {exc}")
        self.tenants, self._built_for = [], None

    # ------------------------------------------------------------ per-tenant accounting
    def usage(self) -> dict[str, dict[str, float]]:
        """Per tenant: CPU seconds and IOs/bytes its instances' groups have used so far (for deltas)."""
        out: dict[str, dict[str, float]] = {}
        for t in self.tenants:
            total: dict[str, float] = {}
            for group in t.lab.limits.groups.values():
                stats: dict[str, float] = {}
                with contextlib.suppress(cgroups.CgroupError, ValueError):
                    stats["cpu_s"] = group.cpu_stat()["usage_s"]
                with contextlib.suppress(cgroups.CgroupError, ValueError):
                    stats.update(group.io_stat())
                for k, v in stats.items():
                    total[k] = total.get(k, 0.0) + v
            out[t.name] = total
        return out

    def memory(self) -> dict[str, float]:
        """Per tenant: bytes (PSS) its server processes hold now."""
        return {t.name: float(sum(pss_bytes(p) for p in t.lab.server_pids())) for t in self.tenants}

