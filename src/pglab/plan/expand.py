"""Matrix → points. A point is one combination of axis values; it runs ``run.repeats`` times."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from dataclasses import dataclass, field
from typing import Any

from pglab.plan.schema import Arrangement, Plan, Scenario, StorageOption, Workload


@dataclass(frozen=True)
class Point:
    index: int
    workload: Workload
    clients: int
    jobs: int
    synchronous_commit: str
    parameters: dict[str, Any] = field(default_factory=dict)
    cpus: float | None = None  # the CPU-limit axis (matrix.cpus); None: the target's own resources
    scenario: Scenario | None = None  # a fault or operation during each run (matrix.scenario)
    arrangement: Arrangement | None = None  # tenants plans: the tiers of this point (workload etc. are the tiers')
    storage: StorageOption | None = None  # the storage axis (matrix.storage, Kubernetes): a Cluster per value
    rate: float | None = None  # the rate axis (matrix.rate): pgbench -R, transactions/s; None: run.rate or none

    @property
    def workload_name(self) -> str:
        return self.workload if isinstance(self.workload, str) else self.workload.name

    @property
    def axes(self) -> dict[str, Any]:
        """The axis values, as they appear as columns in tables (parameters as ``parameters.<name>``)."""
        if self.arrangement is not None:
            return {"arrangement": self.arrangement.name}
        out: dict[str, Any] = {
            "workload": self.workload_name,
            "synchronous_commit": self.synchronous_commit,
            "clients": self.clients,
            "jobs": self.jobs,
        }
        if self.storage is not None:
            out["storage"] = self.storage.name
        if self.cpus is not None:
            out["cpus"] = self.cpus
        if self.rate is not None:
            out["rate"] = self.rate
        if self.scenario is not None:
            out["scenario"] = self.scenario.label
        for name, value in self.parameters.items():
            out[f"parameters.{name}"] = value
        return out

    @property
    def reads_only(self) -> bool:
        """Whether this point's runs change no row: pgbench's built-in select-only is all they run (a script file
        may write), and no fault or operation runs beside them (one may)."""
        scripts = ([self.workload] if isinstance(self.workload, str)
                   else [s.builtin for s in self.workload.scripts])
        return (self.arrangement is None and self.scenario is None
                and all(name == "select-only" for name in scripts))

    @property
    def key(self) -> str:
        """Stable identity of the point across reruns of the same plan (used to resume)."""
        blob = json.dumps(self.axes, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def label(self) -> str:
        if self.arrangement is not None:
            return f"arrangement={self.arrangement.name} ({self.arrangement.tenant_count} tenants)"
        extra = "".join(f" {k.split('.', 1)[1]}={v}" for k, v in self.axes.items() if k.startswith("parameters."))
        cpus = f" cpus={self.cpus:g}" if self.cpus is not None else ""
        if self.storage is not None:
            cpus = f" storage={self.storage.name}{cpus}"
        scenario = f" scenario={self.scenario.label}" if self.scenario is not None else ""
        rate = f" rate={self.rate:g}" if self.rate is not None else ""
        return (f"{self.workload_name} sc={self.synchronous_commit} c={self.clients} j={self.jobs}{rate}{cpus}"
                f"{extra}{scenario}")


def default_jobs(clients: int, cores: int | None = None) -> int:
    """pgbench threads: one per core at most, never more than clients."""
    return max(1, min(clients, cores or os.cpu_count() or 1))


def expand(plan: Plan, cores: int | None = None) -> list[Point]:
    """Every combination of the axes. Storage values vary slowest (each is a new Cluster), then CPU steps (each is
    a rolling restart), then parameters (they may need one), then scenarios, clients, jobs, rates fastest."""
    if plan.tenants is not None:  # one point per arrangement; each tier carries its own load
        return [Point(i, a.tiers[0].workload, sum(t.clients * t.tenants for t in a.tiers), 1,
                      a.tiers[0].synchronous_commit, arrangement=a) for i, a in enumerate(plan.tenants.arrangements)]
    m = plan.matrix
    names = list(m.parameters)
    param_combos = list(itertools.product(*(m.parameters[n] for n in names))) or [()]
    points: list[Point] = []
    cpu_steps: list[float | None] = [*m.cpus] if m.cpus else [None]
    scenarios: list[Scenario | None] = [*m.scenario] if m.scenario else [None]
    storages: list[StorageOption | None] = [*m.storage] if m.storage else [None]
    rates: list[float | None] = [*m.rate] if m.rate else [None]
    for storage, cpus in itertools.product(storages, cpu_steps):
        for combo in param_combos:
            params = dict(zip(names, combo, strict=True))
            for scenario, wl, sc, clients in itertools.product(scenarios, m.workload,
                                                               m.synchronous_commit, m.clients):
                # pgbench cannot run more threads than clients: jobs [4, 8] at 2 clients are one point, not two
                jobs_axis = dict.fromkeys(min(j, clients) for j in m.jobs or [default_jobs(clients, cores)])
                for jobs, rate in itertools.product(jobs_axis, rates):
                    points.append(Point(len(points), wl, clients, jobs, sc, params, cpus, scenario,
                                        storage=storage, rate=rate))
    return points
