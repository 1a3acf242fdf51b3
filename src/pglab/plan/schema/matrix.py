"""matrix: the axes swept; every combination is one point."""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from pglab.plan.schema.base import Clients, Cpus, ParamValue, Rate, Strict, SyncCommit, _unique
from pglab.plan.schema.capacity import Cost
from pglab.plan.schema.kubernetes import DnsLabel, K8sStorage
from pglab.plan.schema.run import Workload, _check_param_name
from pglab.plan.schema.scenario import Scenario

MAX_POINTS = 10_000


# ------------------------------------------------------------------ the storage axis (Kubernetes: a Cluster per value)
class StorageOption(Strict):
    """One value of the storage axis: a named storage profile, i.e. the classes and sizes of the data and WAL
    volumes of a whole Cluster (pglab builds a new Cluster for it), and optionally what that configuration costs."""

    name: DnsLabel = Field(description="the value's name in tables and in the names of its volumes (a DNS label, "
                           "e.g. premium-ssd)")
    storage: K8sStorage | None = Field(None, description="data volumes {class, size} (default: "
                                       "target.kubernetes.storage)")
    wal_storage: K8sStorage | None = Field(None, description="WAL volumes {class, size} (default: "
                                           "target.kubernetes.wal_storage)")
    cost: Cost | None = Field(None, description="monthly price of the whole configuration on this storage, for "
                              "cost per TPS per value (default: the plan's cost)")


class Matrix(Strict):
    """Axes; every combination is one point."""

    workload: list[Workload] = Field(default_factory=lambda: list[Workload](["tpcb-like"]), min_length=1,
                                     description="built-in names (tpcb-like, select-only, simple-update) or custom "
                                     "{name, scripts}")
    clients: list[Clients] = Field(default_factory=lambda: [1], min_length=1,
                                   description="pgbench clients (-c), 1 to 10,000 each")
    jobs: list[Clients] | None = Field(None, min_length=1, description="default: min(clients, cores)")
    synchronous_commit: list[SyncCommit] = Field(default_factory=lambda: list[SyncCommit](["on"]), min_length=1,
                                                 description="durability levels: off, local, remote_write, on, "
                                                 "remote_apply (quote on and off)")
    parameters: dict[str, list[ParamValue]] = Field(default_factory=dict, description="any PostgreSQL parameter "
                                                    "as an axis: name → list of values")
    cpus: list[Cpus] | None = Field(None, min_length=1, description="CPU limit per instance as an axis: the "
                                    "scaling loop (a rolling restart between steps)")
    rate: list[Rate] | None = Field(None, min_length=1, max_length=100, description="target transactions/s as an "
                                    "axis (pgbench -R, open loop): latency is measured from each transaction's "
                                    "scheduled start, schedule lag and skipped transactions are figures of the run")
    scenario: list[Scenario] | None = Field(None, min_length=1, max_length=20,
                                            description="faults and operations during the runs, as an axis")
    storage: list[StorageOption] | None = Field(
        None, min_length=1, max_length=20, description="Kubernetes: storage profiles (classes and sizes of the data "
        "and WAL volumes) as an axis; pglab builds one Cluster per value, one after the other")

    @field_validator("storage")
    @classmethod
    def _storage_names(cls, v: list[StorageOption] | None) -> list[StorageOption] | None:
        return _unique(v, lambda s: s.name, "storage values need distinct names")

    @field_validator("scenario")
    @classmethod
    def _scenarios(cls, v: list[Scenario] | None) -> list[Scenario] | None:
        return _unique(v, lambda s: s.label, "scenarios must differ (kind, kill or max_rate)")

    @field_validator("cpus", "rate", "clients", "jobs", "synchronous_commit")
    @classmethod
    def _distinct(cls, v: list[Any] | None) -> list[Any] | None:
        return _unique(v)

    @field_validator("parameters")
    @classmethod
    def _params(cls, v: dict[str, list[ParamValue]]) -> dict[str, list[ParamValue]]:
        for name, values in v.items():
            _check_param_name(name)
            if not values:
                raise PydanticCustomError("param", "axis 'parameters.{name}' needs at least one value",
                                          {"name": name, "at": name})
            if len({(type(x), x) for x in values}) != len(values):
                raise PydanticCustomError("param", "values must be unique", {"at": name})
        return v

    @field_validator("workload")
    @classmethod
    def _workloads(cls, v: list[Any]) -> list[Any]:
        return _unique(v, lambda w: w if isinstance(w, str) else w.name, "workload names must be unique")

    @model_validator(mode="after")
    def _size(self) -> Matrix:
        axes = {"workload": len(self.workload), "synchronous_commit": len(self.synchronous_commit),
                "clients": len(self.clients), "jobs": len(self.jobs or [1])}
        axes.update({f"parameters.{name}": len(values) for name, values in self.parameters.items()})
        axes["cpus"] = len(self.cpus or [1])
        axes["scenario"] = len(self.scenario or [1])
        axes["storage"] = len(self.storage or [1])
        if math.prod(axes.values()) > MAX_POINTS:
            sizes = " × ".join(f"{n} {axis}" for axis, n in axes.items() if n > 1)
            raise PydanticCustomError("matrix", "{sizes} make {points} points, more than {max}; shorten an axis",
                                      {"sizes": sizes, "points": math.prod(axes.values()), "max": MAX_POINTS})
        return self

    @property
    def points(self) -> int:
        """How many points the axes make (at most; see expand)."""
        return math.prod([len(self.workload), len(self.synchronous_commit), len(self.clients), len(self.jobs or [1]),
                          len(self.cpus or [1]), len(self.scenario or [1]), len(self.storage or [1]),
                          *(len(values) for values in self.parameters.values())])
